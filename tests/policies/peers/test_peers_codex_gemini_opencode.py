"""Codex CLI, Gemini CLI and opencode as policies (policies/peers/codex.py, gemini_cli.py,
opencode.py), on small hand-built sessions and on the shared Claude Code recordings.

Every expectation is a literal computed by hand (derivation in the comments). The sessions
(class `Script`) follow one convention so that the numbers stay simple:

* the system + tools prefix is 10,000 tokens, set explicitly: no anchoring, no recorded
  usage, so block tokens are exactly the numbers written here and each request's cache TTL
  is 5 minutes; requests are one minute apart;
* every block has 4 characters per token, so the harness estimate (last usage + output +
  length/4 of what is new) equals the context exactly, and each recorded output is the
  tokens of the response blocks;
* a "round" is the response to the previous request (a 100-token tool_use) and its tool
  result, both entering at the next request; user messages are human-written (Flag.HUMAN).

Model: Sonnet 4.5 (200,000-token window, max output 64,000, 1,024-token cache minimum).
Summaries are fixed with `summary_tokens` = 3,000 unless a test is about the drawn size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import pytest

from policies.conversation import CLEARED_TOKENS
from policies.peers.codex import Codex, preset_for
from simulator import policy
from simulator.model import CompactionEvent, Flag, Kind, Role
from simulator.replay import ReplayOptions, replay
from simulator.view import View
from tests.support import Named
from tests.support.scripted import Script, compactions, contexts, row, usage

PREFIX = 10_000
SUMMARY = 3_000
POLICIES = ["codex", "gemini-cli", "opencode"]


def read_script() -> Script:
    """A Script whose rounds read files unless they name their tool."""
    return Script(PREFIX, tool="Read")


def uniform(n: int, tokens: int = 10_000) -> Script:
    """Request 0: a 1,000-token user message; requests 1..n: one round each (100 +
    `tokens`). With the defaults, request k holds 11,000 + 10,100 k tokens."""
    s = read_script()
    s.user(1_000)
    s.request()
    s.rounds(n, tokens)
    return s


def run(script: Script, name: str, params: dict[str, Any] | None = None) -> pl.DataFrame:
    """Replay `script` under the policy `name`; "codex" is the documented rules every
    version's preset overrides (`Codex`, as the presets' own tests below use them), not the
    registered `codex`, which matches each session to its version's preset."""
    pol = Codex(**(params or {})) if name == "codex" else policy.build(name, params or {})
    return replay([("t", script.trace())], pol)


# -- registration and parameters ------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_registered_with_cache_and_prefix_defaults(name: str) -> None:
    pol = policy.build(name)
    assert pol.name == name
    assert pol.params["cache.ttl"] == "recorded"
    assert pol.params["prefix_resets"] is True
    assert pol.params["summary_tokens"] is None  # drawn from the calibration by default


def test_documented_defaults() -> None:
    codex = policy.build("codex").params
    assert codex["model_auto_compact_token_limit"] is None
    assert (codex["window_fraction"], codex["user_message_budget_tokens"]) == (0.9, 20_000)
    assert codex["cache.message_marks"] == 1
    gemini = policy.build("gemini-cli").params
    assert (gemini["compression_threshold"], gemini["preserve_fraction"]) == (0.5, 0.3)
    assert gemini["tool_output_budget_tokens"] == 50_000
    assert (gemini["truncate_lines"], gemini["tokens_per_line"]) == (30, 12)
    opencode = policy.build("opencode").params
    assert opencode["compaction_buffer_tokens"] == 20_000
    assert (opencode["prune.protect_tokens"], opencode["prune.minimum_tokens"]) == (40_000, 20_000)
    assert opencode["prune.protect_turns"] == 2
    assert opencode["cache.message_marks"] == 2


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("gemini-cli", {"split_at": "middle"}),
        ("gemini-cli", {"preserve_fraction": 1.0}),
        ("opencode", {"prune.at": "never"}),
    ],
)
def test_bad_parameter_values_are_refused(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        run(uniform(1), name, params)


# -- codex ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "first"),
    [
        # 0.9 x 200,000 = 180,000: 11,000 + 10,100 k >= 180,000 from k = 17 (182,700)
        ({}, 17),
        # min(50,000, 180,000): from k = 4 (51,400; k = 3 holds 41,300)
        ({"model_auto_compact_token_limit": 50_000}, 4),
        # a limit above 0.9 x window is capped by it
        ({"model_auto_compact_token_limit": 190_000}, 17),
    ],
)
def test_codex_compacts_at_min_of_its_limit_and_90_percent(
    params: dict[str, Any], first: int
) -> None:
    frame = run(uniform(18), "codex", {"summary_tokens": SUMMARY, **params})
    assert compactions(frame)[0] == (first, "compact")


def test_codex_keeps_the_initial_context_and_a_handoff_summary() -> None:
    """Limit 50,000: compaction at request 4 (51,400). The request sends prefix + all 41,400
    tokens of history + the 120-token prompt = 51,520; its cache marker sits on the last
    history item, so it reads request 3's 41,300 and writes res4's 10,100. After: prefix +
    the first user message (1,000) + summary with its 80-token prefix = 14,080."""
    frame = run(
        uniform(5), "codex", {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 50_000}
    )
    assert compactions(frame) == [(4, "compact")]
    assert usage(row(frame, 4, "compaction", "compact")) == (51_520, 120, 41_300, 10_100, SUMMARY)
    # request 5 adds a round: 14,080 + 10,100
    assert contexts(frame) == [11_000, 21_100, 31_200, 41_300, 14_080, 24_180]
    # the prefix and the first user message are still cached: only the summary is new
    assert usage(row(frame, 4))[1:4] == (0, 11_000, 3_080)


