"""Four peer policies on small hand-built sessions: `openhands`, `llm-summary`,
`sliding-window` and `cline` (policies/peers/), then over every real Claude Code session.

Every expectation is a literal computed by hand (derivation in the comments). The sessions
follow one convention so that the numbers stay simple:

* the system + tools prefix is 10,000 tokens, set explicitly: no recorded usage, so block
  tokens are exactly the numbers written here and every cache entry lives 5 minutes;
* request 0 sends a 1,000-token user message `u`; every later request k adds one *round*:
  the response to request k-1 (a 100-token tool_use `Tk`) and its tool result `Rk`, both
  entering at k; requests are one minute apart. A round is one API-round group, so
  without a policy request k holds 11,000 + 100 k + (results so far);
* recorded outputs are the tokens of each response: 100 for every request but the last.

Model: Sonnet 4.5 (200,000-token window, 1,024-token cache minimum).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import polars as pl
import pytest

from policies.peers.cline import max_allowed
from simulator import policy
from simulator.model import Kind, Role, Trace
from simulator.policy import PolicyError
from simulator.replay import replay
from tests.support import Named
from tests.support.scripted import compactions, contexts, row
from traces.builder import Hasher, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000
PEERS = ["openhands", "llm-summary", "sliding-window", "cline"]


def session(results: Sequence[int], *, user: int = 1_000) -> Trace:
    """Request 0: a `user`-token message; request k >= 1: round k, a 100-token tool_use
    and a tool result of results[k - 1] tokens. Blocks are u, T1, R1, T2, R2, ..."""
    b = SessionBuilder(Hasher(b"peers"), id="s", kind="main", client="claude-code 2.1.88")
    b.prefix_tokens = 10_000
    b.add_block(
        msg=0, kind=Kind.TEXT, role=Role.USER, text="u", ts=T0, first_request=0, tokens=user
    )
    b.add_request(ts=T0, model=SONNET, usage=None)
    for k, tokens in enumerate(results, start=1):
        ts = T0 + k * MINUTE
        uid = f"t{k}"
        b.add_block(
            msg=2 * k - 1,
            kind=Kind.TOOL_USE,
            role=Role.ASSISTANT,
            text=f"use {k}",
            ts=ts,
            first_request=k,
            tool="Bash",
            origin=k - 1,
            use_id=uid,
            tokens=100,
        )
        b.add_block(
            msg=2 * k,
            kind=Kind.TOOL_RESULT,
            role=Role.USER,
            text=f"result {k}",
            ts=ts,
            first_request=k,
            tool="Bash",
            result_for=uid,
            tokens=tokens,
        )
        b.add_request(ts=ts, model=SONNET, usage=None)
    return Trace(format="claude-code", source_digest="t", sessions=[b.finish()])


def run(trace: Trace, name: str, params: dict[str, Any] | None = None) -> tuple[pl.DataFrame, Any]:
    """Replay one session; returns the rows and the session's policy state."""
    pol = policy.build(name, params or {})
    states: list[Any] = []
    make = pol.session

    def keep(ctx: Any) -> Any:
        state = make(ctx)
        states.append(state)
        return state

    pol.session = keep  # type: ignore[method-assign]
    frame = replay([("t", trace)], pol)
    return frame, states[0]


