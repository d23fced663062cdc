"""Measure what agents read again after a recorded compaction, and fit the re-fetch model.

Regenerates ``policies/calibration/refetch.json`` and ``refetch.md`` from the real Claude
Code and Codex traces in ``../shared/traces`` (``python -m simulator.app.measure.refetch_measure``;
``--check`` compares instead of writing). simulator/refetch.py's REFETCH_PROBABILITY,
SKIP_PROBABILITY and WINDOW_REQUESTS are copied from the ``fit`` section;
tests/simulator/test_refetch.py fails when they drift.

Method (counts only: kinds, flags, keyed path hashes, request indexes; no text, no paths).
A *point* is a request index c of a session. For a recorded compaction (a CompactionEvent
at c) the files of the point are those whose latest successful read result before c was
dropped by it (`compacted_at == c`); for a control point, those whose latest read before c
is still sent through c + W. Per point, over the W requests from c on:

* re-read (`s`): the file is read again (a read call in a response of c .. c + W - 1);
* used (`r`): of the files the agent then uses without reading (an edit, a write, a patch),
  the share read again between c and that first use.

Control points are matched to each compaction: points of sessions of the same format with
no compaction within W requests either side, whose recorded context before the point is
within 25% of the compaction's, the M closest (ties by session and index). Rates pool the
files over points. The fits: `refetch = (r_c - r_0) / (1 - r_0)` (the recorded habit re-reads
stay in a replay, so only the other uses draw) and `skip = (s_c - s_0) / s_c` (the share of
compaction-time re-reads the compaction caused), clipped to [0, 1]; leave-one-source-out:
each folder's own rates against the fit on every other folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.model import Flag, Kind, Session, Trace
from traces.load import load_all, units

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
DATA_FILE = ROOT / "policies" / "calibration" / "refetch.json"
TABLE_FILE = ROOT / "policies" / "calibration" / "refetch.md"
FORMATS = ("claude-code", "codex")
#: Windows (requests after a point in which re-reads and uses are looked for) tried.
WINDOWS = (10, 20, 50, 100)
#: Control points per compaction, and how far their recorded context may be from its.
MATCHES = 10
CONTEXT_TOLERANCE = 0.25
DECIMALS = 4
_SYNTHETIC_SOURCES = {"agent-history"}


def source_name(label: str) -> str:
    """The corpus folder a trace came from ("vsla", "agentv"), never a machine path."""
    parts = Path(label).parts
    if "fixtures" in parts:
        return "agent-history"
    for top in FORMATS:
        if top in parts:
            i = parts.index(top)
            if i + 1 < len(parts):
                return parts[i + 1]
    return "unknown"


@dataclass
class Counts:
    """Files of a set of points: how many, re-read within the window, their tokens; used
    without reading, and of those read again first."""

    points: int = 0
    files: int = 0
    reread: int = 0
    reread_tokens: int = 0
    used: int = 0
    used_reread: int = 0

    def add(self, other: Counts) -> None:
        self.points += other.points
        self.files += other.files
        self.reread += other.reread
        self.reread_tokens += other.reread_tokens
        self.used += other.used
        self.used_reread += other.used_reread


@dataclass
class SessionFiles:
    """A session's file reads and uses, as the points need them."""

    session: Session
    #: Per file: (first request sending it, compacted_at, hidden_from, block) of its reads.
    reads: dict[int, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    #: Per file: (request whose response made it, block, result tokens) of its read calls.
    read_calls: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    #: Per file: (request whose response made it, block) of its other calls naming it.
    uses: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    context: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)