def _turns(users: list[int]) -> Script:
    """Request 0: a 1,000-token first message. Then one turn per entry of `users`: a human
    message of that size (with the previous turn's 100-token closing text) and one
    5,000-token round."""
    s = read_script()
    s.user(1_000)
    s.request()
    for tokens in users:
        s.say(100)
        s.user(tokens)
        s.request()
        s.tool(5_000)
        s.request()
    return s


@pytest.mark.parametrize(("truncate", "after"), [(True, 34_080), (False, 30_080)])
def test_codex_keeps_recent_user_messages_up_to_20000_tokens(truncate: bool, after: int) -> None:
    """Three turns of 8,000-token user messages: the history reaches 11,000 + 3 x (8,100 +
    5,100) = 50,600 at request 6, over the 50,000 limit. Newest first, H3 and H2 (16,000)
    fit the 20,000 budget; H1 crosses it and is kept cut to the 4,000 tokens left (or
    dropped). After: prefix + first message 1,000 + H1 4,000 + H2 + H3 16,000 + summary
    3,080 = 34,080 (30,080 without H1)."""
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 50_000,
        "truncate_crossing_message": truncate,
    }
    frame = run(_turns([8_000, 8_000, 8_000]), "codex", params)
    assert compactions(frame) == [(6, "compact")]
    assert contexts(frame)[6] == after


@pytest.mark.parametrize(("before_human", "after"), [(True, 17_080), (False, 15_080)])
def test_codex_initial_context_before_the_first_human_message(
    before_human: bool, after: int
) -> None:
    """A 2,000-token developer message and a 1,000-token environment message precede the
    1,000-token human one: request k holds 14,000 + 10,100 k, over 50,000 at k = 4. Kept
    with `initial_context_before_human`: prefix + 2,000 + 1,000 + the human message 1,000
    + summary 3,080 = 17,080; without it the initial context is the first user message
    (the environment one): 10,000 + 1,000 + 1,000 + 3,080 = 15,080."""
    s = read_script()
    s._add(Kind.TEXT, Role.SYSTEM, 2_000)
    s._add(Kind.TEXT, Role.USER, 1_000)
    s.user(1_000)
    s.request()
    s.rounds(5, 10_000)
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 50_000,
        "initial_context_before_human": before_human,
    }
    frame = run(s, "codex", params)
    assert compactions(frame) == [(4, "compact")]
    assert contexts(frame)[4] == after


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        # (limit, fraction, window share, initial before human, turn answers, call, late,
        # the count)
        ("0.42.0-alpha.3", (350_000, 1.0, 1.0, False, False, "billed", False, "estimate")),
        ("0.46.9", (350_000, 1.0, 1.0, False, False, "billed", False, "estimate")),
        ("0.47.0", (None, 0.935, 0.95, True, False, "billed", False, "estimate")),
        ("0.118.0", (None, 0.9, 0.95, True, True, "unrecorded", True, "codex")),
        ("0.126.0-alpha.8", (None, 0.9, 0.95, True, True, "unrecorded", True, "codex")),
        ("0.140.0", (None, 0.9, 0.95, True, False, "unrecorded", True, "codex")),
        ("0.142.5", (None, 0.9, 0.95, True, False, "unrecorded", True, "codex")),
        ("", (None, 0.9, 0.95, True, False, "unrecorded", True, "codex")),  # unknown: newest
    ],
)
def test_codex_presets_by_cli_version(version: str, expected: tuple[Any, ...]) -> None:
    params = Codex(**preset_for(version)).params
    assert (
        params["model_auto_compact_token_limit"],
        params["window_fraction"],
        params["window_share"],
        params["initial_context_before_human"],
        params["keep_turn_answers"],
        params["compaction_call"],
        params["initial_before_last_user"],
        params["trigger_count"],
    ) == expected
    assert params["logged_window"] and params["replay_manual"]
    codex_rs = expected[7] == "codex"  # 0.118+: the rules read from codex-rs
    assert params["kept_as_text"] == params["limit_of_raw_window"] == codex_rs
    assert params["apply_unlogged_edits"] == codex_rs
    assert params["restored_reasoning_uncounted"] == codex_rs
    assert not params["count_dropped_reasoning"]
    assert params["reasoning_estimate_factor"] == 1.2


def _logged(script: Script, windows: list[int]) -> Any:
    trace = script.trace()
    trace.sessions[0].context_windows = windows
    return trace


