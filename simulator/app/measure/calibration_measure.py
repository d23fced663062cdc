"""Measure the recorded Claude Code compactions and fit the summary-size calibration.

Regenerates ``policies/calibration/compactions.json`` from the real traces in
``../shared/traces`` (run ``python -m simulator.app.measure.calibration_measure``;
``--check`` compares instead of writing). The numbers in ``policies/calibration/summary.py`` are
copied from its
``fit`` section; tests/policies/test_calibration.py fails when either drifts from what this script
measures. The method is written up in ``policies/calibration/README.md``.

Only the compiled traces' counts are used (token counts, kinds, flags, hashes, recorded
usage): no message text is read, and the data file holds no text and no paths. The script
lives in `reports` because `policies` may not import the readers (tests/test_architecture.py).

Why the summary is sized from its raw cl100k count and not from its anchored count: the
anchoring (traces/builder.py) gives the blocks that enter at a request the whole recorded
growth, so the summary block, which enters together with unlogged restored files and
reminders, absorbs all of them (its anchored count is the whole post-compaction context
minus the prefix). The raw count times the Claude/cl100k ratio measured on the same
sessions separates the summary from what was restored with it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.calibration.summary import file_restore_tokens, recent_file_sizes
from policies.claude_code.policy import preset_for
from simulator import policy
from simulator.model import CompactionEvent, Flag, Kind, Session, version_tuple
from simulator.prefix import infer
from traces.load import load_all, units

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
DATA_FILE = ROOT / "policies" / "calibration" / "compactions.json"

#: Requests whose logged new blocks are at least this big (cl100k tokens) measure the
#: tokenizer ratio: per-message framing and small unlogged reminders are then < 1% of it.
RATIO_MIN_RAW = 1_000
#: Decimals kept for ratios and fitted parameters (the committed data must be exactly
#: reproducible, so platform-level float noise is rounded away).
DECIMALS = 4
#: Kinds whose anchored size is not proportional to their logged text, so a request
#: where one enters cannot measure the tokenizer ratio.
_RATIO_EXCLUDED = (Kind.THINKING, Kind.IMAGE, Kind.INJECTED, Kind.SUMMARY)
#: Shared-trace folders whose traces are synthetic format references (never fitted).
_SYNTHETIC_SOURCES = {"agent-history"}


def _source_name(label: str) -> str:
    """The corpus folder a trace came from ("vsla"), never a machine path."""
    parts = Path(label).parts
    for top in ("claude-code", "fixtures"):
        if top in parts:
            i = parts.index(top)
            if i + 1 < len(parts):
                return parts[i + 1]
    return "unknown"


def _live(session: Session) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Blocks that were ever in what the recording sent (so the anchoring sized them)."""
    b = session.blocks
    live: np.ndarray[Any, np.dtype[np.bool_]] = b["first_request"] < np.minimum(
        b["hidden_from"], b["compacted_at"]
    )
    return live


def ratio_samples(session: Session) -> list[float]:
    """Recorded context growth per cl100k token of the logged blocks that caused it.

    One sample per request k where both k and k-1 have recorded usage, nothing left the
    recorded view at k, no compaction happened at k, every entering block is text, a tool
    call or a tool result (thinking, images and summaries are sized otherwise), and the
    entering blocks hold at least RATIO_MIN_RAW cl100k tokens.
    """
    b = session.blocks
    r = session.requests
    ctx = session.recorded_context()
    live = _live(session)
    first = b["first_request"]
    end = np.minimum(b["hidden_from"], b["compacted_at"])
    compacted = {e.request for e in session.events}
    out: list[float] = []
    for k in range(1, session.n_requests):
        if k in compacted or not (r["has_usage"][k] and r["has_usage"][k - 1]):
            continue
        if np.any(live & (end == k)):
            continue
        entering = live & (first == k)
        if not entering.any() or np.isin(b["kind"][entering], _RATIO_EXCLUDED).any():
            continue
        raw = int(b["tokens_raw"][entering].sum())
        if raw < RATIO_MIN_RAW:
            continue
        out.append((int(ctx[k]) - int(ctx[k - 1])) / raw)
    return out