def session_files(session: Session) -> SessionFiles:
    b = session.blocks
    flags = b["flags"].astype(np.int64)
    artifact = (flags & Flag.ARTIFACT) != 0
    path = b["path_hash"]
    kind = b["kind"]
    origin = b["origin"]
    read = (flags & Flag.PATH_READ) != 0
    result = (kind == Kind.TOOL_RESULT) & read & ((flags & Flag.ERROR) == 0) & ~artifact
    call = (kind == Kind.TOOL_USE) & (origin >= 0) & ~artifact
    out = SessionFiles(session)
    first, compacted, hidden = b["first_request"], b["compacted_at"], b["hidden_from"]
    tokens, link = b["tokens"], b["link"]
    for i in np.flatnonzero(result & (path != 0)).tolist():
        out.reads.setdefault(int(path[i]), []).append(
            (int(first[i]), int(compacted[i]), int(hidden[i]), i)
        )
    for i in np.flatnonzero(call & (path != 0)).tolist():
        p = int(path[i])
        if read[i]:
            res = int(link[i])
            size = int(tokens[res]) if res >= 0 and result[res] else 0
            out.read_calls.setdefault(p, []).append((int(origin[i]), i, size))
        else:
            out.uses.setdefault(p, []).append((int(origin[i]), i))
    out.context = session.recorded_context().tolist()
    out.events = sorted({e.request for e in session.events})
    return out


def point_counts(sf: SessionFiles, c: int, *, compaction: bool, window: int) -> Counts:
    """The counts of one point (module docstring)."""
    out = Counts(points=1)
    end = c + window
    for p, reads in sf.reads.items():
        before = [r for r in reads if r[0] < c and r[2] > c]
        if not before:
            continue
        _, dropped, _, _ = before[-1]
        if compaction and dropped != c:
            continue
        if not compaction and dropped <= end:
            continue
        out.files += 1
        calls = [x for x in sf.read_calls.get(p, ()) if c <= x[0] < end]
        if calls:
            out.reread += 1
            out.reread_tokens += calls[0][2]
        uses = [u for u in sf.uses.get(p, ()) if c <= u[0] < end]
        if uses:
            t, block = uses[0]
            out.used += 1
            out.used_reread += any(x[0] < t or (x[0] == t and x[1] < block) for x in calls)
    return out


def _quiet(sf: SessionFiles, c: int, window: int) -> bool:
    """No recorded compaction within `window` requests either side of c."""
    return all(abs(e - c) >= window for e in sf.events)


def _rate(n: int, d: int) -> float | None:
    return round(n / d, DECIMALS) if d else None


def fit(comp: Counts, ctrl: Counts) -> dict[str, Any]:
    """The two probabilities from the pooled counts (None where a rate has no files)."""
    r_c, r_0 = _rate(comp.used_reread, comp.used), _rate(ctrl.used_reread, ctrl.used)
    s_c, s_0 = _rate(comp.reread, comp.files), _rate(ctrl.reread, ctrl.files)
    refetch = None
    if r_c is not None and r_0 is not None and r_0 < 1:
        refetch = round(min(1.0, max(0.0, (r_c - r_0) / (1 - r_0))), DECIMALS)
    skip = None
    if s_c and s_0 is not None:
        skip = round(min(1.0, max(0.0, (s_c - s_0) / s_c)), DECIMALS)
    return {"refetch": refetch, "skip": skip}


def _row(comp: Counts, ctrl: Counts) -> dict[str, Any]:
    return {
        "compactions": comp.points,
        "files": comp.files,
        "reread": comp.reread,
        "reread_share": _rate(comp.reread, comp.files),
        "reread_tokens": comp.reread_tokens,
        "used": comp.used,
        "used_reread": comp.used_reread,
        "used_reread_share": _rate(comp.used_reread, comp.used),
        "control_points": ctrl.points,
        "control_files": ctrl.files,
        "control_reread_share": _rate(ctrl.reread, ctrl.files),
        "control_used": ctrl.used,
        "control_used_reread_share": _rate(ctrl.used_reread, ctrl.used),
        **fit(comp, ctrl),
    }


def load(traces: Path) -> dict[str, list[tuple[str, SessionFiles]]]:
    """The sessions of the real Claude Code and Codex traces under `traces`, by format,
    with their folder, in a stable order (the synthetic fixtures left out)."""
    found = [u for u in units([traces]) if u.format in FORMATS]
    return by_format((source_name(x.label), x.trace) for x in load_all(found, lenient=True))


