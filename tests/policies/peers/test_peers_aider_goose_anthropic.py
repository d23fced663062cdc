"""The aider, goose, Anthropic context-editing and Anthropic server-compaction policies on
small hand-built sessions, then over every shared Claude Code session.

Every expectation is a literal computed by hand (derivation in the comments). Conventions
of the hand-built sessions (class `Script`):

* the system + tools prefix is set explicitly (10,000 tokens) and there is no recorded
  usage, so block tokens are exactly the numbers written here, each request's cache TTL
  is 5 minutes and each request's recorded output is the tokens of its response blocks;
* the prefix is warm from the start (other sessions share it), so every request reads it;
* a "round" is the response to the previous request (a 100-token tool_use) and its tool
  result, both entering at the next request; requests are one minute apart.

Model: Sonnet 4.5 (200,000-token window, 1,024-token cache minimum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import pytest

from policies.peers.aider import history_budget
from policies.peers.goose import middle_out
from simulator import policy
from simulator.model import Trace
from simulator.policy import PolicyError
from simulator.replay import replay
from tests.support import Named
from tests.support.scripted import Script, compactions, contexts, row
from tests.support.scripted import usage as row_usage

PEERS = ["aider", "goose", "anthropic-context-editing", "anthropic-server-compaction"]


def uniform(n: int, result: int, first: int = 1_000) -> Script:
    """Request 0: a human message of `first` tokens; requests 1..n: one round each
    (100 + `result` tokens)."""
    s = Script()
    s.user(first)
    s.request()
    s.rounds(n, result)
    return s


def run(script: Script, name: str, params: dict[str, Any] | None = None) -> pl.DataFrame:
    return replay([("t", script.trace())], policy.build(name, params or {}))


def usage(frame: pl.DataFrame, request: int, kind: str = "request") -> tuple[int, ...]:
    """(context, uncached, cache read, cache write 5m, output) of one row."""
    return row_usage(row(frame, request, kind))


# -- aider --------------------------------------------------------------------------------


def test_aider_history_budget() -> None:
    # min(max(window / 16, 1,024), 8,192)
    assert history_budget(200_000) == 8_192  # min(max(12,500, 1,024), 8,192)
    assert history_budget(32_768) == 2_048  # min(max(2,048, 1,024), 8,192)
    assert history_budget(8_000) == 1_024  # min(max(500, 1,024), 8,192)
    assert history_budget(1_000_000) == 8_192


def test_aider_summarises_the_head_and_keeps_the_newest_group() -> None:
    # Budget 8,192 on a 200k window; the tail stays under 8,192 // 2 = 4,096. History (the
    # conversation, the 10,000-token prefix excluded) at request k: 1,000 + 2,100 k.
    # Request 4: 9,400 > 8,192. Groups from the newest: 2,100 (kept: the newest always),
    # + 2,100 = 4,200 is not < 4,096: the tail is round 4. The head (the user message and
    # rounds 1-3, 7,300 tokens) becomes the 1,500-token summary behind aider's 11-token
    # prefix: 10,000 + 1,511 + 2,100 = 13,611.
    # Request 5: history 1,511 + rounds 4-5 (4,200) = 5,711; request 6: 7,811: no summary.
    # Request 7: 9,911 > 8,192: the tail is round 7 again, the head the summary and rounds
    # 4-6 (7,811 tokens): 10,000 + 1,511 + 2,100 = 13,611 again.
    frame = run(uniform(7, 2_000), "aider", {"summary_tokens": 1_500})
    assert compactions(frame) == [(4, "summarize"), (7, "summarize")]
    assert contexts(frame) == [11_000, 13_100, 15_200, 17_300, 13_611, 15_711, 17_811, 13_611]
    # The summary request: the head as text (7,300) and aider's 175-token summarize
    # prompt, without the agent's prefix, uncached (no cache_control); output: the summary.
    assert usage(frame, 4, "compaction") == (7_475, 7_475, 0, 0, 1_500)
    assert usage(frame, 7, "compaction") == (7_986, 7_986, 0, 0, 1_500)
    # Aider's default sends no cache_control at all: every request is uncached.
    assert usage(frame, 5) == (15_711, 15_711, 0, 0, 100)


def test_aider_keeps_a_tail_of_half_the_budget() -> None:
    # Rounds of 1,000 (100 + 900): history at request k is 1,000 + 1,000 k; request 8:
    # 9,000 > 8,192. Tail: 1,000, 2,000, 3,000, 4,000 (all < 4,096), 5,000 is not: four
    # rounds (5-8) stay. The head, the user message and rounds 1-4 (5,000 tokens), becomes
    # 1,511 tokens: 10,000 + 1,511 + 4,000 = 15,511.
    frame = run(uniform(8, 900), "aider", {"summary_tokens": 1_500})
    assert compactions(frame) == [(8, "summarize")]
    assert contexts(frame)[8] == 15_511
    assert usage(frame, 8, "compaction")[0] == 5_000 + 175


def test_aider_with_cache_prompts_marks_the_prefix_and_the_last_item() -> None:
    # --cache-prompts: request 5 reads what request 4 wrote (its whole view, 13,611) and
    # writes round 5 (2,100).
    frame = run(uniform(7, 2_000), "aider", {"summary_tokens": 1_500, "cache.prompts": True})
    assert usage(frame, 5) == (15_711, 0, 13_611, 2_100, 100)


def test_aider_a_last_group_over_half_the_budget_is_kept_alone() -> None:
    # Request 3 adds a 6,100-token round: history 1,000 + 2 x 2,100 + 6,100 = 11,300. The
    # newest round alone is over 4,096: it is the tail, everything before is summarised
    # (5,200 tokens -> 1,511): 10,000 + 1,511 + 6,100 = 17,611.
    s = uniform(2, 2_000)
    s.rounds(1, 6_000)
    frame = run(s, "aider", {"summary_tokens": 1_500})
    assert compactions(frame) == [(3, "summarize")]
    assert contexts(frame) == [11_000, 13_100, 15_200, 17_611]


# -- goose --------------------------------------------------------------------------------


def goose_session(last_result: int = 19_900) -> Script:
    """Request 0: the human's 1,000 tokens; requests 1-7: rounds of 20,000; request 8: a
    round with a `last_result` result; request 9: the answer to request 8 (100 tokens) and
    the human's next 500-token message."""
    s = uniform(7, 19_900)
    s.rounds(1, last_result)
    s.say(100)
    s.user(500)
    s.request()
    return s


