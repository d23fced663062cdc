"""The run summary shows each policy's dollars beside the recording's (simulator/frames.py)."""

from __future__ import annotations

import pytest

from reports.tables import render_run_summary
from simulator import policy
from simulator.frames import build_run, recorded_cost
from simulator.model import Kind, Role, Trace
from simulator.replay import ReplayOptions
from traces.builder import Hasher, RecordedUsage, SessionBuilder


def _trace(usage: bool) -> Trace:
    b = SessionBuilder(Hasher(b"summary"), id="s", kind="main", client="claude-code 2.1.88")
    b.prefix_tokens = 1_000
    b.add_block(
        msg=0, kind=Kind.TEXT, role=Role.USER, text="x" * 400, ts=0, first_request=0, tokens=100
    )
    # Sonnet 4.5: $3 per million input tokens, $15 per million output tokens.
    recorded = RecordedUsage(100_000, 0, 0, 0, 10_000) if usage else None
    b.add_request(ts=0, model="claude-sonnet-4-5-20250929", usage=recorded)
    return Trace("claude-code", "t", [b.finish()])


def test_recorded_cost_prices_the_recorded_usage() -> None:
    # 100,000 x $3 / 1M + 10,000 x $15 / 1M = $0.30 + $0.15.
    assert recorded_cost([("t", _trace(True))]) == pytest.approx(0.45, abs=1e-12)
    assert recorded_cost([("t", _trace(False))]) is None


def test_the_summary_shows_recorded_and_simulated_cost_for_every_policy() -> None:
    from simulator.loss import replay_with_loss
    from simulator.pricing import PriceBook

    traces = [("t", _trace(True))]
    policies = [policy.build("as-recorded"), policy.build("none")]
    frames = [
        replay_with_loss(traces, p, ReplayOptions(cache="auto", seed=0), PriceBook())
        for p in policies
    ]
    outputs = build_run(
        frames, [p.spec() for p in policies], traces, seed=0, cache="auto",
        prices_version="x", lenient=False,
    )  # fmt: skip
    lines = render_run_summary(outputs, width=200).splitlines()
    header = lines[0].split()
    assert "recorded" in header
    rows = [line for line in lines[2:] if line.startswith(("as-recorded", "none"))]
    assert len(rows) == 2
    assert all(row.split()[2] == "0.4500" for row in rows)  # the recorded $ of every policy
    assert any(line.startswith("recorded: $0.4500") for line in lines)