def file_rule_tokens(session: Session, event: CompactionEvent) -> tuple[int, int]:
    """What restoring the recently used files would add under the 2.1.88 rule.

    Files are the paths (hashed) that Read, Write, Edit, ... touched in the logical history
    before the summary, most recently touched first; a file's size is its newest whole-size
    observation (`file_tokens`: a Read result scaled to the file's line count, a Write's
    content, the file after an Edit), else what its newest Read result showed. The same
    rule the policy applies (`recent_file_sizes`). Returns the number of recent files
    considered (at most RESTORE_MAX_FILES) and the tokens the rule restores.
    """
    b = session.blocks
    before = np.nonzero(session.view_mask(event.request)[: event.summary_block])[0]
    reads = (b["flags"] & Flag.PATH_READ) != 0
    results = b["kind"] == Kind.TOOL_RESULT
    tokens = b["tokens"]

    def shown(i: int) -> int:
        return int(tokens[i]) if reads[i] and results[i] else -1

    sizes = recent_file_sizes(
        reversed(before.tolist()), b["path_hash"].tolist(), b["file_tokens"].tolist(), shown
    )
    return len(sizes), file_restore_tokens(sizes)


def measure_event(
    source: str, session: Session, event: CompactionEvent, ratio: float
) -> dict[str, Any]:
    """One data row: counts only (see README.md for each column)."""
    k = event.request
    b = session.blocks
    r = session.requests
    ctx = session.recorded_context()
    live = _live(session)
    entering = np.nonzero(live & (b["first_request"] == k))[0]
    others = [int(i) for i in entering if int(i) != event.summary_block]
    injected = [i for i in others if b["kind"][i] == Kind.INJECTED]
    logged = [i for i in others if b["kind"][i] != Kind.INJECTED]
    raw = int(b["tokens_raw"][event.summary_block])
    other_raw = int(b["tokens_raw"][logged].sum()) if logged else 0
    pre_from = "compact_boundary" if event.pre_tokens >= 0 else "last_request"
    pre = event.pre_tokens if event.pre_tokens >= 0 else int(ctx[k - 1])
    summary = round(raw * ratio)
    after = int(ctx[k])
    restored = after - session.prefix_tokens - summary - round(other_raw * ratio)
    files, rule = file_rule_tokens(session, event)
    prefix = infer(session)
    first_message = prefix.total - prefix.system
    reattached = first_message if _reattaches(session.client) else 0
    return {
        "source": source,
        "session": session.id[:8],
        "client": session.client.removeprefix("claude-code").strip(),
        "model": session.models[int(r["model"][k - 1])],
        "trigger": event.trigger,
        "pre_tokens": pre,
        "pre_tokens_from": pre_from,
        "context_before": int(ctx[k - 1]),
        "context_after": after,
        "cache_read_after": int(r["cache_read"][k]),
        "prefix_tokens": session.prefix_tokens,
        "summary_chars": int(b["chars"][event.summary_block]),
        "summary_tokens_raw": raw,
        "summary_tokens_anchored": int(b["tokens"][event.summary_block]),
        "other_new_tokens_raw": other_raw,
        "injected_at_compaction": int(b["tokens"][injected].sum()) if injected else 0,
        "summary_tokens": summary,
        "restored_tokens": restored,
        "recent_files": files,
        "file_rule_tokens": rule,
        "first_message_tokens": first_message,
        "reattached_tokens": reattached,
        "beyond_model_tokens": restored - rule - reattached,
        "summary_share": round(summary / pre, DECIMALS),
        "after_share": round(after / pre, DECIMALS),
    }