def test_goose_compacts_at_80_percent_when_the_user_writes() -> None:
    # Contexts: 11,000 + 20,000 k for k = 0..8 (request 8: 171,000). Goose checks when a
    # user message arrives: request 8 is mid tool loop, so no check there although it is
    # over 160,000. Request 9 (the human writes): the last usage is request 8's input +
    # output = 171,000 + 100; 171,100 / 200,000 = 0.856 > 0.8: compact.
    # The summary request holds the conversation as text, no prefix: 1,000 + 8 x 20,000 +
    # 100 + 500 = 161,600, plus the 500-token prompt. Then the view is the prefix, the
    # summary (3,000), the 44-token continuation and the latest user message (500):
    # 13,544.
    frame = run(goose_session(), "goose", {"summary_tokens": 3_000})
    assert compactions(frame) == [(9, "compact")]
    assert contexts(frame)[7:] == [151_000, 171_000, 13_544]
    compaction = usage(frame, 9, "compaction")
    assert (compaction[0], compaction[4]) == (162_100, 3_000)
    # Goose marks the summary request too: nothing of it is cached yet, all of it written
    # but the prompt after the marker.
    assert compaction[1:4] == (500, 0, 161_600)
    # The request itself reads the warm prefix and writes the rest.
    assert usage(frame, 9)[:4] == (13_544, 0, 10_000, 3_544)