@pytest.mark.parametrize(
    ("client", "preset"),
    [
        ("codex 0.42.0", "codex@0.46"),
        ("codex 0.100.1", "codex@0.47"),
        ("codex 0.126.0-alpha.8", "codex@0.118"),
        ("codex 0.144.2", "codex@0.140"),
        ("codex", "codex@latest"),  # no version logged: the newest
        ("claude-code 2.1.88", "codex@latest"),  # another client's session: the newest
    ],
)
def test_codex_replays_each_session_under_its_versions_preset(client: str, preset: str) -> None:
    """`codex` (what `ctxsim run --policy codex` replays) is, session by session, the preset
    of the version the session was recorded with; a parameter given to it applies over
    that preset, and its spec names only what was given."""
    trace = _logged(uniform(18), [100_000])
    trace.sessions[0].client = client
    named = [("t", trace)]

    def rows(name: str, params: dict[str, Any]) -> pl.DataFrame:
        """The replay's rows but the columns that name the spec."""
        return replay(named, policy.build(name, params)).drop("policy", "params_hash")

    version = client.split()[-1] if client.startswith("codex ") else ""
    assert policy.build(preset).params == {**Codex.defaults, **preset_for(version)}
    given: dict[str, Any] = {"summary_tokens": SUMMARY}
    assert rows("codex", given).equals(rows(preset, given))
    assert compactions(replay(named, policy.build("codex", given)))  # a real comparison
    given = {"summary_tokens": SUMMARY, "window_fraction": 0.5}
    assert rows("codex", given).equals(rows(preset, given))
    assert policy.build("codex", given).spec().params == tuple(sorted(given.items()))


@pytest.mark.parametrize(
    ("windows", "params", "first"),
    [
        # the logged 100,000: 0.9 x 100,000 = 90,000, reached at k = 8 (91,800; k = 7 81,700)
        ([100_000], {}, 8),
        # the logged window ignored: the model's 200,000, 180,000 from k = 17
        ([100_000], {"logged_window": False}, 17),
        # none logged: half the model's window, 0.9 x 100,000 again
        ([], {"window_share": 0.5}, 8),
    ],
)
def test_codex_compacts_against_the_logged_window(
    windows: list[int], params: dict[str, Any], first: int
) -> None:
    trace = _logged(uniform(18), windows)
    frame = replay([("t", trace)], Codex(summary_tokens=SUMMARY, **params))
    assert compactions(frame)[0] == (first, "compact")


def _manual() -> Any:
    """Requests 0-2 as `uniform(2)` (11,000, 21,100, 31,200); the recording's /compact
    enters at request 3 (a 2,000-token unlogged-summary artifact and a 500-token summary
    block: summary 2,500), then a 5,100-token round."""
    s = uniform(2)
    s._add(Kind.INJECTED, Role.USER, 2_000, flags=Flag.ARTIFACT)
    summary = s._add(Kind.SUMMARY, Role.USER, 500, flags=Flag.ARTIFACT)
    s.tool(5_000)
    s.request()
    s.b.add_event(CompactionEvent(3, "manual", -1, summary, s.ts))
    return s.trace()


@pytest.mark.parametrize(
    ("params", "after", "made"),
    [
        # prefix + the human's first message 1,000 (no initial context: the next turn
        # sends it again) + the recorded summary 2,500 + the round logged after it 5,100
        ({}, 18_600, [(3, "manual")]),
        # not replayed: 31,200 + 5,100, and no limit reached
        ({"replay_manual": False}, 36_300, []),
    ],
)
def test_codex_replays_the_recorded_manual_compaction(
    params: dict[str, Any], after: int, made: list[tuple[int, str]]
) -> None:
    frame = replay([("t", _manual())], Codex(**params))
    assert compactions(frame) == made
    assert contexts(frame)[3] == after
    if made:
        # the call over the history before it, 10,000 + 21,200 + the 120-token prompt: it
        # reads request 2's 31,200 (its marker is on that last item: nothing to write) and
        # writes the summary, 2,500 less the 80-token prefix the history adds to it
        call = usage(row(frame, 3, "compaction", "manual"))
        assert call == (31_320, 120, 31_200, 0, 2_420)


def _recorded(trigger: str, rounds_after: int = 0) -> Any:
    """Request 0: the human's 1,000-token first message; 1: a 10,100-token round; 2: the
    human's 2,000-token second message; the recording compacts (`trigger`) at request 3
    (a 2,000-token unlogged-summary artifact and a 500-token summary block: summary 2,500),
    then a 5,100-token round; then `rounds_after` rounds of 10,100."""
    s = uniform(1)
    s.user(2_000)
    s.request()
    s._add(Kind.INJECTED, Role.USER, 2_000, flags=Flag.ARTIFACT)
    summary = s._add(Kind.SUMMARY, Role.USER, 500, flags=Flag.ARTIFACT)
    s.tool(5_000)
    s.request()
    s.b.add_event(CompactionEvent(3, trigger, -1, summary, s.ts))
    s.rounds(rounds_after, 10_000)
    return s.trace()


@pytest.mark.parametrize(
    ("params", "after", "made"),
    [
        # the prefix 10,000 + the initial context (the first message, 1,000) + the recent
        # user messages (the second, 2,000) + the recorded summary 2,500 + the round
        # logged after it 5,100
        ({"replay_recorded_before": 4}, 20_600, [(3, "as-recorded")]),
        # only the compactions before the request named are replayed
        ({"replay_recorded_before": 3}, 28_200, []),
        ({}, 28_200, []),  # 10,000 + 1,000 + 10,100 + 2,000 + 5,100: no limit reached
        # the preset's own trigger (28,200 over 25,000 at request 3) gives way to the
        # recording's compaction there
        (
            {"replay_recorded_before": 4, "model_auto_compact_token_limit": 25_000},
            20_600,
            [(3, "as-recorded")],
        ),
    ],
)
def test_codex_replays_the_recorded_automatic_compactions_before_a_request(
    params: dict[str, Any], after: int, made: list[tuple[int, str]]
) -> None:
    frame = replay([("t", _recorded("auto"))], Codex(summary_tokens=SUMMARY, **params))
    assert compactions(frame) == made
    assert contexts(frame)[3] == after


