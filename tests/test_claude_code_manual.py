"""A user's /compact is a recorded action: every Claude Code preset replays it."""

from __future__ import annotations

import polars as pl

from simulator import policy
from simulator.model import CompactionEvent, Kind, Role, Trace
from simulator.replay import replay
from traces.builder import Hasher, SessionBuilder

MINUTE = 60_000


def _session(trigger: str) -> Trace:
    b = SessionBuilder(Hasher(b"manual"), id="s", kind="main", client="claude-code 2.1.40")
    b.prefix_tokens = 10_000
    for k in range(6):
        b.add_block(
            msg=k,
            kind=Kind.TEXT,
            role=Role.USER,
            text=f"u{k}",
            ts=k * MINUTE,
            first_request=k,
            tokens=1_000,
        )
        b.add_request(ts=k * MINUTE, model="claude-sonnet-4-5-20250929", usage=None)
    b.add_event(
        CompactionEvent(request=3, trigger=trigger, pre_tokens=14_000, summary_block=-1, ts=0)
    )
    return Trace("claude-code", "t", [b.finish()])


def test_a_recorded_manual_compaction_is_replayed_below_the_threshold() -> None:
    params = {"autocompact.summary_tokens": 3_000, "autocompact.restore_extra_tokens": 0}
    frame = replay([("t", _session("manual"))], policy.build("claude-code", params))
    compactions = frame.filter(pl.col("kind") == "compaction")
    assert compactions.select("request", "stage").rows() == [(3, "manual")]
    # request 3 then sends the prefix and the 3,000-token summary of turns 0-3 (no file
    # was read, so nothing is restored): 10,000 + 3,000; request 4 adds its 1,000
    requests = frame.filter(pl.col("kind") == "request")
    assert requests["context_tokens"].to_list() == [11_000, 12_000, 13_000, 13_000, 14_000, 15_000]


def test_a_recorded_auto_compaction_is_the_policys_own_decision() -> None:
    frame = replay([("t", _session("auto"))], policy.build("claude-code"))
    assert frame.filter(pl.col("kind") == "compaction").is_empty()
