"""Fit the OpenAI automatic-cache model (simulator/prompt_cache.py `OPENAI_FAMILIES`) to the
recorded ``cached_input_tokens`` of Codex rollouts, leave-one-source-out.

Run: ``.venv/bin/python -m simulator.app.measure.codex_fit ../shared/traces/codex``
(writes simulator.app.measure.codex_fit.json; the method is in codex.md beside it).

Every source folder is compiled once; the as-recorded replay is priced once per grid point
(retention x tail, applied to every family at once: one cache per model, so a family's
rows depend on its own parameters only). For each held-out folder and family the grid
point with the least absolute cache-read error on the other folders is chosen, and the
held-out folder's rows under those choices give its figures.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl

from simulator import policy as registry
from simulator import prompt_cache
from simulator.app.fidelity import compare
from simulator.model import Trace
from simulator.pricing import PriceBook
from simulator.prompt_cache import OpenAIFamily
from simulator.replay import replay
from traces.load import load

MINUTE = 60 * 1000
RETENTIONS = [5, 10, 15, 20, 30, 45, 60, 90, 120]
TAILS = [0, 64, 128, 192, 256, 384, 512, 768]
#: Step and offset are not fitted: the recorded reads fix them (prompt_cache.py).
GRID_STEP = {"gpt-5.6": (1024, 768), "gpt-5.5": (512, 384)}
FAMILIES = ["gpt-5.6", "gpt-5.5", "gpt-5.4", "other"]


def family(model: str) -> str:
    """The family a model belongs to, as `OPENAI_FAMILIES` groups them."""
    return next((f for f in FAMILIES[:-1] if f in model), "other")


def _rows(named: list[tuple[str, Trace]], retention: int, tail: int) -> pl.DataFrame:
    """Per-request fidelity rows with every family at (retention, tail)."""

    def grid_family(model: str) -> OpenAIFamily:
        step, offset = GRID_STEP.get(family(model), (128, 0))
        return OpenAIFamily(retention * MINUTE, tail, step, offset)

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
    sessions = priced.group_by("trace").agg(pl.col("rec_cost").sum(), pl.col("sim_cost").sum())
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
    grid: dict[tuple[int, int], pl.DataFrame] = {}
    for retention in RETENTIONS:
        for tail in TAILS:
            rows = _rows(named, retention, tail)
            grid[(retention, tail)] = rows.with_columns(
                pl.col("trace").replace_strict(folder_of).alias("folder"),
                pl.col("model").map_elements(family, return_dtype=pl.String).alias("family"),
                (pl.col("sim_cache_read") - pl.col("rec_cache_read")).abs().alias("abs_err"),
            )
    folders = sorted(set(folder_of.values()))
    # error[(family, folder)][point]: summed |read error| of that family's rows there
    error: dict[tuple[str, str], dict[tuple[int, int], int]] = defaultdict(dict)
    for point, rows in grid.items():
        sums = rows.group_by("family", "folder").agg(pl.col("abs_err").sum())
        for fam, folder, err in sums.iter_rows():
            error[(fam, folder)][point] = int(err)

    def best(fam: str, held_out: str | None) -> tuple[int, int]:
        total: dict[tuple[int, int], int] = defaultdict(int)
        for (f, folder), by_point in error.items():
            if f == fam and folder != held_out:
                for point, err in by_point.items():
                    total[point] += err
        if not total:
            return (10, 0)
        return min(total, key=lambda p: (total[p], p))

    def chosen_rows(choice: dict[str, tuple[int, int]], folder: str | None) -> pl.DataFrame:
        parts = []
        for fam, point in choice.items():
            rows = grid[point].filter(pl.col("family") == fam)
            if folder is not None:
                rows = rows.filter(pl.col("folder") == folder)
            parts.append(rows)
        return pl.concat(parts)

    loso: dict[str, Any] = {}
    held_rows = []
    for folder in folders:
        choice = {fam: best(fam, folder) for fam in FAMILIES}
        rows = chosen_rows(choice, folder)
        held_rows.append(rows)
        loso[folder] = {"fit": {f: list(p) for f, p in choice.items()}, **figures(rows)}
    all_choice = {fam: best(fam, None) for fam in FAMILIES}
    baseline = grid[(10, 0)]  # 10 minutes, no tail (gpt-5.5 and 5.6 on their chunk grids)
    return {
        "grid": {"retention_min": RETENTIONS, "tail_tokens": TAILS},
        "fit_on_all": {f: list(p) for f, p in all_choice.items()},
        "leave_one_source_out": loso,
        "leave_one_source_out_all": figures(pl.concat(held_rows)),
        "in_sample_all": figures(chosen_rows(all_choice, None)),
        "default_10min_tail0": figures(baseline),
    }


if __name__ == "__main__":
    result = fit(Path(sys.argv[1]))
    out = Path(__file__).resolve().parents[3] / "policies" / "calibration" / "codex_fit.json"
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))