def _reattaches(client: str) -> bool:
    """Whether the preset of the client's version attaches the first-message context
    (memory files, environment) again after compaction: the 2.x presets do
    (anthropics/claude-code#22654, and the 2.1.29 rows: 13.5k restored with no file to
    restore); @1.0 does not (in 1.0.53 the file rule alone leaves about 150 tokens
    unexplained in four of six compactions). Asking the preset keeps the measured rest
    consistent with what the policy adds."""
    return bool(policy.build(preset_for(client)).params["autocompact.reattach_first_message"])


#: The fit keeps the clients it was made on; 2.1.200 and newer keep recent messages verbatim
#: (compactMetadata.preservedSegment), so their context after is not summary + restored files.
RECENT_CLIENT = (2, 1, 200)
RECENT_REASON = "client 2.1.200 or newer: held out, measured against the policy, not fitted"


def _recent(client: str) -> bool:
    """Whether a recording's client is 2.1.200 or newer (an unreadable version is not)."""
    return version_tuple(client) >= RECENT_CLIENT


def _exclusion(session: Session, event: CompactionEvent) -> str | None:
    """Why an event cannot be measured, or None."""
    k = event.request
    r = session.requests
    if event.summary_block < 0:
        return "no summary message logged"
    if k < 1 or k >= session.n_requests:
        return "no request on both sides of the compaction"
    if not (r["has_usage"][k] and r["has_usage"][k - 1]):
        return "no recorded usage around the compaction"
    return None


def _round(x: float) -> float:
    return round(x, DECIMALS)


def lognormal_fit(values: Sequence[int]) -> dict[str, Any]:
    """Log-normal by moments of the logs (sample sd, n-1): the maximum-likelihood shape for
    positive sizes whose spread grows with their level; its median is exp(mu)."""
    logs = [math.log(v) for v in values]
    mu = _round(statistics.fmean(logs))
    sigma = _round(statistics.stdev(logs))
    return {
        "n": len(values),
        "log_mu": mu,
        "log_sigma": sigma,
        "median": round(math.exp(mu)),
        "p05": round(math.exp(mu - 1.6449 * sigma)),
        "p95": round(math.exp(mu + 1.6449 * sigma)),
        "observed_min": min(values),
        "observed_median": round(statistics.median(values)),
        "observed_max": max(values),
    }


def linear_fit(x: Sequence[int], y: Sequence[int]) -> dict[str, Any]:
    """Least-squares y = a + b x with the slope's standard error, to show whether the data
    can tell a dependence on pre_tokens at all."""
    n = len(x)
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((xi - mx) ** 2 for xi in x)
    sxy = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True))
    slope = sxy / sxx
    resid = [yi - (my + slope * (xi - mx)) for xi, yi in zip(x, y, strict=True)]
    s2 = sum(e * e for e in resid) / (n - 2)
    return {
        "slope_per_1k_pre_tokens": _round(slope * 1000),
        "slope_se_per_1k_pre_tokens": _round(math.sqrt(s2 / sxx) * 1000),
        "pre_tokens_min": min(x),
        "pre_tokens_max": max(x),
    }