def test_goose_recovers_from_a_context_length_error_mid_loop() -> None:
    # Request 8's round has a 49,900-token result: 151,000 + 50,000 = 201,000 > 200,000,
    # refused by the API: goose compacts and retries. The summary input (191,000 + 500)
    # fits. After: prefix, summary, continuation and the newest human message (request
    # 0's, 1,000 tokens): 10,000 + 3,000 + 44 + 1,000 = 14,044; no overflow.
    frame = run(goose_session(49_900), "goose", {"summary_tokens": 3_000})
    assert compactions(frame)[0] == (8, "recover")
    assert contexts(frame)[8] == 14_044
    assert not frame.filter(pl.col("kind") == "request")["overflow"].any()


def test_goose_middle_out_removal_order() -> None:
    # goose's filter_tool_responses: max(1, n * share) responses, before and at the middle.
    assert middle_out(10, 0.1) == [4]
    assert middle_out(10, 0.2) == [4, 5]
    assert middle_out(10, 0.5) == [4, 5, 3, 6, 2]
    assert sorted(middle_out(10, 1.0)) == list(range(10))
    assert middle_out(0, 0.5) == []


def test_goose_marks_the_last_two_user_messages() -> None:
    # Request 2 marks the last two user messages: round 1's result and round 2's result.
    # Round 1's result ended request 1's view, which request 1 wrote: request 2 reads it
    # (10,000 + 1,000 + 2,100) and writes round 2 (2,100).
    frame = run(uniform(2, 2_000), "goose")
    assert usage(frame, 2)[:4] == (15_200, 0, 13_100, 2_100)


# -- Anthropic context editing ------------------------------------------------------------


def editing_session() -> Script:
    """Request 0: 1,000 tokens; rounds of 20,100 (a 20,000-token result): request k holds
    11,000 + 20,100 k: request 4 91,400, request 5 111,500, request 6 131,600."""
    return uniform(6, 20_000)


def test_context_editing_clears_all_but_the_3_newest_results() -> None:
    # Request 5: 111,500 > 100,000. Results 1-5; the newest 3 (3-5) stay, 1 and 2 become
    # 10-token placeholders: 111,500 - 2 x 19,990 = 71,520.
    # Request 6: 131,600; results 1-3 cleared: 131,600 - 3 x 19,990 = 71,630.
    frame = run(editing_session(), "anthropic-context-editing")
    assert compactions(frame) == []
    assert contexts(frame) == [11_000, 31_100, 51_200, 71_300, 91_400, 71_520, 71_630]


def test_context_editing_invalidates_the_cache_from_the_first_cleared_block() -> None:
    # Request 5 clears result 1, which follows the user message and round 1's tool_use.
    # The cached entries are the prefix (warm) and each earlier request's end. The only
    # one ending before result 1 is request 0's (prefix + user message, 11,000 tokens):
    # written at 0:00, read by request 1 at 0:01, alive until 0:06. Request 5 (0:05) reads
    # it and writes everything after it: 71,520 - 11,000 = 60,520.
    frame = run(editing_session(), "anthropic-context-editing")
    assert usage(frame, 5)[:4] == (71_520, 0, 11_000, 60_520)
    # Request 6 now also clears result 3, which request 5 sent in full: request 5's entry
    # no longer matches, and again only request 0's entry (refreshed by request 5) ends
    # before the change: read 11,000, write 71,630 - 11,000 = 60,630.
    assert usage(frame, 6)[:4] == (71_630, 0, 11_000, 60_630)
    # Before the trigger the cache works as usual: request 4 reads request 3's view.
    assert usage(frame, 4)[:4] == (91_400, 0, 71_300, 20_100)


def test_context_editing_clear_at_least_gates_the_edit() -> None:
    # clear_at_least 50,000: at request 5 clearing results 1-2 frees 39,980 < 50,000: no
    # edit, the full 111,500 is sent. At request 6 results 1-3 free 59,970: cleared.
    frame = run(editing_session(), "anthropic-context-editing", {"clear_at_least_tokens": 50_000})
    assert contexts(frame)[4:] == [91_400, 111_500, 71_630]


