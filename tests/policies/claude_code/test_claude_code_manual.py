"""A user's /compact is a recorded action: every Claude Code preset replays it."""

from __future__ import annotations

import polars as pl

from simulator import policy
from simulator.model import CompactionEvent, Flag, Kind, Role, Trace
from simulator.replay import replay
from tests.support.scripted import contexts
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


def _logged(trigger: str) -> Trace:
    """Requests 0-5, one 1,000-token user message each, prefix 10,000. Request 3 is where
    the recording compacted: its logged summary (2,000 tokens), 4,000 tokens the client
    attached unlogged (an INJECTED artifact), then the user's next 500-token message."""
    b = SessionBuilder(Hasher(b"logged"), id="s", kind="main", client="claude-code 1.0.53")
    b.prefix_tokens = 10_000

    def block(k: int, kind: Kind, tokens: int, flags: Flag = Flag.NONE) -> int:
        return b.add_block(
            msg=b.n_blocks,
            kind=kind,
            role=Role.USER,
            text=f"{kind.name}{k}",
            ts=k * MINUTE,
            first_request=k,
            tokens=tokens,
            flags=flags,
        )

    summary = -1
    for k in range(6):
        if k == 3:
            summary = block(k, Kind.SUMMARY, 2_000, Flag.ARTIFACT)
            block(k, Kind.INJECTED, 4_000, Flag.ARTIFACT)
            block(k, Kind.TEXT, 500)
        else:
            block(k, Kind.TEXT, 1_000)
        b.add_request(ts=k * MINUTE, model="claude-sonnet-4-20250514", usage=None)
    b.add_event(CompactionEvent(3, trigger, -1, summary, 0))
    return Trace("claude-code", "t", [b.finish()])


def test_a_manual_compaction_uses_the_logged_summary_and_keeps_what_came_after() -> None:
    # Request 3: prefix + the logged 2,000-token summary (no file to restore) + the 500
    # the user wrote after the /compact; the attachments are modelled, not the recorded
    # 4,000. Requests 4, 5 add 1,000 each.
    params = {"autocompact.restore_extra_tokens": 0}
    frame = replay([("t", _logged("manual"))], policy.build("claude-code@1.0", params))
    assert frame.filter(pl.col("kind") == "compaction")["stage"].to_list() == ["manual"]
    assert contexts(frame) == [11_000, 12_000, 13_000, 12_500, 13_500, 14_500]


def test_compactions_before_a_request_can_be_replayed_exactly_as_recorded() -> None:
    # With as_recorded_before=4 the auto-compaction at 3 is the recording's: summary and
    # the unlogged attachments, 10,000 + 2,000 + 4,000 + 500 = 16,500, the recorded context.
    params = {"autocompact.as_recorded_before": 4, "autocompact.restore_extra_tokens": 999}
    frame = replay([("t", _logged("auto"))], policy.build("claude-code@1.0", params))
    assert frame.filter(pl.col("kind") == "compaction")["stage"].to_list() == ["as-recorded"]
    assert contexts(frame) == [11_000, 12_000, 13_000, 16_500, 17_500, 18_500]
    # Without it the policy decides, and this small session never reaches its threshold.
    frame = replay([("t", _logged("auto"))], policy.build("claude-code@1.0"))
    assert frame.filter(pl.col("kind") == "compaction").is_empty()
    assert contexts(frame) == [11_000, 12_000, 13_000, 13_500, 14_500, 15_500]


def test_a_manual_compaction_is_replayed_with_context_collapse_on() -> None:
    # Collapse replaces autocompact, not the user's /compact: the same contexts as above.
    params = {"autocompact.restore_extra_tokens": 0, "collapse.enabled": True}
    frame = replay([("t", _logged("manual"))], policy.build("claude-code@1.0", params))
    assert frame.filter(pl.col("kind") == "compaction")["stage"].to_list() == ["manual"]
    assert contexts(frame) == [11_000, 12_000, 13_000, 12_500, 13_500, 14_500]


def test_disable_compact_refuses_the_users_compact_too() -> None:
    """DISABLE_COMPACT turns every compaction off, /compact included (DISABLE_AUTO_COMPACT
    only the automatic one): the turns then go on growing by 1,000 each."""
    params = {"autocompact.summary_tokens": 3_000, "autocompact.restore_extra_tokens": 0}
    off = replay(
        [("t", _session("manual"))], policy.build("claude-code", {**params, "DISABLE_COMPACT": "1"})
    )
    assert off.filter(pl.col("kind") == "compaction").is_empty()
    assert contexts(off) == [11_000, 12_000, 13_000, 14_000, 15_000, 16_000]
    auto_off = replay(
        [("t", _session("manual"))],
        policy.build("claude-code", {**params, "DISABLE_AUTO_COMPACT": "1"}),
    )
    compactions = auto_off.filter(pl.col("kind") == "compaction")
    assert compactions.select("request", "stage").rows() == [(3, "manual")]