def usage(r: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(context, uncached, cache read, cache write 5m, cache write 1h, output) of a row."""
    return (
        r["context_tokens"],
        r["uncached_input"],
        r["cache_read"],
        r["cache_write_5m"],
        r["cache_write_1h"],
        r["output"],
    )


# -- openhands ----------------------------------------------------------------------------


def test_openhands_condenses_above_max_size_keeping_head_and_tail() -> None:
    """max_size 10, keep_first 2: the tail keeps 10 // 2 - 2 - 1 = 2 events. Request k
    holds 1 + 2k events (u, then T/R per round), so the first condensation is at k = 5
    (11 events > 10): [u T1 R1 T2 R2 T3 R3 T4 R4 T5 R5]. Group starts are 0, 1, 3, 5, 7, 9:
    the head's cut moves forward from 2 to 3 (T1 keeps R1), the tail's from 11 - 2 = 9
    stays at 9. Forgotten: T2..R4, 3 x 1,100 = 3,300 tokens."""
    frame, state = run(
        session([1_000] * 9), "openhands", {"max_size": 10, "keep_first": 2, "summary_tokens": 500}
    )
    assert compactions(frame) == [(5, "condense"), (8, "condense")]
    # The condenser's request: the forgotten events and its 500-token prompt, no system
    # prompt, no tools, no cache at all: 3,300 + 500 uncached; the output is the summary.
    assert usage(row(frame, 5, "compaction")) == (3_800, 3_800, 0, 0, 0, 500)
    # After: prefix 10,000 + u T1 R1 2,100 + summary 500 + T5 R5 1,100 = 13,700 (6 events);
    # then one round a request: 14,800, 15,900. At k = 8 there are 12 events:
    # [u T1 R1 S T5 R5 T6 R6 T7 R7 T8 R8]; the forgotten range is S..R7 (the tail keeps
    # T8 R8): the previous summary is folded into the next one, 500 + 3 x 1,100 = 3,800
    # tokens, plus the prompt.
    assert usage(row(frame, 8, "compaction")) == (4_300, 4_300, 0, 0, 0, 500)
    assert contexts(frame) == [
        11_000, 12_100, 13_200, 14_300, 15_400, 13_700, 14_800, 15_900, 13_700, 14_800
    ]  # fmt: skip
    # Blocks: u = 0, Tk = 2k - 1, Rk = 2k; the summary is the policy's own item (< 0).
    items = state.conv.items
    assert items[:3] == [0, 1, 2] and items[3] < 0 and items[4:] == [15, 16, 17, 18]
    assert state.condensations == 2
    # The conversation's own request after condensing reads the cached head (prefix + u T1
    # R1, cached at request 1 and still alive) and writes from the summary on: 500 + 1,100.
    assert usage(row(frame, 5)) == (13_700, 0, 12_100, 1_600, 0, 100)


def test_openhands_defaults_condense_120_events_to_60() -> None:
    """Defaults (max_size 120, keep_first 4): request 60 holds 121 events and condenses.
    Tail 120 // 2 - 4 - 1 = 55 events; cuts: head 4 -> 5 (group start), tail 121 - 55 = 66
    -> 67. Kept: u T1 R1 T2 R2, the summary, T34..R60 (54 events): 60 events. The summary
    is drawn from the calibration (seeded), so it is read from the call's output."""
    trace = session([1_000] * 60)
    frame, state = run(trace, "openhands")
    assert compactions(frame) == [(60, "condense")]
    summary = row(frame, 60, "compaction")["output"]
    # Forgotten: T3..R33, 31 rounds of 1,100 tokens; the condenser adds its 500 prompt.
    assert usage(row(frame, 60, "compaction")) == (34_600, 34_600, 0, 0, 0, summary)
    assert 0 < summary <= 20_000
    assert len(state.conv.items) == 60
    # After: 10,000 + u 1,000 + 2 rounds 2,200 + summary + 27 rounds 29,700.
    assert contexts(frame)[60] == 42_900 + summary
    # Deterministic: the same seed draws the same summary.
    again, _ = run(trace, "openhands")
    assert again.equals(frame)
    # The SDK's 240 events: no condensation in this session.
    sdk, _ = run(trace, "openhands", {"max_size": 240})
    assert compactions(sdk) == []


def test_openhands_rejects_a_head_that_leaves_no_room() -> None:
    # The condenser's own check: max_size // 2 - keep_first - 1 must be > 0.
    with pytest.raises(PolicyError, match="keep_first"):
        policy.build("openhands", {"max_size": 10, "keep_first": 4})
    policy.build("openhands", {"max_size": 10, "keep_first": 3})


# -- llm-summary --------------------------------------------------------------------------


def test_llm_summary_summarises_n_turns_once_n_plus_m_are_pending() -> None:
    """N = 3, M = 2. Turns are the rounds after the task u; request k has k of them. At
    k = 5 (5 = N + M pending) the oldest 3 are summarised and the newest 2 stay."""
    frame, state = run(
        session([1_000] * 7),
        "llm-summary",
        {"summarize_turns": 3, "keep_last_turns": 2, "summary_tokens": 400},
    )
    assert compactions(frame) == [(5, "summarize")]
    # First summary: the problem statement u (1,000) and T1..R3 (3,300) plus the 500-token
    # prompt, a query of its own (no shared prefix, no cache).
    assert usage(row(frame, 5, "compaction")) == (4_800, 4_800, 0, 0, 0, 400)
    # After: 10,000 + u 1,000 + checkpoint 400 + T4..R5 2,200 = 13,600. Pending turns after
    # the checkpoint: 2 at k = 5, 3 at 6, 4 at 7 (below N + M).
    assert contexts(frame) == [11_000, 12_100, 13_200, 14_300, 15_400, 13_600, 14_700, 15_800]
    # [u, S, T4 R4 .. T7 R7]: the task stays, the summarised turns are gone.
    items = state.conv.items
    assert items[0] == 0 and items[1] < 0 and items[2:] == list(range(7, 15))
    assert state.summaries == 1


def test_llm_summary_is_rolling() -> None:
    """Second summary at k = 8: pending T4..R8 (5 turns); its input is the previous
    checkpoint (400), not the task, and T4..R6 (3,300): 3,700 + 500 prompt."""
    frame, state = run(
        session([1_000] * 9),
        "llm-summary",
        {"summarize_turns": 3, "keep_last_turns": 2, "summary_tokens": 400},
    )
    assert compactions(frame) == [(5, "summarize"), (8, "summarize")]
    assert usage(row(frame, 8, "compaction")) == (4_200, 4_200, 0, 0, 0, 400)
    # Only the newest checkpoint stays, right after the task: [u, S2, T7 R7 .. T9 R9].
    items = state.conv.items
    assert items[0] == 0 and items[1] < 0 and items[2:] == list(range(13, 19))
    assert contexts(frame)[8:] == [13_600, 14_700]
    assert state.summaries == 2
    # The request after a summary reads prefix + u from cache and writes from the
    # checkpoint on: 400 + 2,200.
    assert usage(row(frame, 8)) == (13_600, 0, 11_000, 2_600, 0, 100)


def test_llm_summary_defaults_n21_m10() -> None:
    """N = 21, M = 10: the first summary at request 31 (31 pending turns) takes u and 21
    rounds: 1,000 + 23,100 + 500 prompt = 24,600; after: 10,000 + 1,000 + summary + 10
    rounds (11,000)."""
    frame, _ = run(session([1_000] * 40), "llm-summary", {"summary_tokens": 2_000})
    assert compactions(frame) == [(31, "summarize")]
    assert usage(row(frame, 31, "compaction")) == (24_600, 24_600, 0, 0, 0, 2_000)
    assert contexts(frame)[30:33] == [44_000, 24_000, 25_100]


# -- sliding-window -----------------------------------------------------------------------


def test_sliding_window_drops_oldest_groups_down_to_the_target() -> None:
    """Rounds of 10,100: request k holds 11,000 + 10,100 k. Trigger 0.9 x 200,000 =
    180,000 is first exceeded at k = 17 (182,700). Dropping rounds from R1 on (u stays):
    182,700 - 7 x 10,100 = 112,000 <= 0.6 x 200,000 = 120,000 (6 would leave 122,100).
    The view then grows again and is cut at k = 24 the same way. No LLM call."""
    frame, state = run(session([10_000] * 25), "sliding-window")
    assert compactions(frame) == []
    ctx = contexts(frame)
    assert ctx[:17] == [11_000 + 10_100 * k for k in range(17)]
    assert ctx[17:] == [112_000, 122_100, 132_200, 142_300, 152_400, 162_500, 172_600, 112_000,
                        122_100]  # fmt: skip
    assert (state.truncations, state.dropped_groups) == (2, 14)
    # Kept: u (block 0) and rounds 15..25 (blocks 29..50).
    assert state.conv.items == [0, *range(29, 51)]
    # The cut breaks the cache right after u; u is more than 20 blocks back from the new
    # end, so only the system + tools prefix is read: 10,000 read, 102,000 written.
    assert usage(row(frame, 17)) == (112_000, 0, 10_000, 102_000, 0, 100)
    assert not frame["overflow"].any()


def test_sliding_window_without_keep_first_drops_the_task_too() -> None:
    """keep_first off: at k = 17 u goes first: 182,700 - 1,000 - 7 x 10,100 = 111,000
    (u and R1..R6 leave 121,100, still above 120,000)."""
    frame, state = run(session([10_000] * 17), "sliding-window", {"keep_first": False})
    assert contexts(frame)[17] == 111_000
    assert state.conv.items[0] == 2 * 8 - 1  # T8: the oldest round left


# -- cline --------------------------------------------------------------------------------


def test_cline_limit_table() -> None:
    assert max_allowed(200_000, None) == 160_000
    assert max_allowed(128_000, None) == 98_000
    assert max_allowed(64_000, None) == 37_000
    assert max_allowed(1_000_000, None) == 960_000  # max(960,000, 800,000)
    assert max_allowed(100_000, None) == 80_000  # max(60,000, 80,000)
    assert max_allowed(200_000, 50_000) == 150_000


@pytest.mark.parametrize(("big", "truncates"), [(144_400, True), (144_399, False)])
def test_cline_triggers_on_the_previous_usage_at_window_minus_40k(
    big: int, truncates: bool
) -> None:
    """Rounds 1-4 of 1,100, round 5 of 100 + `big`: request 5 holds 15,500 + big and
    answers with 100 tokens, so request 6 sees a previous usage of 15,600 + big: 160,000
    reaches the limit (200,000 - 40,000). Request 6 (adding 1,100) then drops half of the
    5 groups after the first pair (u, T1 R1): R2, R3, 2,200 tokens."""
    frame, state = run(session([1_000] * 4 + [big, 1_000]), "cline")
    before = 15_500 + big + 1_100
    assert contexts(frame)[6] == (before - 2_200 if truncates else before)
    assert state.truncations == ([(6, 2, 0.5)] if truncates else [])
    assert compactions(frame) == []


def test_cline_keeps_the_first_pair_and_truncates_half_then_three_quarters() -> None:
    """Limit 100,000 (reserve_tokens 100,000). Rounds of 10,100: request 9 holds 101,900,
    so request 10 (112,000) truncates: 9 groups after the pair u, T1 R1; half = 4 (R2..R5,
    40,400) leaves 71,600 < limit. Round 11 is huge (120,100): 191,700. Request 12 (+1,100
    = 192,800): 7 groups after the pair; half (3: 30,300) would leave 162,500 >= limit, so
    three quarters: 5 groups (R6..R10, 50,500) leave 142,300. Request 13 (+1,100): still
    over, half of 3 groups = 1 (R11, 120,100): 23,300."""
    results = [10_000] * 10 + [120_000, 1_000, 1_000]
    frame, state = run(session(results), "cline", {"reserve_tokens": 100_000})
    assert state.truncations == [(10, 4, 0.5), (12, 5, 0.75), (13, 1, 0.5)]
    ctx = contexts(frame)
    assert ctx[:10] == [11_000 + 10_100 * k for k in range(10)]
    assert ctx[10:] == [71_600, 191_700, 142_300, 23_300]
    # The first user/assistant pair (u, T1, R1) is always kept.
    assert state.conv.items == [0, 1, 2, 23, 24, 25, 26]
    # Everything after the pair changed: the cache is written again after the prefix (the
    # pair's own entry, written at request 1, has expired).
    assert usage(row(frame, 10)) == (71_600, 0, 10_000, 61_600, 0, 100)
    assert compactions(frame) == [] and not frame["overflow"].any()


@pytest.mark.parametrize(
    ("rule", "truncations", "after"),
    [
        # fit: half (10 of 21 groups, 11,000) would leave 163,200 >= 160,000: 15 groups.
        ("fit", [(22, 15, 0.75)], [157_700, 158_800]),
        # halved (Cline's own test): 173,200 / 2 is not over 160,000, so half, twice.
        ("halved", [(22, 10, 0.5), (23, 6, 0.5)], [163_200, 157_700]),
    ],
)
def test_cline_quarter_rules(
    rule: str, truncations: list[tuple[int, int, float]], after: list[int]
) -> None:
    """20 rounds of 1,100 (33,000 at request 20), then a 140,100-token round: 173,100 at
    request 21, over the 160,000 limit; requests 22 and 23 add 1,100 each."""
    frame, state = run(
        session([1_000] * 20 + [140_000, 1_000, 1_000]), "cline", {"quarter_rule": rule}
    )
    assert state.truncations == truncations
    assert contexts(frame)[21:] == [173_100, *after]


# -- every real Claude Code session ---------------------------------------------------------


@pytest.fixture(scope="module")
def claude_traces(shared_corpus: Callable[[str], Named]) -> list[tuple[str, Trace]]:
    return shared_corpus("claude-code")


@pytest.mark.parametrize("name", PEERS)
def test_every_shared_claude_code_session(
    name: str, claude_traces: list[tuple[str, Trace]]
) -> None:
    frame = replay(claude_traces, policy.build(name))
    recorded = sum(s.n_requests for _, t in claude_traces for s in t.sessions)
    assert frame.filter(pl.col("kind") == "request").height == recorded
    counts = [c for c, dtype in frame.schema.items() if dtype.is_numeric()]
    for column in counts:
        assert (frame[column].drop_nulls() >= 0).all(), column  # nulls: no stated limit
    assert frame["cost_total"].null_count() == 0
    stages = set(frame.filter(pl.col("kind") == "compaction")["stage"].to_list())
    assert stages <= {"openhands": {"condense"}, "llm-summary": {"summarize"}}.get(name, set())