def by_format(traces: Iterable[tuple[str, Trace]]) -> dict[str, list[tuple[str, SessionFiles]]]:
    """(folder, trace) pairs as the measurement takes them: sessions with requests, by
    format, in (folder, session id) order; synthetic fixtures and other formats left out."""
    out: dict[str, list[tuple[str, SessionFiles]]] = {f: [] for f in FORMATS}
    for source, trace in traces:
        if source in _SYNTHETIC_SOURCES or trace.format not in out:
            continue
        for session in trace.sessions:
            if session.n_requests:
                out[trace.format].append((source, session_files(session)))
    for sessions in out.values():
        sessions.sort(key=lambda item: (item[0], item[1].session.id))
    return out


def folder_counts(
    sessions: list[tuple[str, SessionFiles]], window: int
) -> dict[str, tuple[Counts, Counts]]:
    """Per folder of one format: the counts of its compactions and of their matched
    control points (module docstring)."""
    candidates = [
        (sf, c)
        for _, sf in sessions
        for c in range(1, sf.session.n_requests)
        if _quiet(sf, c, window)
    ]
    out: dict[str, tuple[Counts, Counts]] = {}
    for src, sf in sessions:
        for c in sf.events:
            if not 0 < c < sf.session.n_requests:
                continue
            comp = point_counts(sf, c, compaction=True, window=window)
            if not comp.files:
                continue
            size = sf.context[c - 1]
            near = [
                (abs(o.context[d - 1] - size), o.session.id, d, o)
                for o, d in candidates
                if abs(o.context[d - 1] - size) <= CONTEXT_TOLERANCE * size
            ]
            near.sort(key=lambda x: (x[0], x[1], x[2]))
            ctrl = Counts(points=0)
            for _, _, d, o in near[:MATCHES]:
                ctrl.add(point_counts(o, d, compaction=False, window=window))
            mine = out.setdefault(src, (Counts(points=0), Counts(points=0)))
            mine[0].add(comp)
            mine[1].add(ctrl)
    return out


def _pool(parts: list[tuple[Counts, Counts]]) -> tuple[Counts, Counts]:
    comp, ctrl = Counts(points=0), Counts(points=0)
    for a, b in parts:
        comp.add(a)
        ctrl.add(b)
    return comp, ctrl


def _excess(comp: Counts, ctrl: Counts) -> float:
    """Re-reads within the window beyond the control's share, per compaction-dropped file."""
    if not comp.files:
        return 0.0
    return comp.reread / comp.files - (ctrl.reread / ctrl.files if ctrl.files else 0.0)


def measure(traces: Path | dict[str, list[tuple[str, SessionFiles]]]) -> dict[str, Any]:
    """Every recorded compaction of the Claude Code and Codex traces under `traces` (a
    directory, or sessions as `by_format` gives them), with its matched control points, per
    folder and pooled per format, and the fits.

    The window is fitted too: per format, the smallest of WINDOWS whose excess re-read
    share (pooled) reaches 90% of the largest window's (where the compaction's re-reads
    have happened); the rates and fits are then those at that window."""
    sessions_by = load(traces) if isinstance(traces, Path) else traces
    formats: dict[str, Any] = {}
    for fmt in FORMATS:
        sessions = sessions_by[fmt]
        by_window = {w: folder_counts(sessions, w) for w in WINDOWS}
        pooled = {w: _pool(list(by_window[w].values())) for w in WINDOWS}
        top = _excess(*pooled[WINDOWS[-1]])
        window = next(
            (w for w in WINDOWS if top <= 0 or _excess(*pooled[w]) >= 0.9 * top), WINDOWS[-1]
        )
        counts = by_window[window]
        folders = []
        for src in sorted(counts):
            held_out = fit(*_pool([v for k, v in sorted(counts.items()) if k != src]))
            folders.append(
                {
                    "source": src,
                    **_row(*counts[src]),
                    "refetch_without": held_out["refetch"],
                    "skip_without": held_out["skip"],
                }
            )
        formats[fmt] = {
            "excess_reread_by_window": {
                str(w): round(_excess(*pooled[w]), DECIMALS) for w in WINDOWS
            },
            "window": window,
            "folders": folders,
            "pooled": _row(*pooled[window]),
            "fit": {**fit(*pooled[window]), "window": window},
        }
    return {
        "schema": 1,
        "what": "re-reads after recorded compactions in ../shared/traces vs matched points "
        "without one (counts only)",
        "windows": list(WINDOWS),
        "matches": MATCHES,
        "context_tolerance": CONTEXT_TOLERANCE,
        "formats": formats,
    }


