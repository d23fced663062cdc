"""Trigger fidelity: the preset of each recording's Claude Code version, replayed on the
real traces, compacts where the recording compacted.

The table below is the current result, checked exactly so that any change to the pipeline
shows up here and is looked at; the acceptance bar (same request +/- 1, context after
compaction within 15%) is what `test_acceptance_share` counts.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from policies.claude_code.policy import preset_for
from simulator import policy
from simulator.model import Trace
from simulator.replay import replay
from traces.load import load_all, units

#: (trace file, recorded request, simulated request or None, recorded context after,
#: simulated context after) per recorded auto-compaction.
EXPECTED = [
    ("ffc93f57", 163, 162, 62794, 62312),
    ("ffc93f57", 269, 269, 76113, 67972),
    ("0a725fb5", 158, 158, 30905, 31268),
    ("9034225e", 135, 135, 35866, 35577),
    ("da4409c0", 128, 135, 27368, 36387),
    ("da4409c0", 247, 244, 32147, 32140),
    ("da4409c0", 374, 374, 27927, 37610),
    ("f67ab274", 140, 140, 102368, 43982),
    ("f67ab274", 223, None, 43421, None),
]


def trigger_table(shared: Path) -> list[tuple[str, int, int | None, int, int | None]]:
    rows: list[tuple[str, int, int | None, int, int | None]] = []
    for item in load_all(units([shared / "claude-code"]), lenient=True):
        for session in item.trace.sessions:
            if not session.events:
                continue
            trace = Trace(item.trace.format, item.trace.source_digest, [session])
            frame = replay([(item.name, trace)], policy.build(preset_for(session.client)))
            compactions = frame.filter(pl.col("kind") == "compaction")["request"].to_list()
            context = session.recorded_context()
            used: set[int] = set()
            for event in session.events:
                near = [k for k in compactions if k not in used and abs(k - event.request) <= 20]
                sim = min(near, key=lambda k: abs(k - event.request)) if near else None
                after = None
                if sim is not None:
                    used.add(sim)
                    row = frame.filter((pl.col("request") == sim) & (pl.col("kind") == "request"))
                    after = int(row["context_tokens"][0])
                rows.append((item.name[:8], event.request, sim, int(context[event.request]), after))
    return rows


@pytest.fixture(scope="module")
def table(shared: Path) -> list[tuple[str, int, int | None, int, int | None]]:
    return trigger_table(shared)


def test_trigger_table(table: list[tuple[str, int, int | None, int, int | None]]) -> None:
    assert sorted(table) == sorted(EXPECTED)


def test_acceptance_share(table: list[tuple[str, int, int | None, int, int | None]]) -> None:
    same = [r for r in table if r[2] is not None and abs(r[2] - r[1]) <= 1]
    close = [r for r in same if r[4] is not None and abs(r[4] - r[3]) <= 0.15 * r[3]]
    assert (len(table), len(same), len(close)) == (9, 6, 4)