def test_codex_from_a_replayed_compaction_its_own_trigger_runs_on() -> None:
    """After the recorded compaction at 3 (20,600), rounds of 10,100 reach the 45,000 limit
    at request 6 (50,900); free-running, with no compaction at 3 (28,200), at request 5
    (48,400)."""
    trace = _recorded("auto", rounds_after=3)
    params = {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 45_000}
    one = replay([("t", trace)], Codex(replay_recorded_before=7, **params))
    assert compactions(one) == [(3, "as-recorded"), (6, "compact")]
    assert contexts(one)[3:6] == [20_600, 30_700, 40_800]
    free = replay([("t", trace)], Codex(**params))
    assert compactions(free) == [(5, "compact")]
    assert contexts(free)[3:5] == [28_200, 38_300]


def test_codex_unrecorded_compaction_call_is_a_row_priced_zero() -> None:
    """0.118+: the recording shows no usage for the compaction call."""
    frame = replay([("t", _manual())], Codex(compaction_call="unrecorded"))
    r = row(frame, 3, "compaction", "manual")
    assert (r["context_tokens"], *usage(r)) == (0, 0, 0, 0, 0, 0)
    assert contexts(frame)[3] == 18_600


@pytest.mark.parametrize("call", ["billed", "unrecorded"])
def test_the_request_after_a_codex_compaction_is_marked_whatever_its_call(call: str) -> None:
    """The loss columns see the compaction whether or not its call is billed (an
    unrecorded call sends no view: it summarized the view before it): limit 50,000,
    compaction at request 4, whose main call is the first after it and re-sends what it
    does not read from the cache; no other request is marked."""
    from simulator.loss import replay_with_loss

    params = {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 50_000}
    trace = uniform(6).trace()
    frame = replay_with_loss([("t", trace)], Codex(compaction_call=call, **params))
    assert compactions(frame) == [(4, "compact")]
    requests = frame.filter(pl.col("kind") == "request")
    marked = requests.filter(pl.col("after_compaction"))
    assert marked["request"].to_list() == [4]
    r = marked.row(0, named=True)
    assert r["resent_tokens"] == r["uncached_input"] + r["cache_write_5m"] + r["cache_write_1h"]
    assert r["resent_tokens"] > 0
    assert requests.filter(~pl.col("after_compaction"))["resent_tokens"].sum() == 0


@pytest.mark.parametrize(("answers", "after"), [(False, 20_080), (True, 20_380)])
def test_codex_0118_keeps_each_turns_answer(answers: bool, after: int) -> None:
    """Three turns of 2,000-token messages, each after the previous turn's 100-token
    closing text: 13,100, 18,200, ... 32,600 at request 6, over a 30,000 limit. Kept: the
    first message, H1-H3 (6,000) and the summary 3,080: 20,080; with each human
    message's preceding answer, the three closing texts too: 20,380."""
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 30_000,
        "keep_turn_answers": answers,
    }
    frame = run(_turns([2_000, 2_000, 2_000]), "codex", params)
    assert compactions(frame) == [(6, "compact")]
    assert contexts(frame)[6] == after


@pytest.mark.parametrize(("late", "order"), [(False, [0, 2, 6, 10]), (True, [2, 6, 0, 10])])
def test_codex_initial_context_before_the_last_user_message(late: bool, order: list[int]) -> None:
    """The compacted history of 0.118+ puts the initial context (block 0, the first
    message) just before the last user message (H3, block 10), after H1 and H2."""
    views: dict[tuple[int, str], View] = {}

    def observe(index: int, k: int, view: View, call: Any, u: Any) -> None:
        views[(k, call.stage)] = view.copy()

    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 30_000,
        "initial_before_last_user": late,
    }
    script = _turns([2_000, 2_000, 2_000])
    replay([("t", script.trace())], Codex(**params), observe=observe)
    ids = [i for i in views[(6, "")].ids if i >= 0]
    assert ids == order


def test_codex_kept_messages_as_text_are_sized_by_their_text() -> None:
    """`kept_as_text`: a kept message counts its raw (cl100k) size, not its anchored one."""
    script = _turns([2_000, 2_000, 2_000])
    trace = script.trace()
    raw = trace.sessions[0].blocks["tokens_raw"]
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 30_000,
        "kept_as_text": True,
    }
    frame = replay([("t", trace)], Codex(**params))
    # prefix + the initial message as it was (1,000) + H1-H3 at their text size + summary
    assert contexts(frame)[6] == 10_000 + 1_000 + int(raw[[2, 6, 10]].sum()) + 3_080


def test_codex_drops_the_oldest_groups_when_the_compaction_request_overflows() -> None:
    """Four 20,100 rounds reach 91,400; a 120,100 round makes request 5 hold 211,500, over
    180,000. The compaction request (211,620 with its prompt) is over the 200,000 window:
    dropping the first message (1,000) leaves 210,620, dropping round 1 (20,100) 190,520.
    After: prefix + first message + summary = 14,080."""
    s = uniform(4, 20_000)
    s.rounds(1, 120_000)
    frame = run(s, "codex", {"summary_tokens": SUMMARY})
    assert compactions(frame) == [(5, "compact")]
    assert row(frame, 5, "compaction", "compact")["context_tokens"] == 190_520
    assert contexts(frame)[5] == 14_080
    assert not frame["overflow"].any()