def measure(traces: Path) -> dict[str, Any]:
    """Every recorded Claude Code compaction under `traces`, and the fits over the real ones."""
    found = [u for u in units([traces]) if u.format == "claude-code"]
    ratios: list[float] = []
    pending: list[tuple[str, Session, CompactionEvent]] = []
    excluded: list[dict[str, Any]] = []
    held_out: list[tuple[str, Session, CompactionEvent]] = []
    for loaded in load_all(found, lenient=True):
        source = _source_name(loaded.label)
        for session in loaded.trace.sessions:
            if not session.events:
                continue
            synthetic = source in _SYNTHETIC_SOURCES
            recent = _recent(session.client)
            if not synthetic and not recent:
                ratios.extend(ratio_samples(session))
            for event in session.events:
                why = "synthetic format fixture" if synthetic else _exclusion(session, event)
                if why is None and recent:
                    held_out.append((source, session, event))
                    why = RECENT_REASON
                if why is None:
                    pending.append((source, session, event))
                else:
                    excluded.append({"source": source, "session": session.id[:8], "reason": why})
    q25, q50, q75 = (float(v) for v in np.quantile(np.asarray(ratios), [0.25, 0.5, 0.75]))
    ratio = round(q50, 3)
    rows = [measure_event(src, s, e, ratio) for src, s, e in pending]
    summaries = [row["summary_tokens"] for row in rows]
    restored = [row["restored_tokens"] for row in rows]
    beyond = [row["beyond_model_tokens"] for row in rows]
    recent_rows = [measure_event(src, s, e, ratio) for src, s, e in held_out]
    return {
        "schema": 1,
        "what": "Claude Code compactions recorded in ../shared/traces (counts only)",
        "tokenizer_ratio": {
            "claude_per_cl100k": ratio,
            "q25": _round(q25),
            "q75": _round(q75),
            "requests": len(ratios),
            "min_raw_tokens": RATIO_MIN_RAW,
        },
        "compactions": rows,
        "excluded": excluded,
        "fit": {
            "summary_tokens": {
                **lognormal_fit(summaries),
                **linear_fit([row["pre_tokens"] for row in rows], summaries),
            },
            "summary_share": {
                "observed_min": min(row["summary_share"] for row in rows),
                "observed_median": _round(statistics.median(row["summary_share"] for row in rows)),
                "observed_max": max(row["summary_share"] for row in rows),
            },
            "restored_tokens": {
                **lognormal_fit(restored),
                "beyond_model_median": round(statistics.median(beyond)),
            },
        },
        "post_compaction": post_compaction(rows, recent_rows),
    }


def _predicted(row: dict[str, Any], fitted: Sequence[dict[str, Any]], ratio_other: int) -> int:
    """The context after a compaction as the policy builds it, with the summary's median
    and the rest's median fitted on `fitted`: prefix + summary + file rule + re-attached
    first message + rest (+ the other logged blocks that entered with it)."""
    median_summary = math.exp(statistics.fmean(math.log(r["summary_tokens"]) for r in fitted))
    rest = statistics.median(r["beyond_model_tokens"] for r in fitted)
    parts = (row["prefix_tokens"], median_summary, row["file_rule_tokens"])
    total: float = sum(parts) + row["reattached_tokens"] + rest + ratio_other
    return round(total)


def post_compaction(rows: Sequence[dict[str, Any]], recent: Sequence[dict[str, Any]]) -> Any:
    """Leave-one-source-out check of the post-compaction model: each fitted row predicted
    from the rows of the other sources; each held-out row (2.1.200 and newer, never
    fitted) from all fitted rows. Error = predicted / recorded context after - 1."""
    out = []
    for row, held in [*((r, False) for r in rows), *((r, True) for r in recent)]:
        fitted = rows if held else [r for r in rows if r["source"] != row["source"]]
        other = row["context_after"] - row["prefix_tokens"] - row["summary_tokens"]
        other -= row["restored_tokens"]
        predicted = _predicted(row, fitted, other)
        out.append(
            {
                "source": row["source"],
                "session": row["session"],
                "client": row["client"],
                "trigger": row["trigger"],
                "held_out_client": held,
                "context_after": row["context_after"],
                "predicted_after": predicted,
                "error": _round(predicted / row["context_after"] - 1),
            }
        )
    return out


def render(data: dict[str, Any]) -> str:
    """The committed text form: stable key order, one field per line, trailing newline."""
    return json.dumps(data, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.app.measure.calibration_measure")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="shared traces")
    parser.add_argument("--out", type=Path, default=DATA_FILE, help="data file to write")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if --out differs instead of writing it"
    )
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no traces at {args.traces}", file=sys.stderr)
        return 2
    text = render(measure(args.traces))
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print("up to date" if same else f"{args.out.name} differs from the measurement")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
