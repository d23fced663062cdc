"""The claude-code pipeline's cache markers (policies/claude_code/policy.py `breakpoints`):
Claude Code marks the last two messages, so a turn that adds more blocks than the lookback
(20) still reads the previous request's entry through its assistant message's marker.

The session: Sonnet 5, a 5,000-token prefix inferred from request 0, which sends a
1,000-token prompt and writes 6,000; its response calls `uses` tools (10 tokens each),
whose results (100 tokens each) request 1 sends 30 s later: uses + results new blocks.
"""

from __future__ import annotations

import polars as pl
import pytest

from policies.claude_code import policy as cc
from simulator import policy as registry
from simulator.model import Flag, Kind, Role, Trace
from simulator.replay import replay
from traces.builder import Hasher, RecordedUsage, SessionBuilder

T0 = 1_760_000_000_000


def turn(uses: int) -> Trace:
    b = SessionBuilder(Hasher(b"marks"), id="s", kind="main", client="claude-code 2.1.220")
    b.add_block(
        msg=0, kind=Kind.TEXT, role=Role.USER, text="ask", ts=T0 - 1, first_request=0,
        tokens=1_000, flags=Flag.HUMAN,
    )  # fmt: skip
    end = T0 + 10_000
    b.add_request(
        ts=T0, model="claude-sonnet-5", usage=RecordedUsage(0, 0, 6_000, 0, 50), ts_end=end
    )
    for i in range(uses):
        b.add_block(
            msg=1, kind=Kind.TOOL_USE, role=Role.ASSISTANT, text=f"use {i}", ts=end,
            first_request=1, tool="Bash", origin=0, use_id=f"u{i}", tokens=10,
        )  # fmt: skip
    for i in range(uses):
        b.add_block(
            msg=2 + i, kind=Kind.TOOL_RESULT, role=Role.USER, text=f"out {i}", ts=end + 1,
            first_request=1, tool="Bash", result_for=f"u{i}", tokens=100,
        )  # fmt: skip
    context = 6_000 + 110 * uses
    usage = RecordedUsage(0, 6_000, context - 6_000, 0, 20)
    b.add_request(ts=T0 + 30_000, model="claude-sonnet-5", usage=usage, ts_end=T0 + 40_000)
    return Trace(format="claude-code", source_digest="ab" * 32, sessions=[b.finish()])


def request_1(trace: Trace, name: str) -> tuple[int, int, int]:
    """Request 1's (cache read, cache write, context)."""
    frame = replay([("marks", trace)], registry.build(name))
    row = frame.filter(pl.col("kind") == "request").sort("request").row(1, named=True)
    return row["cache_read"], row["cache_write_5m"] + row["cache_write_1h"], row["context_tokens"]


def test_a_turn_past_the_lookback_reads_through_the_assistant_messages_marker() -> None:
    # 11 uses + 11 results: 22 new blocks, the previous marker 22 back from the last
    # block, 11 back from the last tool use (the assistant message's last block).
    for name in ("as-recorded", "claude-code"):
        assert request_1(turn(11), name) == (6_000, 1_210, 7_210), name


def test_a_turn_within_the_lookback_needs_no_second_marker() -> None:
    for name in ("as-recorded", "claude-code"):
        assert request_1(turn(10), name) == (6_000, 1_100, 7_100), name


def test_one_marker_alone_misses_past_the_lookback(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the second marker changes: without it the last marker's lookback finds no
    entry, so request 1 reads only the prefix, warm from request 0."""
    monkeypatch.setattr(cc._State, "_previous_message_mark", lambda self, view, last: -1)
    assert request_1(turn(11), "claude-code") == (5_000, 2_210, 7_210)