def test_codex_does_not_retry_a_compaction_that_did_not_help_in_the_same_turn() -> None:
    """Limit 50,000, first message 38,000. Request 1 (48,000 + 5,100 = 53,100) compacts to
    prefix + 38,000 + 3,080 = 51,080: still over. Request 2 (51,280) is over again but
    Codex does not compact twice in a turn; request 3 brings a new user message (a new
    turn) and compacts again, keeping it: 10,000 + 38,000 + 500 + 3,080 = 51,580."""
    s = read_script()
    s.user(38_000)
    s.request()
    s.tool(5_000)
    s.request()
    s.tool(100)
    s.request()
    s.say(100)
    s.user(500)
    s.request()
    frame = run(s, "codex", {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 50_000})
    assert compactions(frame) == [(1, "compact"), (3, "compact")]
    assert contexts(frame) == [48_000, 51_080, 51_280, 51_580]


# -- gemini-cli -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "first"),
    [
        # 0.5 x 200,000: 11,000 + 10,100 k >= 100,000 from k = 9 (101,900)
        ({}, 9),
        # older versions, 0.7: >= 140,000 from k = 13 (142,300)
        ({"compression_threshold": 0.7}, 13),
    ],
)
def test_gemini_compresses_at_its_threshold_of_the_window(
    params: dict[str, Any], first: int
) -> None:
    frame = run(uniform(14), "gemini-cli", {"summary_tokens": SUMMARY, **params})
    assert compactions(frame)[:2] == [(first, "compress"), (first, "verify")]


GEMINI_50K = {"summary_tokens": SUMMARY, "compression_threshold": 0.25}


def test_gemini_keeps_the_newest_30_percent_after_two_calls() -> None:
    """Threshold 0.25 x 200,000 = 50,000: compression at request 4 (51,400). The 41,400
    tokens of history split at the first round boundary with >= 70% (28,980) before it:
    31,300 before round 4. Both calls have their own system prompt and no tools:

    * compress: the 31,300-token head + 1,040 of prompt; nothing cached under that prefix
      (0 read), the head is written;
    * verify: the head again (read: 31,300), the 3,000-token draft (written) + 1,070.

    After: prefix + summary 3,000 + "Got it" 9 + round 4 (10,100) = 23,109."""
    frame = run(uniform(4), "gemini-cli", GEMINI_50K)
    assert compactions(frame) == [(4, "compress"), (4, "verify")]
    assert usage(row(frame, 4, "compaction", "compress")) == (32_340, 1_040, 0, 31_300, SUMMARY)
    assert usage(row(frame, 4, "compaction", "verify")) == (
        35_370,
        1_070,
        31_300,
        SUMMARY,
        SUMMARY,
    )
    assert contexts(frame) == [11_000, 21_100, 31_200, 41_300, 23_109]


def test_gemini_truncates_older_tool_outputs_beyond_the_50000_budget() -> None:
    """Four rounds of 20,000-token results: request 4 holds 91,400 >= 0.45 x 200,000.
    Newest first, results 4 and 3 (40,000) fit the 50,000 budget; result 2 would cross it
    and becomes a 30 x 12 = 360-token tail, so does result 1 (40,720 counted). The history
    is then 42,120 tokens; no round boundary has 70% (29,484) before it, so the last one
    does: the head is 22,020 tokens (first message, rounds 1-2 cut, round 3) and round 4
    is kept. After: prefix + 3,009 + 20,100 = 33,109."""
    frame = run(uniform(4, 20_000), "gemini-cli", {**GEMINI_50K, "compression_threshold": 0.45})
    assert row(frame, 4, "compaction", "compress")["context_tokens"] == 22_020 + 1_040
    assert row(frame, 4, "compaction", "verify")["context_tokens"] == 22_020 + SUMMARY + 1_070
    assert contexts(frame)[4] == 33_109


def test_gemini_truncation_leaves_outputs_within_the_budget_alone() -> None:
    """Same session, 50,000-token budget raised to 100,000: nothing is cut, the history is
    81,400 tokens and the boundary before round 4 has 61,300 >= 56,980 before it. After:
    prefix + 3,009 + 20,100 = 33,109 again, but the summary call saw the full head."""
    params = {**GEMINI_50K, "compression_threshold": 0.45, "tool_output_budget_tokens": 100_000}
    frame = run(uniform(4, 20_000), "gemini-cli", params)
    assert row(frame, 4, "compaction", "compress")["context_tokens"] == 61_300 + 1_040
    assert contexts(frame)[4] == 33_109


@pytest.mark.parametrize(
    ("split_at", "head", "after"), [("group", 35_500, 18_109), ("user", 27_500, 26_109)]
)
def test_gemini_split_at_a_group_or_a_user_message(split_at: str, head: int, after: int) -> None:
    """Three turns (each: the previous turn's 100-token closing text, an 8,000-token human
    message, one 5,000 round) hold 50,600 at request 6; the history is 40,600 and 70% of
    it is 28,420. Tokens before each boundary: turn 3's closing text 27,400, its message
    27,500, its round 35,500.

    * "group": the first boundary with >= 28,420 before it is turn 3's round: head 35,500,
      kept 5,100: 10,000 + 3,009 + 5,100 = 18,109;
    * "user" (Gemini CLI's own rule: only where a human message starts): no message start
      has 28,420 before it, so the last one is used: head 27,500, kept turn 3's message
      and round (13,100): 10,000 + 3,009 + 13,100 = 26,109."""
    params = {**GEMINI_50K, "split_at": split_at}
    frame = run(_turns([8_000, 8_000, 8_000]), "gemini-cli", params)
    assert compactions(frame) == [(6, "compress"), (6, "verify")]
    assert row(frame, 6, "compaction", "compress")["context_tokens"] == head + 1_040
    assert contexts(frame)[6] == after