def test_context_editing_excluded_tools_and_tool_inputs() -> None:
    # Round 1 is a Read; excluding Read spares its result: request 5 clears result 2 only:
    # 111,500 - 19,990 = 91,510.
    s = Script()
    s.user(1_000)
    s.request()
    s.rounds(1, 20_000, "Read")
    s.rounds(5, 20_000)
    frame = run(s, "anthropic-context-editing", {"exclude_tools": ["Read"]})
    assert contexts(frame)[5] == 91_510
    # clear_tool_inputs: the two cleared results' 100-token tool_uses become placeholders
    # too: 71,520 - 2 x 90 = 71,340.
    frame = run(editing_session(), "anthropic-context-editing", {"clear_tool_inputs": True})
    assert contexts(frame)[5] == 71_340


def test_context_editing_keep_and_trigger_are_parameters() -> None:
    # keep 1, trigger 80,000: request 4 (91,400) clears results 1-3: 91,400 - 3 x 19,990.
    frame = run(
        editing_session(),
        "anthropic-context-editing",
        {"keep_tool_uses": 1, "trigger_tokens": 80_000},
    )
    assert contexts(frame)[3:5] == [71_300, 31_430]


# -- Anthropic server compaction ----------------------------------------------------------


def test_server_compaction_at_150k() -> None:
    # Rounds of 20,000 (100 + 19,900): request k holds 11,000 + 20,000 k; request 7:
    # 151,000 > 150,000. The server's summarisation step is its own row: the request as
    # sent (with its marker on its last block) plus the 150-token instructions. It reads
    # request 6's view (131,000), writes up to the marker (20,000); output: the summary.
    frame = run(uniform(8, 19_900), "anthropic-server-compaction", {"summary_tokens": 3_000})
    assert compactions(frame) == [(7, "server-compact")]
    assert usage(frame, 7, "compaction") == (151_150, 150, 131_000, 20_000, 3_000)
    # The response step processes the prefix and the compaction block: 13,000. The
    # client's marker was on a dropped block, so only the prefix is read and nothing is
    # written; request 8 (block, round 8) writes both.
    assert usage(frame, 7)[:4] == (13_000, 3_000, 10_000, 0)
    assert usage(frame, 8)[:4] == (33_000, 0, 10_000, 23_000)
    assert contexts(frame)[6:] == [131_000, 13_000, 33_000]


def test_server_compaction_trigger_minimum() -> None:
    with pytest.raises(PolicyError, match="50,000"):
        policy.build("anthropic-server-compaction", {"trigger_tokens": 40_000})
    policy.build("anthropic-server-compaction", {"trigger_tokens": 50_000})


# -- every policy ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PEERS)
def test_replays_are_deterministic_with_drawn_summaries(name: str) -> None:
    script = goose_session()
    first = run(script, name)
    assert first.equals(run(script, name))


@pytest.fixture(scope="module")
def claude_code_traces(shared_corpus: Callable[[str], Named]) -> list[tuple[str, Trace]]:
    return shared_corpus("claude-code")


@pytest.mark.parametrize("name", PEERS)
def test_every_shared_claude_code_session(
    name: str, claude_code_traces: list[tuple[str, Trace]]
) -> None:
    frame = replay(claude_code_traces, policy.build(name))
    sessions = sum(len(t.sessions) for _, t in claude_code_traces)
    requests = frame.filter(pl.col("kind") == "request")
    assert requests.height == sum(s.n_requests for _, t in claude_code_traces for s in t.sessions)
    assert requests.select("trace", "session").n_unique() <= sessions
    for column, dtype in frame.schema.items():
        if dtype.is_numeric():
            assert (frame[column].drop_nulls() >= 0).all(), f"{name}: negative {column}"
