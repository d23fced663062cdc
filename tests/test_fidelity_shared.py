"""The cache model against every real Claude Code session's recorded usage.

Acceptance of the engine issue: replayed `as-recorded`, the median per-session cost error
is at most 1%, the whole corpus's cost is within 1%, and at least 98% of requests match
(simulated cache read and cache write each within 1% of the request's context size).
"""

from __future__ import annotations

from pathlib import Path

from simulator import policy
from simulator.fidelity import compare, summarize
from simulator.replay import replay
from traces.load import load_all, units


def _overall(shared: Path, **params: object) -> dict[str, object]:
    found = units([shared / "claude-code"])
    traces = [
        (item.name.removesuffix(".ctxt"), item.trace) for item in load_all(found, lenient=True)
    ]
    frame = replay(traces, policy.build("as-recorded", dict(params)))
    return summarize(compare(frame, traces))[1]


def test_as_recorded_reproduces_recorded_cost(shared: Path) -> None:
    overall = _overall(shared)
    assert overall["requests"] == 3266
    assert overall["median_abs_session_cost_error"] <= 0.01
    assert abs(overall["corpus_cost_error"]) <= 0.01
    assert overall["matched_share"] >= 0.98


def test_unlogged_prefix_resets_are_what_closes_the_gap(shared: Path) -> None:
    """Without the inferred prefix resets the model is measurably worse (so the inference
    is doing real work, and a regression in it shows here)."""
    without = _overall(shared, prefix_resets=False)
    assert without["matched_share"] < 0.975
    assert abs(without["corpus_cost_error"]) > 0.05
