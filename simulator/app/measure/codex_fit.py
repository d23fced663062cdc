"""Fit the OpenAI automatic-cache model (simulator/prompt_cache.py `OPENAI_FAMILIES`) to the
recorded ``cached_input_tokens`` of Codex rollouts, leave-one-source-out.

Run: ``.venv/bin/python -m simulator.app.measure.codex_fit ../shared/traces/codex``
(writes policies/calibration/codex_fit.json; the method is in codex.md beside it); with
``--causes`` it prints instead the shipped model's unmatched requests by cause (`causes`).

Every source folder is compiled once. Each family has its own grid of parameters
(`GRIDS`: retention with the prompt tail, or retention with the response tail); a
session's cache is per model, so a family's rows depend on its own parameters only, and
one as-recorded replay prices the i-th point of every family's grid at once (as many
replays as the longest grid). For each held-out folder and family the point with the
least absolute cache-read error on the other folders is chosen (a family no other folder
has keeps the shipped parameters), and the held-out folder's rows under those choices
give its figures.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl

from simulator import policy as registry
from simulator import prompt_cache
from simulator.app.fidelity import compare
from simulator.frames import float_sum
from simulator.model import Session, Trace
from simulator.pricing import PriceBook
from simulator.prompt_cache import OPENAI_FAMILIES, OpenAIFamily
from simulator.replay import replay
from traces.load import load

MINUTE = 60 * 1000
RETENTIONS = [5, 10, 15, 20, 30, 45, 60, 90, 120]
TAILS = [0, 64, 128, 192, 256, 384, 512, 768]
#: None: the cache holds prompts only.
RESPONSE_TAILS: list[int | None] = [None, 0, 32, 48, 64, 96, 128]
#: One label per row of `OPENAI_FAMILIES`, in its order (the last is the generic row).
FAMILIES = [
    "gpt-5.6",
    "gpt-5.5",
    "gpt-5.4 (5.5's cache)",
    "others from 5.5's launch",
    "gpt-5 before 5.5's launch",
    "other",
]


def family(model: str, at_ms: int | None = None) -> str:
    """The family a model belongs to at `at_ms`, as `OPENAI_FAMILIES` groups them."""
    for name, (pattern, since_ms, _) in zip(FAMILIES, OPENAI_FAMILIES, strict=True):
        if (at_ms is None or at_ms >= since_ms) and re.search(pattern, model):
            return name
    return FAMILIES[-1]


def _grid(shipped: OpenAIFamily) -> list[OpenAIFamily]:
    """A family's grid: step and offset as shipped (the recorded reads fix them); a family
    that holds responses varies its response tail, one that does not its prompt tail."""
    step, offset = shipped.step, shipped.offset
    if shipped.response_tail is not None:
        return [
            OpenAIFamily(r * MINUTE, 0, step, offset, t) for r in RETENTIONS for t in RESPONSE_TAILS
        ]
    return [OpenAIFamily(r * MINUTE, t, step, offset) for r in RETENTIONS for t in TAILS]


GRIDS: dict[str, list[OpenAIFamily]] = {
    name: _grid(row[2]) for name, row in zip(FAMILIES, OPENAI_FAMILIES, strict=True)
}
SHIPPED = {name: row[2] for name, row in zip(FAMILIES, OPENAI_FAMILIES, strict=True)}


def label(point: OpenAIFamily) -> list[int | None]:
    """A grid point as [retention minutes, prompt tail, response tail]."""
    return [point.retention_ms // MINUTE, point.tail_tokens, point.response_tail]


def _rows(named: list[tuple[str, Trace]], i: int) -> pl.DataFrame:
    """Per-request fidelity rows with every family at the i-th point of its grid (its
    last when its grid is shorter)."""

    def grid_family(model: str, at_ms: int | None = None) -> OpenAIFamily:
        grid = GRIDS[family(model, at_ms)]
        return grid[min(i, len(grid) - 1)]

    original = prompt_cache.openai_family
    prompt_cache.openai_family = grid_family
    try:
        prices = PriceBook()
        frame = replay(named, registry.build("as-recorded"), prices=prices)
        return compare(frame, named, prices)
    finally:
        prompt_cache.openai_family = original


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def figures(rows: pl.DataFrame) -> dict[str, float]:
    """Matched share, median |session cost error|, corpus cost error of some rows."""
    priced = rows.filter(pl.col("rec_cost").is_not_null() & pl.col("sim_cost").is_not_null())
    sessions = priced.group_by("trace").agg(
        float_sum(pl.col("rec_cost")), float_sum(pl.col("sim_cost"))
    )
    sessions = sessions.filter(pl.col("rec_cost") > 0)
    errors = ((sessions["sim_cost"] / sessions["rec_cost"]) - 1).abs()
    rec, sim = float(priced["rec_cost"].sum()), float(priced["sim_cost"].sum())
    return {
        "requests": rows.height,
        "matched": _number(rows["matched"].mean()),
        "median_session_error": _number(errors.median()),
        "corpus_error": sim / rec - 1 if rec else 0.0,
    }


def fit(src: Path) -> dict[str, Any]:
    named: list[tuple[str, Trace]] = []
    folder_of: dict[str, str] = {}
    for item in load([src], lenient=True):
        assert item.trace is not None
        name = item.name.removesuffix(".ctxt")
        named.append((name, item.trace))
        parts = item.label.split("/")
        folder_of[name] = parts[1] if parts[0] == src.name and len(parts) > 2 else parts[0]
    n_points = max(len(g) for g in GRIDS.values())
    runs: list[pl.DataFrame] = []
    for i in range(n_points):
        rows = _rows(named, i)
        runs.append(
            rows.with_columns(
                pl.col("trace").replace_strict(folder_of).alias("folder"),
                pl.struct("model", "ts_ms")
                .map_elements(lambda r: family(r["model"], r["ts_ms"]), return_dtype=pl.String)
                .alias("family"),
                (pl.col("sim_cache_read") - pl.col("rec_cache_read")).abs().alias("abs_err"),
            )
        )
    folders = sorted(set(folder_of.values()))
    # error[(family, folder)][i]: summed |read error| of that family's rows there at point i
    error: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for i, rows in enumerate(runs):
        sums = rows.group_by("family", "folder").agg(pl.col("abs_err").sum())
        for fam, folder, err in sums.iter_rows():
            if i < len(GRIDS[fam]):
                error[(fam, folder)][i] = int(err)

    def best(fam: str, held_out: str | None) -> int | None:
        """The grid index fitted on every folder but `held_out`; None: no data there."""
        total: dict[int, int] = defaultdict(int)
        for (f, folder), by_point in error.items():
            if f == fam and folder != held_out:
                for i, err in by_point.items():
                    total[i] += err
        return min(total, key=lambda i: (total[i], i)) if total else None

    def shipped_index(fam: str) -> int:
        return GRIDS[fam].index(SHIPPED[fam]) if SHIPPED[fam] in GRIDS[fam] else 0

    def chosen_rows(choice: dict[str, int], folder: str | None) -> pl.DataFrame:
        parts = []
        for fam, i in choice.items():
            rows = runs[i].filter(pl.col("family") == fam)
            if folder is not None:
                rows = rows.filter(pl.col("folder") == folder)
            parts.append(rows)
        return pl.concat(parts)

    def choose(held_out: str | None) -> dict[str, int]:
        out = {}
        for fam in FAMILIES:
            i = best(fam, held_out)
            out[fam] = shipped_index(fam) if i is None else i
        return out

    def labelled(choice: dict[str, int]) -> dict[str, list[int | None]]:
        return {f: label(GRIDS[f][i]) for f, i in choice.items()}

    loso: dict[str, Any] = {}
    held_rows = []
    for folder in folders:
        choice = choose(folder)
        rows = chosen_rows(choice, folder)
        held_rows.append(rows)
        loso[folder] = {"fit": labelled(choice), **figures(rows)}
    all_choice = choose(None)
    in_sample = {folder: figures(chosen_rows(all_choice, folder)) for folder in folders}
    return {
        "grid": {
            "retention_min": RETENTIONS,
            "tail_tokens": TAILS,
            "response_tail_tokens": RESPONSE_TAILS,
        },
        "fit_on_all": labelled(all_choice),
        "leave_one_source_out": loso,
        "leave_one_source_out_all": figures(pl.concat(held_rows)),
        "in_sample": in_sample,
        "in_sample_all": figures(chosen_rows(all_choice, None)),
    }


def table(result: dict[str, Any]) -> str:
    """Per held-out folder and overall: held out, then in sample (the fit on all)."""
    lines = [f"{'folder':18} {'requests':>8}  held out: matched median corpus | in sample"]
    loso, ins = result["leave_one_source_out"], result["in_sample"]
    rows = [(f, loso[f], ins[f]) for f in loso]
    rows.append(("all", result["leave_one_source_out_all"], result["in_sample_all"]))
    for name, h, s in rows:
        lines.append(
            f"{name[:18]:18} {h['requests']:8d}  {100 * h['matched']:6.1f}% "
            f"{100 * h['median_session_error']:5.2f}% {100 * h['corpus_error']:+6.2f}% | "
            f"{100 * s['matched']:6.1f}% {100 * s['median_session_error']:5.2f}% "
            f"{100 * s['corpus_error']:+6.2f}%"
        )
    return "\n".join(lines) + "\n"


def _shared(a: list[int], b: list[int]) -> int:
    """Last position at which two views' prefix hashes agree (-1: none)."""
    lo, hi = -1, min(len(a), len(b)) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid] == b[mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _states(
    session: Session, views: dict[int, Any], k: int, grid: Any, tail: int | None
) -> set[int]:
    """What request k would read from the state each earlier prompt of its model left:
    the grid floor of the prefix it shares with that prompt (and, on a cache that holds
    responses, of that prompt's response it goes on with)."""
    chains, cum, ids, _ = views[k]
    origin = session.blocks["origin"]
    model = session.requests["model"]
    out = set()
    for j in range(k):
        if j not in views or model[j] != model[k]:
            continue
        pc, _, _, _ = views[j]
        p = _shared(pc, chains)
        tokens = cum[p] if p >= 0 else 0
        if tail is not None and p == len(pc) - 1 and p + 1 < len(ids):
            q = p + 1
            while q < len(ids) and ids[q] >= 0 and origin[ids[q]] == j:
                q += 1
            if q > p + 1:
                output = int(session.requests["output"][j])
                tokens += max(0, min(output - tail, cum[q - 1] - tokens))
        out.add(grid(tokens))
    return out


def _starts(traces: list[Trace]) -> dict[str, set[tuple[str, int]]]:
    """Per model, (session id, read) of the nonzero reads of each session's first three
    requests with that model: the starts other sessions found cached. A request reading
    exactly one of another session's (more than the inferred prefix, less than its own
    state) found only a start shared across sessions: routed to a machine without its
    state, as a read of the shared start only is."""
    out: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for trace in traces:
        for session in trace.sessions:
            r = session.requests
            models, reads = r["model"].tolist(), r["cache_read"].tolist()
            has = r["has_usage"].tolist()
            seen: dict[int, int] = defaultdict(int)
            for k, m in enumerate(models):
                if has[k] and seen[m] < 3:
                    seen[m] += 1
                    if reads[k] > 0:
                        out[session.models[m]].add((session.id, int(reads[k])))
    return out


def causes(src: Path) -> dict[str, dict[str, int]]:
    """The shipped model's unmatched requests (in sample) by cause and family: each
    recorded read against what the request would have read from each earlier prompt's
    state (codex.md: the table of causes)."""
    prices = PriceBook()
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    items = list(load([src], lenient=True))
    starts = _starts([item.trace for item in items if item.trace is not None])
    for item in items:
        assert item.trace is not None
        name, trace = item.name.removesuffix(".ctxt"), item.trace
        views: dict[tuple[int, int], Any] = {}

        def observe(
            i: int, k: int, view: Any, call: Any, usage: Any, seen: dict[Any, Any] = views
        ) -> None:
            if call.kind == "request":
                seen[(i, k)] = (list(view.chains), list(view.cum), list(view.ids), usage)

        frame = replay(
            [(name, trace)], registry.build("as-recorded"), prices=prices, observe=observe
        )
        rows = compare(frame, [(name, trace)], prices)
        unmatched = {
            (r[0], r[1])
            for r in rows.filter(~pl.col("matched")).select("session_index", "request").iter_rows()
        }
        for i, session in enumerate(trace.sessions):
            r = session.requests
            mine = {k: v for (si, k), v in views.items() if si == i}
            first_of: dict[int, int] = {}
            for k in range(session.n_requests):
                first_of.setdefault(int(r["model"][k]), k)
            for k in range(session.n_requests):
                if (i, k) not in unmatched:
                    continue
                model = session.models[int(r["model"][k])]
                since = int(r["ts"][first_of[int(r["model"][k])]])
                f = prompt_cache.openai_family(model, since)
                fam = family(model, since)
                warm = int(r["cache_read"][first_of[int(r["model"][k])]])
                offset = warm % f.step if warm >= 1024 and warm % 128 == 0 else f.offset

                def grid(x: int, step: int = f.step, offset: int = offset) -> int:
                    return x - (x - offset) % step if x >= 1024 else 0

                read, sim = int(r["cache_read"][k]), mine[k][3].cache_read
                if first_of[int(r["model"][k])] == k:
                    cause = "first request of its model"
                elif sim > read:
                    earlier = {j: v for j, v in mine.items() if j < k - 1 or j == k}
                    older = _states(session, earlier, k, grid, f.response_tail)
                    if read == 0:
                        cause = "over: recorded miss (0)"
                    elif read <= session.prefix_at()[k] + 128:
                        cause = "over: the shared start only"
                    elif read in older:
                        cause = "over: an older prompt's state"
                    elif sim - read < 2048:
                        cause = "over: by under 2k"
                    elif any(v == read for sid, v in starts.get(model, ()) if sid != session.id):
                        cause = "over: a start another session read"
                    else:
                        cause = "over: partial, other"
                else:
                    gap = int(r["ts"][k]) - int(r["ts"][k - 1])
                    if gap > f.retention_ms:
                        cause = "under: after a gap over the retention"
                    elif read - sim < 2048:
                        cause = "under: by under 2k"
                    else:
                        cause = "under: other"
                table[cause][fam] += 1
    return {c: dict(v) for c, v in table.items()}


if __name__ == "__main__":
    if "--causes" in sys.argv:
        found = causes(Path(sys.argv[1]))
        for cause, by in sorted(found.items(), key=lambda c: -sum(c[1].values())):
            detail = ", ".join(f"{f} {n}" for f, n in sorted(by.items()))
            print(f"{sum(by.values()):5d}  {cause}  ({detail})")
        print(f"{sum(sum(by.values()) for by in found.values()):5d}  unmatched")
        raise SystemExit(0)
    result = fit(Path(sys.argv[1]))
    out = Path(__file__).resolve().parents[3] / "policies" / "calibration" / "codex_fit.json"
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result["fit_on_all"], sort_keys=True))
    print(table(result), end="")