def render(data: dict[str, Any]) -> str:
    """The committed JSON: stable key order, one field per line, trailing newline."""
    return json.dumps(data, indent=2) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _fit(value: float | None) -> str:
    """A fitted probability as simulator/refetch.py holds it (None: no sample, read as 0)."""
    return "- (0)" if value is None else f"{value:.4f}"


def table(data: dict[str, Any]) -> str:
    """refetch.md: the method in a paragraph, then per format the table per folder and
    pooled, and the excess re-read share per window."""
    head = (
        "| folder | compactions | dropped files | re-read | share | re-read tokens | used | "
        "read first | share | control points | control re-read share | control read-first "
        "share | refetch | skip | refetch (fit without) | skip (fit without) |"
    )
    lines = [
        "# Re-fetch calibration",
        "",
        "Generated by `python -m simulator.app.measure.refetch_measure` with `refetch.json`",
        "(do not edit). Method: simulator/app/measure/refetch_measure.py. After every recorded",
        "compaction (Claude Code and",
        "Codex, ../shared/traces), the files whose latest read it dropped; over the next W",
        "requests, the share read again (s), and of those then used without a read (edit,",
        "write, patch) the share read first (r); against the same shares at the "
        f"{data['matches']} closest points",
        f"(recorded context within {data['context_tolerance']:.0%}) of the same format with "
        "no compaction within W either side.",
        "`refetch = (r_c - r_0) / (1 - r_0)`, `skip = (s_c - s_0) / s_c`, clipped to [0, 1];",
        "the last two columns fit every other folder of the format (leave-one-source-out).",
        "A compaction counts where it dropped the latest read of at least one file.",
        "W per format: the smallest window whose excess re-read share reaches 90% of the",
        "largest one's.",
    ]

    def line(src: str, r: dict[str, Any], without: tuple[Any, Any]) -> str:
        cells = [
            src,
            r["compactions"],
            r["files"],
            r["reread"],
            r["reread_share"],
            r["reread_tokens"],
            r["used"],
            r["used_reread"],
            r["used_reread_share"],
            r["control_points"],
            r["control_reread_share"],
            r["control_used_reread_share"],
            r["refetch"],
            r["skip"],
            *without,
        ]
        return "| " + " | ".join(_cell(c) for c in cells) + " |"

    for fmt, f in data["formats"].items():
        windows = ", ".join(f"W={w}: {v:.3f}" for w, v in f["excess_reread_by_window"].items())
        lines += [
            "",
            f"## {fmt} (W = {f['window']} requests)",
            "",
            head,
            "| --- | " + " | ".join(["---:"] * 15) + " |",
        ]
        for r in f["folders"]:
            lines.append(line(r["source"], r, (r["refetch_without"], r["skip_without"])))
        lines.append(line("pooled", f["pooled"], (None, None)))
        fit_ = f["fit"]
        lines += [
            "",
            f"Excess re-read share by window: {windows}.",
            f"Fit: refetch = {_fit(fit_['refetch'])}, skip = {_fit(fit_['skip'])}, window = "
            f"{fit_['window']} requests.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.app.measure.refetch_measure")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="shared traces")
    parser.add_argument("--out", type=Path, default=DATA_FILE, help="data file to write")
    parser.add_argument("--table", type=Path, default=TABLE_FILE, help="table to write")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files differ instead of writing"
    )
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no traces at {args.traces}", file=sys.stderr)
        return 2
    data = measure(args.traces)
    text, md = render(data), table(data)
    if args.check:
        same = all(
            path.is_file() and path.read_text() == want
            for path, want in ((args.out, text), (args.table, md))
        )
        print("up to date" if same else f"{args.out.name} differs from the measurement")
        return 0 if same else 1
    args.out.write_text(text)
    args.table.write_text(md)
    print(f"wrote {args.out.name} and {args.table.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