# -- opencode -------------------------------------------------------------------------------

OPENCODE_50K = {"summary_tokens": SUMMARY, "input_limit_tokens": 70_000}


def test_opencode_usable_input_is_the_limit_minus_the_reserve() -> None:
    """Default: 200,000 - min(20,000, 64,000). The count is the last response's usage:
    request k sees 11,000 + 10,100 (k - 1) + 100 >= 180,000 from k = 18 (182,800), one
    request later than an estimate that counts the new round would."""
    frame = run(uniform(19), "opencode", {"summary_tokens": SUMMARY})
    assert compactions(frame)[0] == (18, "compact")
    # a model max output below 20,000 is the reserve: 200,000 - 8,000 = 192,000, reached
    # at k = 19 (192,900)
    frame = run(uniform(19), "opencode", {"summary_tokens": SUMMARY, "max_output_tokens": 8_000})
    assert compactions(frame)[0] == (19, "compact")


def test_opencode_compaction_sends_no_prefix_and_keeps_the_turn_in_progress() -> None:
    """Input limit 70,000: usable 50,000, reached by request 4's usage (41,300 + 100) at
    request 5. The compaction request is the 51,500 tokens of history + the 300-token
    prompt, without tools or system prompt: it reads nothing from the cache (the history
    is written under its own prefix). After: prefix + summary 3,000 + the turn in progress
    (round 5, 10,100) = 23,100."""
    frame = run(uniform(6), "opencode", OPENCODE_50K)
    assert compactions(frame) == [(5, "compact")]
    assert usage(row(frame, 5, "compaction", "compact")) == (51_800, 300, 0, 51_500, SUMMARY)
    assert contexts(frame) == [11_000, 21_100, 31_200, 41_300, 51_400, 23_100, 33_200]
    assert min(contexts(frame)) >= PREFIX


def test_opencode_never_compacts_before_the_first_response() -> None:
    """A 60,000-token first message puts request 0 at 70,000, over the usable 50,000; but
    opencode counts a finished response's usage, so it compacts at request 1 (70,000 +
    100 of output), keeping the turn in progress (round 1, 100 + 100): 10,000 + 3,000 +
    200 = 13,200."""
    s = read_script()
    s.user(60_000)
    s.request()
    s.rounds(1, 100)
    frame = run(s, "opencode", OPENCODE_50K)
    assert compactions(frame) == [(1, "compact")]
    assert contexts(frame) == [70_000, 13_200]


def test_only_opencodes_compaction_misses_the_cache() -> None:
    """The same session under Codex (limit 50,000, compaction at request 4): its
    compaction request keeps the prefix and reads the conversation's cache."""
    codex = run(
        uniform(6), "codex", {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 50_000}
    )
    assert row(codex, 4, "compaction", "compact")["cache_read"] == 41_300
    opencode = run(uniform(6), "opencode", OPENCODE_50K)
    assert row(opencode, 5, "compaction", "compact")["cache_read"] == 0


def _prune_script(oldest: int, oldest_tool: str | None = None) -> Script:
    """Turn 1: results of `oldest` (of `oldest_tool`, by default the script's) and 40,000
    tokens; turn 2: a 30,000 result; turn 3: a 5,000 result; then a fourth user message.
    Each turn ends with 100 tokens of text.
    Requests: 0 first message (100); 1, 2 turn 1's rounds; 3 turn 2's message; 4 its
    round; 5 turn 3's message; 6 its round; 7 the fourth message."""
    s = read_script()
    s.user(100)
    s.request()
    s.tool(oldest, name=oldest_tool)
    s.request()
    s.tool(40_000)
    s.request()
    for result in (30_000, 5_000):
        s.say(100)
        s.user(100)
        s.request()
        s.tool(result)
        s.request()
    s.say(100)
    s.user(100)
    s.request()
    return s


@pytest.mark.parametrize(("oldest", "pruned"), [(20_000, True), (19_999, False)])
def test_opencode_prunes_only_when_at_least_20000_tokens_are_freed(
    oldest: int, pruned: bool
) -> None:
    """When the fourth message arrives (request 7) turn 3 has ended: turns 2 and 3 are
    protected (their 35,000 tokens of output do not count). In turn 1, newest first, the
    40,000 result fits the protected 40,000; the older one is marked. Cleared only if it
    frees >= 20,000: request 7 holds 10,000 + 100 + 3 x 200 + (oldest + 100) + 40,100 +
    30,100 + 5,100 + 200 = 86,100 + oldest, or 86,100 + 7 with the result cleared."""
    frame = run(_prune_script(oldest), "opencode", {"summary_tokens": SUMMARY})
    assert compactions(frame) == []
    before = contexts(frame)[:7]
    assert before[-1] == 85_900 + oldest  # nothing pruned before turn 3 ended
    assert contexts(frame)[7] == 86_100 + (CLEARED_TOKENS if pruned else oldest)


