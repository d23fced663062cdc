"""Fidelity per source folder: the figures the fidelity issues ask for, one row per folder.

Run: ``.venv/bin/python -m simulator.app.measure.fidelity_folders ../shared/traces/claude-code``
(or ``../shared/traces/codex``); ``--lenient`` is implied, as for every real corpus.
``--policy NAME`` replays under another policy than ``as-recorded`` (``claude-code``: how
near a policy's baseline, the pipeline of each session's own version, comes to the
recorded bill; the bars are the cache model's, met or not there).

Each immediate subfolder of the root is one source (one contributor's sessions, as
../shared/traces/SOURCES.tsv lists them). The as-recorded replay runs with the shipped
model, so a folder's figures are leave-one-source-out exactly when nothing shipped was
fitted on that folder: true of the Claude Code cache model (no fitted parameter). The Codex
cache parameters are fitted, and their leave-one-source-out figures come from
``python -m simulator.app.measure.codex_fit``; this script gives the shipped model's figures there.

The bars are the issues' own: Claude Code at least 98% of requests matched, median session
error at most 0.5%, p90 at most 2%, corpus within 1%; Codex 95%, 1%, no p90 bar, 2%.
Folder names are printed to the terminal only: nothing is written.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from simulator import policy as registry
from simulator.app.fidelity import compare, summarize
from simulator.pricing import PriceBook
from simulator.replay import replay
from traces.load import load, named_traces


@dataclass(frozen=True)
class Bars:
    """The acceptance bars of one format's fidelity issue."""

    matched: float
    median: float
    p90: float | None
    corpus: float

    def met(self, row: dict[str, float]) -> bool:
        return (
            row["matched"] >= self.matched
            and row["median"] <= self.median
            and (self.p90 is None or row["p90"] <= self.p90)
            and abs(row["corpus"]) <= self.corpus
        )


BARS = {
    "claude-code": Bars(0.98, 0.005, 0.02, 0.01),
    "codex": Bars(0.95, 0.01, None, 0.02),
}


def figures(per_request: pl.DataFrame) -> dict[str, float]:
    """Requests, matched share, median and p90 |session error|, corpus error."""
    sessions, overall = summarize(per_request)
    shares = sessions["err_cost_share"].drop_nulls().abs().to_numpy()
    return {
        "requests": float(per_request.height),
        "sessions": float(sessions.height),
        "matched": float(overall["matched_share"] or 0.0),
        "median": float(np.median(shares)) if len(shares) else 0.0,
        "p90": float(np.quantile(shares, 0.9)) if len(shares) else 0.0,
        "corpus": float(overall["corpus_cost_error"] or 0.0),
    }


def folder_rows(root: Path, policy: str = "as-recorded") -> dict[str, pl.DataFrame]:
    """The per-request fidelity rows of every subfolder of `root` under `policy`."""
    prices = PriceBook()
    out: dict[str, pl.DataFrame] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        named = named_traces(load([folder], lenient=True))
        if not named:
            continue
        frame = replay(named, registry.build(policy), prices=prices)
        out[folder.name] = compare(frame, named, prices)
    return out


def table(rows: dict[str, pl.DataFrame], bars: Bars) -> str:
    """One line per folder and one for all of them, with whether every bar is met."""
    lines = [
        f"{'folder':18} {'sessions':>8} {'requests':>8} {'matched':>8} {'median':>7} "
        f"{'p90':>7} {'corpus':>7}  bars"
    ]
    everything = pl.concat(list(rows.values())) if rows else None
    items = list(rows.items()) + ([("all", everything)] if everything is not None else [])
    for name, frame in items:
        f = figures(frame)
        lines.append(
            f"{name[:18]:18} {int(f['sessions']):8d} {int(f['requests']):8d} "
            f"{100 * f['matched']:7.2f}% {100 * f['median']:6.2f}% {100 * f['p90']:6.2f}% "
            f"{100 * f['corpus']:+6.2f}%  {'met' if bars.met(f) else 'short'}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--lenient"]
    policy = "as-recorded"
    if len(args) == 3 and args[1] == "--policy":
        policy = args.pop(2)
        args.pop(1)
    if len(args) != 1 or not Path(args[0]).is_dir() or policy not in registry.names():
        print(
            "usage: python -m simulator.app.measure.fidelity_folders ROOT [--policy NAME]"
            " (a folder of source folders; a registered policy)"
        )
        return 2
    root = Path(args[0])
    bars = BARS["codex"] if root.name == "codex" else BARS["claude-code"]
    print(table(folder_rows(root, policy), bars), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