def test_opencode_prunes_before_every_request_when_asked() -> None:
    """`prune.at` "request": at request 5 (turn 3's message is in) turns 2 and 3 are the
    protected ones already, and turn 1's oldest result is cleared two requests earlier:
    request 5 holds 10,000 + 100 + 100 + 7 + 40,100 + 200 + 30,100 + 200 = 80,807."""
    frame = run(
        _prune_script(20_000), "opencode", {"summary_tokens": SUMMARY, "prune.at": "request"}
    )
    assert contexts(frame)[4:6] == [100_600, 80_807]


def test_opencode_never_prunes_protected_tools() -> None:
    """The oldest result is a "Skill" output: not counted, never cleared (opencode's
    protected "skill" tool); the 40,000 one is then the only candidate and is protected."""
    frame = run(_prune_script(20_000, "Skill"), "opencode", {"summary_tokens": SUMMARY})
    assert contexts(frame)[7] == 106_100


# -- all three ------------------------------------------------------------------------------

#: Each policy's trigger at about 50,000 tokens of the 200,000 window.
LOWER_LIMITS: dict[str, dict[str, Any]] = {
    "codex": {"model_auto_compact_token_limit": 50_000},
    "gemini-cli": {"compression_threshold": 0.25},
    "opencode": {"input_limit_tokens": 70_000},
}


@pytest.mark.parametrize("name", POLICIES)
def test_drawn_summaries_are_deterministic(name: str) -> None:
    """Summary sizes come from the calibration through the session's seeded rng: the same
    seed gives the same rows, and the sizes are the calibration's (about 2,200-3,800)."""
    params = LOWER_LIMITS[name]
    first = run(uniform(12), name, params)
    again = run(uniform(12), name, params)
    assert first.equals(again)
    outputs = first.filter(pl.col("kind") == "compaction")["output"].to_list()
    assert outputs
    assert all(1_500 < o < 6_000 for o in outputs)
    assert min(contexts(first)) >= PREFIX  # the view never shrinks below the prefix
    other = replay([("t", uniform(12).trace())], policy.build(name, params), ReplayOptions(seed=1))
    assert other.filter(pl.col("kind") == "compaction")["output"].to_list() != outputs


@pytest.mark.parametrize("name", POLICIES)
def test_every_shared_claude_code_session_replays(
    shared_corpus: Callable[[str], Named], name: str
) -> None:
    traces = shared_corpus("claude-code")
    frame = replay(traces, policy.build(name))
    assert frame.height > 0
    numbers = [
        "context_tokens",
        "uncached_input",
        "cache_read",
        "cache_write_5m",
        "cache_write_1h",
        "output",
        "cost_total",
    ]
    assert frame.select(pl.min_horizontal([pl.col(c).min() for c in numbers])).item() >= 0
    requests = frame.filter(pl.col("kind") == "request")
    assert requests.height == sum(s.n_requests for _, t in traces for s in t.sessions)
    tokens = frame.select(
        (
            pl.col("uncached_input")
            + pl.col("cache_read")
            + pl.col("cache_write_5m")
            + pl.col("cache_write_1h")
            - pl.col("context_tokens")
        )
        .abs()
        .max()
    ).item()
    assert tokens == 0


def test_codex_states_the_limit_of_each_request() -> None:
    """Rows carry the limit the request was checked against: 0.9 x the logged 100,000."""
    frame = replay(
        [("t", _logged(uniform(3), [100_000]))],
        Codex(summary_tokens=SUMMARY),
    )
    requests = frame.filter(pl.col("kind") == "request")
    assert requests["threshold_tokens"].to_list() == [90_000] * 4


@pytest.mark.parametrize(("count", "made"), [(False, []), (True, [(2, "compact")])])
def test_codex_counts_the_reasoning_the_api_dropped(count: bool, made: list[Any]) -> None:
    """A 20,000-token reasoning block of turn 1 (response 0) leaves the count at turn 2.
    Estimates: k1 11,000 + response 0 (20,100) + result 5,000 = 36,100; k2 36,100 + 100
    + the 1,000-token message = 37,200; k3 17,200 + 100 + 5,000 = 22,300: all under the
    40,000 limit. Codex adds the earlier turns' reasoning, which its history still holds:
    k2 57,200, over it."""
    s = read_script()
    s.user(1_000)
    s.request()
    thinking = s._add(Kind.THINKING, Role.ASSISTANT, 20_000, origin=0)
    s.tool(5_000)
    s.request()
    s.say(100)
    s.user(1_000)
    s.b.hide(thinking, 2)
    s.request()
    s.tool(5_000)
    s.request()
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 40_000,
        "count_dropped_reasoning": count,
    }
    frame = run(s, "codex", params)
    assert compactions(frame) == made


def _reasoning_turns(drop: bool) -> Script:
    """Turn 1: a 1,000-token message (k0); response 0 is a 10,000-token reasoning block and
    a round (100 + 5,000: k1 26,100); response 1 a 100-token answer. Turn 2: a 1,000-token
    message (k2), a round (100 + 5,000: k3). `drop`: the API drops the reasoning at turn 2
    (gpt-5.5: k2 17,200, k3 22,300); else it keeps it (gpt-5.6: 27,200, 32,300)."""
    s = read_script()
    s.user(1_000)
    s.request()
    thinking = s._add(Kind.THINKING, Role.ASSISTANT, 10_000, origin=0)
    s.tool(5_000)
    s.request()
    s.say(100)
    s.user(1_000)
    if drop:
        s.b.hide(thinking, 2)
    s.request()
    s.tool(5_000)
    s.request()
    return s


@pytest.mark.parametrize(
    ("drop", "params", "made"),
    [
        # the harness estimate plus the dropped reasoning: k2 26,100 + 100 + 1,000 + 10,000
        # = 37,200, over the 30,000 limit at the user message
        (True, {"count_dropped_reasoning": True}, [(2, "compact")]),
        # Codex's count: k2 is checked before its user message is recorded and while the
        # reasoning is still the latest turn's: 26,100 + 100 = 26,200; k3: 17,200 + 100 +
        # the 5,000 result + 1.2 x 10,000 = 34,300, over it
        (True, {"trigger_count": "codex"}, [(3, "compact")]),
        # at 0.5 per reasoning token: k3 17,300 + 5,000 + 5,000 = 27,300, under it
        (True, {"trigger_count": "codex", "reasoning_estimate_factor": 0.5}, []),
        # the model keeps the reasoning (its usage counts it) and Codex adds it again:
        # limit 40,000; k3 27,300 + 5,000 + 12,000 = 44,300 (the estimate: 32,300)
        (
            False,
            {"trigger_count": "codex", "model_auto_compact_token_limit": 40_000},
            [(3, "compact")],
        ),
        (False, {"model_auto_compact_token_limit": 40_000}, []),
    ],
)
def test_codex_counts_as_codex_rs_does(drop: bool, params: dict[str, Any], made: list[Any]) -> None:
    base = {"summary_tokens": SUMMARY, "model_auto_compact_token_limit": 30_000}
    frame = run(_reasoning_turns(drop), "codex", {**base, **params})
    assert compactions(frame) == made


def test_codex_reasoning_of_earlier_turns_is_forgotten_at_a_compaction() -> None:
    """After the compaction at k3 (Codex's count, limit 30,000) the history holds no
    reasoning. k3: 10,000 prefix + 2,000 of user messages + 3,080 summary = 15,080; a
    100-token answer, then turn 3: k4 16,180, a round: k5 21,280, counted 16,180 + 100 +
    5,000 = 21,280 (turn 1's reasoning still counted would make it 33,280: compacted)."""
    s = _reasoning_turns(True)
    s.say(100)
    s.user(1_000)
    s.request()
    s.tool(5_000)
    s.request()
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 30_000,
        "trigger_count": "codex",
    }
    frame = run(s, "codex", params)
    assert compactions(frame) == [(3, "compact")]
    assert contexts(frame)[3:] == [15_080, 16_180, 21_280]


@pytest.mark.parametrize(
    ("restored", "uncounted", "made"),
    [
        # no resume: k3 17,200 + 100 + 5,000 + 1.2 x 10,000 = 34,300, over 30,000
        ([], True, [(3, "compact")]),
        # resumed at k0: response 0 reasoned after it, so its reasoning counts as before
        ([0], True, [(3, "compact")]),
        # resumed at k1 or k3: response 0's reasoning predates it: k3 22,300, under it
        ([1], True, []),
        ([3], True, []),
        # the rule off: the resume changes nothing
        ([1], False, [(3, "compact")]),
    ],
)
def test_codex_leaves_out_the_reasoning_before_a_resume_from_a_rewritten_rollout(
    restored: list[int], uncounted: bool, made: list[Any]
) -> None:
    """`_reasoning_turns(True)` under Codex's count (limit 30,000) with `restored_at` set:
    the reasoning recorded before a resume from a rewritten copy lost its encrypted
    content, so codex-rs no longer counts it (PRESETS, policies/peers/codex.py)."""
    trace = _reasoning_turns(True).trace()
    trace.sessions[0].restored_at = restored
    params = {
        "summary_tokens": SUMMARY,
        "model_auto_compact_token_limit": 30_000,
        "trigger_count": "codex",
        "restored_reasoning_uncounted": uncounted,
    }
    frame = replay([("t", trace)], Codex(**params))
    assert compactions(frame) == made


@pytest.mark.parametrize(("raw", "first", "limit"), [(False, 7, 81_225), (True, 8, 85_500)])
def test_codex_limit_of_the_raw_window(raw: bool, first: int, limit: int) -> None:
    """Logged 90,250 = 95% of a 95,000 catalog window: 0.9 of the logged one is 81,225
    (k7 81,700 reaches it), 0.9 of the catalog one 85,500 (k8 91,800; openai/codex#40095)."""
    trace = _logged(uniform(18), [90_250])
    params = {"summary_tokens": SUMMARY, "window_share": 0.95, "limit_of_raw_window": raw}
    frame = replay([("t", trace)], Codex(**params))
    assert compactions(frame)[0] == (first, "compact")
    assert row(frame, 0)["threshold_tokens"] == limit


@pytest.mark.parametrize(("apply", "k3"), [(False, 42_300), (True, 41_300)])
def test_codex_applies_the_recordings_unlogged_edits(apply: bool, k3: int) -> None:
    """A 1,000-token block the recording's client dropped at k3 without logging it
    (Flag.UNLOGGED): uniform(3) plus it is 42,300 at k3; dropped there, 41,300."""
    s = read_script()
    s.user(1_000)
    dropped = s._add(Kind.INJECTED, Role.USER, 1_000, flags=Flag.UNLOGGED)
    s.request()
    s.rounds(3, 10_000)
    s.b.compact_away(dropped, 3)
    frame = run(s, "codex", {"summary_tokens": SUMMARY, "apply_unlogged_edits": apply})
    assert compactions(frame) == []
    assert contexts(frame)[3] == k3
