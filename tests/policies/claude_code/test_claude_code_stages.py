"""Claude Code's pipeline (policies/claude_code), stage by stage, on small hand-built sessions.

Every expectation is a literal computed by hand (derivation in the comments). The sessions
(class `Script`) follow one convention so that the numbers stay simple:

* the system + tools prefix is set explicitly (10,000 tokens unless noted): no anchoring,
  no recorded usage, so block tokens are exactly the numbers written here, each request's
  cache TTL is 5 minutes, and each recorded output is the tokens of its response blocks;
* every block has 4 characters per token, so Claude Code's length/4 estimate of a new
  block equals its tokens, and the autocompact estimate (last usage + output + length/4 of
  what is new) equals the context exactly;
* a "round" is the response to the previous request (a 100-token tool_use) and its tool
  result, both entering at the next request; requests are one minute apart.

Model: Sonnet 4.5 (200,000-token window, 1,024-token cache minimum). For that window the
2.1.88 limits are: reserve min(32,000, 20,000) = 20,000, effective 180,000, autocompact
threshold 167,000, blocking limit 177,000; the API refuses a prompt over 200,000.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from typing import Any

import orjson
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.claude_code.autocompact import Attempt, Autocompact
from policies.claude_code.collapse import Collapse, Span
from policies.claude_code.groups import GroupIndex
from policies.claude_code.policy import BASE, COMPACTABLE_TOOLS, _State, preset_for
from policies.claude_code.snip import Snip
from policies.conversation import CLEARED_TOKENS, Conversation
from simulator import policy
from simulator.app.cli import parse_param
from simulator.model import Flag, Kind, Role, Trace
from simulator.policy import Call
from simulator.prefix import Prefix
from simulator.replay import replay
from simulator.view import chain
from tests.support.scripted import compactions, contexts, row, usage
from traces.builder import Hasher, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000
NEWEST = "claude-code@2.1.88"
PRESETS = [
    "claude-code",
    "claude-code@1.0",
    "claude-code@2.1.6",
    "claude-code@2.1.88",
    "claude-code@2.1.92",
    "claude-code@2.1.144",
    "claude-code@2.1.221",
    "claude-code@latest",
]
#: A fixed 3,000-token summary and no extra restored context: post-compaction contexts are
#: prefix + 3,000 + restored files.
AUTO: dict[str, Any] = {
    "autocompact.summary_tokens": 3_000,
    "autocompact.restore_extra_tokens": 0,
}
#: Output of a summary request that produced a 3,000-token summary: 2.x keeps only the
#: <summary> part, which is 1 - 0.22 of what the call wrote: round(3,000 / 0.78) = 3,846.
SUMMARY_OUTPUT = 3_846


class Script:
    """A session written turn by turn (see the module docstring for its conventions)."""

    def __init__(self, prefix: int = 10_000) -> None:
        self.b = SessionBuilder(Hasher(b"t"), id="s", kind="main", client="claude-code 2.1.88")
        self.b.prefix_tokens = prefix
        self.k = 0  # index of the next request
        self.msg = 0
        self.ts = T0
        self.n = 0

    def _text(self, chars: int) -> str:
        self.n += 1
        tag = f"#{self.n}#"
        return tag.ljust(chars, "x") if chars >= len(tag) else "y" * chars

    def _add(
        self,
        kind: Kind,
        role: Role,
        tokens: int,
        chars: int | None = None,
        *,
        origin: int = -1,
        new_msg: bool = True,
        **kw: Any,
    ) -> int:
        if new_msg:
            self.msg += 1
        text = self._text(4 * tokens if chars is None else chars)
        return self.b.add_block(
            msg=self.msg,
            kind=kind,
            role=role,
            text=text,
            ts=self.ts,
            first_request=self.k,
            tokens=tokens,
            origin=origin,
            **kw,
        )

    def user(self, tokens: int) -> int:
        """A user text message."""
        return self._add(Kind.TEXT, Role.USER, tokens)

    def say(self, tokens: int) -> int:
        """Assistant text: part of the response to the previous request."""
        return self._add(Kind.TEXT, Role.ASSISTANT, tokens, origin=self.k - 1)

    def tool(
        self,
        name: str,
        tokens: int,
        chars: int | None = None,
        path: str | None = None,
        **result: Any,
    ) -> tuple[int, int]:
        """One round: a 100-token tool_use (response to the previous request) and its
        result (`result`: more fields of its block, e.g. file_tokens); returns (tool_use
        block, tool_result block)."""
        (use,), (res,) = self.tools([(name, tokens, chars, path)], result)
        return use, res

    def tools(
        self,
        calls: list[tuple[str, int, int | None, str | None]],
        result: dict[str, Any] | None = None,
    ) -> tuple[list[int], list[int]]:
        """Parallel tool calls: one assistant message of tool_uses, one user message of
        their results (name, result tokens, result chars or None for 4/token, read path)."""
        self.msg += 1
        uses, ids = [], []
        for i, (name, *_) in enumerate(calls):
            uid = f"u{self.n}-{i}"
            ids.append(uid)
            uses.append(
                self._add(
                    Kind.TOOL_USE,
                    Role.ASSISTANT,
                    100,
                    origin=self.k - 1,
                    new_msg=False,
                    tool=name,
                    use_id=uid,
                )
            )
        self.msg += 1
        results = []
        for uid, (name, tokens, chars, path) in zip(ids, calls, strict=True):
            results.append(
                self._add(
                    Kind.TOOL_RESULT,
                    Role.USER,
                    tokens,
                    chars,
                    new_msg=False,
                    tool=name,
                    result_for=uid,
                    path=path,
                    flags=Flag.PATH_READ if path else Flag.NONE,
                    **(result or {}),
                )
            )
        return uses, results

    def request(self, gap: int = MINUTE) -> int:
        """A recorded request `gap` ms after the previous one (its response ends at once)."""
        if self.k:
            self.ts += gap
        self.b.add_request(ts=self.ts, model=SONNET, usage=None)
        self.k += 1
        return self.k - 1

    def rounds(self, n: int, tool: str, tokens: int) -> list[int]:
        """n rounds, one request each; returns the result blocks."""
        results = []
        for _ in range(n):
            results.append(self.tool(tool, tokens)[1])
            self.request()
        return results

    def trace(self) -> Trace:
        return Trace(format="claude-code", source_digest="t", sessions=[self.b.finish()])


def uniform(n: int, tool: str = "Read", tokens: int = 10_000) -> Script:
    """Request 0: a 1,000-token user message; requests 1..n: one round each
    (100 + `tokens`). With the defaults, request k holds 11,000 + 10,100 k tokens."""
    s = Script()
    s.user(1_000)
    s.request()
    s.rounds(n, tool, tokens)
    return s


class Scripted(random.Random):
    """An rng whose `random()` returns the given values, in order (and no more)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def run(
    script: Script,
    params: dict[str, Any] | None = None,
    preset: str = NEWEST,
    *,
    setup: Callable[[Any], None] | None = None,
) -> tuple[pl.DataFrame, Any]:
    """Replay the script; returns the rows and the session's policy state (for the
    stages' own records). `setup` sees the state before the first request."""
    pol = policy.build(preset, params or {})
    states: list[Any] = []
    make = pol.session

    def session(ctx: Any) -> Any:
        state = make(ctx)
        if setup is not None:
            setup(state)
        states.append(state)
        return state

    pol.session = session  # type: ignore[method-assign]
    frame = replay([("t", script.trace())], pol)
    return frame, states[0]


def requests(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("kind") == "request").sort("request")


# -- limits -------------------------------------------------------------------------------


def test_limits_of_2_1_88_on_a_200k_window() -> None:
    # reserve = min(32,000, 20,000); effective = 200,000 - 20,000; threshold = effective -
    # 13,000; warning = threshold - 20,000; blocking = effective - 3,000.
    lim = Autocompact(policy.build(NEWEST).params).limits(200_000)
    assert (lim.window, lim.reserve, lim.effective) == (200_000, 20_000, 180_000)
    assert (lim.threshold, lim.warning, lim.blocking) == (167_000, 147_000, 177_000)


@pytest.mark.parametrize(
    ("preset", "threshold"),
    # 2.1.6: 168,000 - 13,000. 1.0: 92% of the effective window, int(0.92 x 168,000).
    [("claude-code@2.1.6", 155_000), ("claude-code@1.0", 154_560)],
)
def test_limits_of_older_presets_reserve_the_whole_max_output(preset: str, threshold: int) -> None:
    # reserve = the whole 32,000 max output: effective 168,000; warning threshold - 20,000;
    # blocking 165,000.
    lim = Autocompact(policy.build(preset).params).limits(200_000)
    assert (lim.reserve, lim.effective) == (32_000, 168_000)
    assert (lim.threshold, lim.warning, lim.blocking) == (threshold, threshold - 20_000, 165_000)


def test_buffer_parameter_moves_the_threshold() -> None:
    # `-P autocompact.buffer_tokens=8000`: threshold 180,000 - 8,000; blocking unchanged.
    scope, key, value = parse_param("autocompact.buffer_tokens=8000")
    assert (scope, key, value) == (None, "autocompact.buffer_tokens", 8000)
    lim = Autocompact(policy.build(NEWEST, {key: value}).params).limits(200_000)
    assert (lim.threshold, lim.warning, lim.blocking) == (172_000, 152_000, 177_000)


@pytest.mark.parametrize(
    ("preset", "params", "threshold"),
    [
        (NEWEST, {}, 167_000),
        ("claude-code", {}, 167_000),
        ("claude-code@2.1.6", {}, 155_000),
        ("claude-code@1.0", {}, 154_560),
        (NEWEST, {"autocompact.buffer_tokens": 8_000}, 172_000),
    ],
)
def test_autocompact_fires_when_the_estimate_reaches_the_threshold(
    preset: str, params: dict[str, Any], threshold: int
) -> None:
    """Request 0 holds 11,000; request 1 adds a 100-token tool_use (the output of request
    0) and a Read result of R tokens: estimate 11,000 + 100 + R. R = threshold - 11,100
    reaches the threshold exactly (compaction); one token less does not."""
    for result, compacts in [(threshold - 11_100, True), (threshold - 11_101, False)]:
        s = Script()
        s.user(1_000)
        s.request()
        s.tool("Read", result)
        s.request()
        frame, _ = run(s, {**AUTO, **params}, preset)
        assert compactions(frame) == ([(1, "autocompact")] if compacts else [])
        if compacts:  # 1.0 kept the <analysis> part in the context: output = summary
            output = 3_000 if preset == "claude-code@1.0" else SUMMARY_OUTPUT
            assert row(frame, 1, "compaction")["output"] == output
        # After: prefix 10,000 + summary 3,000 (no file was read by path).
        assert contexts(frame)[1] == (13_000 if compacts else threshold - 1)


# -- stage 0: the tool-result budget -------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "chars", "tokens", "persisted"),
    [
        ("Bash", 30_001, 7_500, True),
        ("Bash", 30_000, 7_500, False),
        ("Grep", 20_001, 5_000, True),
        ("Grep", 20_000, 5_000, False),
        ("Read", 200_000, 50_000, False),  # Read: never, whatever the size
        ("WebFetch", 50_001, 12_500, True),
        ("WebFetch", 50_000, 12_500, False),
        ("mcp__db__query", 50_001, 12_500, True),  # any other tool: 50,000
        ("mcp__db__query", 50_000, 12_500, False),
    ],
)
def test_budget_persists_a_result_over_its_tool_limit(
    tool: str, chars: int, tokens: int, persisted: bool
) -> None:
    """Request 1 = 10,000 prefix + 1,000 user + 100 tool_use + the result. Persisted, the
    result becomes a ~2,000-char preview: round(tokens x 2,000 / chars) = 500 tokens for
    every persisted case here (7,500 x 2,000 / 30,001 = 499.98; 5,000 x 2,000 / 20,001 =
    499.98; 12,500 x 2,000 / 50,001 = 499.99), plus the 40-token wrapper: 540."""
    s = Script()
    s.user(1_000)
    s.request()
    _, result = s.tool(tool, tokens, chars)
    s.request()
    frame, state = run(s)
    assert contexts(frame)[1] == 11_100 + (540 if persisted else tokens)
    assert state.budget.persisted == ([result] if persisted else [])


def test_budget_is_off_in_the_1_0_preset() -> None:
    s = Script()
    s.user(1_000)
    s.request()
    s.tool("Bash", 7_500, 30_001)
    s.request()
    frame, state = run(s, preset="claude-code@1.0")
    assert contexts(frame)[1] == 18_600  # 11,100 + 7,500: sent whole
    assert state.budget.persisted == []


def test_a_persisted_result_stays_persisted_and_cached() -> None:
    """Request 1: 11,100 + 540 (the 30,001-char Bash result persisted) = 11,640; request
    2 adds a small Bash round (100 + 1,000): 12,740, of which the 11,640 sent by request
    1, preview included, is read from cache: the decision was not revisited."""
    s = Script()
    s.user(1_000)
    s.request()
    _, big = s.tool("Bash", 7_500, 30_001)
    s.request()
    s.tool("Bash", 1_000)
    s.request()
    frame, state = run(s)
    assert contexts(frame) == [11_000, 11_640, 12_740]
    assert row(frame, 2)["cache_read"] == 11_640
    assert row(frame, 2)["cache_write_5m"] == 1_100
    assert state.budget.persisted == [big]


def test_per_message_budget_replaces_the_largest_fresh_results_first() -> None:
    """Request 1: one message of six WebFetch results (each under the 50,000-char limit),
    279,000 chars in all (> 200,000). Largest first: 49,000 -> 279,000 - (49,000 - 2,000)
    = 232,000, still over; 48,000 -> 232,000 - 46,000 = 186,000: under, stop. Each
    persisted result becomes 500 + 40 tokens (12,250 x 2,000 / 49,000 = 500; 12,000 x
    2,000 / 48,000 = 500).

    Request 1 = 10,000 + 1,000 + 6 x 100 + (69,750 result tokens - 12,250 - 12,000) +
    2 x 540 = 58,180 (81,350 with the per-message budget off, as by default).
    Request 2: a new message of three results, 144,000 chars: under, nothing persisted;
    the first message's remaining results are frozen. + 300 + 36,000 = 94,480."""
    sizes = [46_000, 49_000, 44_000, 48_000, 45_000, 47_000]  # chars; tokens = chars / 4

    def script() -> tuple[Script, list[int]]:
        s = Script()
        s.user(1_000)
        s.request()
        _, results = s.tools([("WebFetch", c // 4, c, None) for c in sizes])
        s.request()
        s.tools([("WebFetch", c // 4, c, None) for c in [49_000, 48_000, 47_000]])
        s.request()
        return s, results

    s, results = script()
    frame, state = run(s, {"budget.per_message.enabled": True})
    assert contexts(frame) == [11_000, 58_180, 94_480]
    assert state.budget.persisted == [results[1], results[3]]  # 49,000 then 48,000
    s, _ = script()
    frame, state = run(s)
    assert contexts(frame) == [11_000, 81_350, 117_650]
    assert state.budget.persisted == []


# -- stage 2: microcompact -----------------------------------------------------------------


def _idle_session(gap: int) -> tuple[Script, int, list[int]]:
    """Request 0: 1,000 user. Round 1: an unlisted tool (Task) result of 1,000; rounds
    2-8: Bash results of 1,000 each (7 compactable results). Request 8 holds 10,000 +
    1,000 + 8 x 1,100 = 19,800. After `gap`, request 9 adds 100 assistant text and 100
    user text: 20,000 before any clearing."""
    s = Script()
    s.user(1_000)
    s.request()
    task = s.rounds(1, "Task", 1_000)[0]
    bash = s.rounds(7, "Bash", 1_000)
    s.say(100)
    s.user(100)
    s.request(gap)
    return s, task, bash


def test_time_based_microcompact_clears_all_but_the_five_newest_after_an_hour() -> None:
    """60 minutes after the last response: the 2 oldest of the 7 Bash results become the
    7-token marker: 20,000 - 2 x (1,000 - 7) = 18,014. The older Task result (not a listed
    tool) is untouched."""
    s, task, bash = _idle_session(60 * MINUTE)
    frame, state = run(s, {"microcompact.time_based.enabled": True})
    assert contexts(frame)[8:] == [19_800, 18_014]
    assert CLEARED_TOKENS == 7
    assert state.micro.cleared == set(bash[:2])
    assert task not in state.conv.override
    assert state.conv.item(bash[0])[1] == 7 and state.conv.item(task)[1] == 1_000
    # The cache had expired anyway (5-minute TTL): nothing is read.
    assert row(frame, 9)["cache_read"] == 0


@pytest.mark.parametrize(
    ("gap", "params"),
    [
        (59 * MINUTE, {"microcompact.time_based.enabled": True}),  # one minute short
        (60 * MINUTE, {}),  # gated off by default
    ],
)
def test_time_based_microcompact_not_due(gap: int, params: dict[str, Any]) -> None:
    s, _, _ = _idle_session(gap)
    frame, state = run(s, params)
    assert contexts(frame)[8:] == [19_800, 20_000]
    assert state.micro.cleared == set()


def test_time_based_microcompact_tool_list_is_the_documented_one() -> None:
    assert COMPACTABLE_TOOLS == [
        "Read",
        "Bash",
        "PowerShell",
        "Grep",
        "Glob",
        "WebSearch",
        "WebFetch",
        "Edit",
        "Write",
    ]
    assert BASE["microcompact.time_based.gap_minutes"] == 60
    assert BASE["microcompact.time_based.keep"] == 5


def test_time_based_microcompact_keep_zero_clears_every_old_result() -> None:
    """keep = 0: all 7 Bash results become the marker: 20,000 - 7 x 993 = 13,049 (the Task
    result still untouched)."""
    s, task, bash = _idle_session(60 * MINUTE)
    frame, state = run(
        s, {"microcompact.time_based.enabled": True, "microcompact.time_based.keep": 0}
    )
    assert contexts(frame)[9] == 13_049
    assert state.micro.cleared == set(bash) and task not in state.micro.cleared


def test_cached_microcompact_deletes_by_reference_keeping_the_prefix() -> None:
    """Request 0: 1,000 user; rounds 1..13 of Bash 1,000 (request k: 11,000 + 1,100 k).
    At request 12 the context holds 12 compactable results: the 7 oldest are deleted by
    reference (cache_edits): 24,200 - 7,000 = 17,200. Their places stay in the cached
    prefix: request 12 reads what request 11 wrote (23,100, now counting 7,000 less:
    16,100) and writes only its new 1,100; request 13 (6 live results: no trigger) reads
    all of request 12: 17,200, and adds 1,100: 18,300."""
    s = uniform(13, "Bash", 1_000)
    frame, state = run(s, {"microcompact.cached.enabled": True})
    assert contexts(frame)[11:] == [23_100, 17_200, 18_300]
    assert usage(row(frame, 12))[:4] == (17_200, 0, 16_100, 1_100)
    assert usage(row(frame, 13))[:4] == (18_300, 0, 17_200, 1_100)
    results = [b for b in range(s.b.n_blocks) if s.b.block_kinds([b]) == [Kind.TOOL_RESULT]]
    assert state.conv.edited == set(results[:7])
    # Off (the default): nothing is deleted.
    frame, _ = run(uniform(13, "Bash", 1_000))
    assert contexts(frame)[11:] == [23_100, 24_200, 25_300]


# -- stage 1: snip -------------------------------------------------------------------------


def test_snip_removes_middle_groups_never_splitting_a_tool_pair() -> None:
    """Rounds of 100 + 10,000: request k holds 11,000 + 10,100 k. Snip triggers at 0.85 x
    180,000 = 153,000: request 14 (152,400) no; request 15 (162,500) yes. Goal: down to
    0.70 x 180,000 = 126,000, i.e. free 36,500. Groups: 0 the user message, 1..15 the
    rounds; keep 2 at the head and 10 at the tail, so groups 2..5 are removable, oldest
    first: 10,100 each, 40,400 after the fourth (>= 36,500). Request 15: 122,100 (below
    the autocompact threshold: no compaction); request 16: 132,200.

    The snipped middle breaks the cached prefix after round 1: request 15 reads only the
    10,000-token system prefix."""
    s = Script()
    s.user(1_000)
    s.request()
    pairs = []
    for _ in range(16):
        pairs.append(s.tool("Read", 10_000))
        s.request()
    frame, state = run(s, {"snip.enabled": True})
    assert contexts(frame)[14:] == [152_400, 122_100, 132_200]
    assert compactions(frame) == []
    assert row(frame, 15)["cache_read"] == 10_000
    assert state.snip.snips == 1
    kept = set(state.conv.items)
    removed = {b for pair in pairs[1:5] for b in pair}  # rounds 2-5
    assert not kept & removed
    assert {b for pair in pairs[:1] + pairs[5:] for b in pair} <= kept
    link = s.trace().sessions[0].blocks["link"].tolist()
    for b in kept:
        if link[b] >= 0:
            assert link[b] in kept  # both halves of every pair, or neither


def test_snip_frees_tokens_before_the_autocompact_check() -> None:
    """Snip at 0.95 x 180,000 = 171,000: request 15 (162,500) no; request 16 (172,600,
    over the 167,000 autocompact threshold too) snips first: free 172,600 - 126,000 =
    46,600; removable groups 2..6 (17 groups, 2 head, 10 tail) give 5 x 10,100 = 50,500.
    The estimate after snip, 122,100, is under the threshold: no compaction."""
    frame, state = run(uniform(16), {**AUTO, "snip.enabled": True, "snip.trigger_fraction": 0.95})
    assert contexts(frame)[15:] == [162_500, 122_100]
    assert compactions(frame) == [] and state.snip.snips == 1


# -- stage 4: autocompact -------------------------------------------------------------------


def test_autocompact_compacts_where_the_estimate_first_reaches_the_threshold() -> None:
    """Request k holds 11,000 + 10,100 k: request 15 162,500 (under 167,000); request 16
    172,600 (over). The compaction request (row first) sends the conversation plus the
    700-token summary prompt: 173,300, of which 162,500 (request 15's entry) is read from
    cache, the 10,100 new tokens written (its marker is on the last conversation item,
    so the prompt itself, 700, is uncached); it outputs 3,846. Then request 16 sends the
    prefix (cached) and the 3,000-token summary: 13,000. Request 17 adds a round: 23,100."""
    frame, state = run(uniform(17), AUTO)
    assert contexts(frame) == [11_000 + 10_100 * k for k in range(16)] + [13_000, 23_100]
    assert compactions(frame) == [(16, "autocompact")]
    at16 = frame.filter(pl.col("request") == 16).sort("call")
    assert at16["kind"].to_list() == ["compaction", "request"]
    assert usage(at16.row(0, named=True)) == (173_300, 700, 162_500, 10_100, SUMMARY_OUTPUT)
    assert usage(at16.row(1, named=True)) == (13_000, 0, 10_000, 3_000, 100)
    assert not frame["overflow"].any() and not frame["breaker_trip"].any()
    assert (state.auto.compactions, state.auto.failures) == (1, 0)


def test_the_estimate_counts_an_image_as_2000_tokens() -> None:
    """Request 1 adds a 100-token tool_use, a 153,900-token Read result and an image the
    API counts as 1,500: the context is 11,000 + 100 + 153,900 + 1,500 = 166,500, under
    the threshold, but Claude Code's estimate counts the image as 2,000: 167,000: due."""
    s = Script()
    s.user(1_000)
    s.request()
    s.tool("Read", 153_900)
    s.b.add_block(
        msg=s.msg, kind=Kind.IMAGE, role=Role.USER, text="", ts=s.ts, first_request=1, tokens=1_500
    )
    s.request()
    frame, _ = run(s, AUTO)
    assert compactions(frame) == [(1, "autocompact")]
    assert row(frame, 1, "compaction")["context_tokens"] == 166_500 + 700


def _files_session(gap: int = MINUTE) -> Script:
    """Request 0: 1,000 user. Rounds 1-7 read files (result tokens): f 5,000, e 1,000,
    d 6,000, c 4,000, a 9,000, b 8,000, a 2,000: request 7 holds 11,000 + 700 + 35,000 =
    46,700. Request 8 (after `gap`): 100 assistant text + a 125,000-token user message:
    171,800, over the threshold: compaction at request 8."""
    s = Script()
    s.user(1_000)
    s.request()
    for path, tokens in [("f", 5_000), ("e", 1_000), ("d", 6_000), ("c", 4_000)]:
        s.tool("Read", tokens, path=path)
        s.request()
    for path, tokens in [("a", 9_000), ("b", 8_000), ("a", 2_000)]:
        s.tool("Read", tokens, path=path)
        s.request()
    s.say(100)
    s.user(125_000)
    s.request(gap)
    return s


@pytest.mark.parametrize(
    ("params", "restored"),
    [
        # Newest first, one per path: a 2,000 (its latest read, not the 9,000 one), b 8,000
        # capped to 5,000, c 4,000, d 6,000 capped to 5,000, e 1,000: five files, 17,000;
        # f is the sixth path: not restored.
        ({}, 17_000),
        # A 15,000 total: 2,000 + 5,000 + 4,000 + the 4,000 left for d.
        ({"autocompact.restore_total_tokens": 15_000}, 15_000),
        ({"autocompact.restore_files": 2}, 7_000),  # a 2,000 + b 5,000
        ({"autocompact.restore_file_tokens": 1_000}, 5_000),  # five files x 1,000
        # 2.1.2xx: a file over the cap comes back as a reference, not cut: a 2,000, b
        # (8,000) a 50-token reference, c 4,000, d (6,000) a reference, e 1,000.
        ({"autocompact.restore_reference_tokens": 50}, 7_100),
        # The budget counts references too: 2,000 + 50 + 4,000 + 50 leave 400 for e.
        (
            {"autocompact.restore_reference_tokens": 50, "autocompact.restore_total_tokens": 6_500},
            6_500,
        ),
    ],
)
def test_after_compaction_the_recently_read_files_are_restored(
    params: dict[str, Any], restored: int
) -> None:
    frame, _ = run(_files_session(), {**AUTO, **params})
    assert compactions(frame) == [(8, "autocompact")]
    assert contexts(frame)[7:] == [46_700, 10_000 + 3_000 + restored]


def test_restored_files_count_their_whole_size_not_what_was_shown() -> None:
    """Request 0: 1,000 user. Round 1 reads 1,000 tokens of a, a quarter of the file (its
    whole size is 4 x 1,000 cl100k); round 2 writes b (a 100-token result; the file is
    2,000 cl100k); round 3 reads all of c (3,000). Request 4: 100 text + 160,000 user:
    11,000 + 1,100 + 200 + 3,100 + 160,100 = 175,500, over 167,000. Restored, newest
    first, cl100k x 1.207: c 3,000 x 1 -> 3,621; b 2,000 -> 2,414; a 4,000 -> 4,828."""
    s = Script()
    s.user(1_000)
    s.request()
    s.tool("Read", 1_000, path="a", file_scale=4.0)
    s.request()
    s.tool("Write", 100, path="b", file_tokens=2_000)
    s.request()
    s.tool("Read", 3_000, path="c", file_scale=1.0)
    s.request()
    s.say(100)
    s.user(160_000)
    s.request()
    frame, _ = run(s, AUTO)
    assert compactions(frame) == [(4, "autocompact")]
    assert contexts(frame)[4] == 10_000 + 3_000 + 3_621 + 2_414 + 4_828
    # The per-file cap applies to the whole size: a is cut to 3,000.
    frame, _ = run(s, {**AUTO, "autocompact.restore_file_tokens": 3_000})
    assert contexts(frame)[4] == 10_000 + 3_000 + 3_000 + 2_414 + 3_000


@pytest.mark.parametrize(("preset", "reattached"), [(NEWEST, 4_000), ("claude-code@1.0", 0)])
def test_2_x_attaches_the_first_message_context_again(preset: str, reattached: int) -> None:
    """A prefix of 10,000 whose system prompt ends at 6,000: the 4,000 after it (memory
    files, environment) come back after a 2.x compaction (anthropics/claude-code#22654),
    not after a 1.0 one. 1.0 compacts the same session at the same request (171,800 is
    over its 154,560 too); its restored files are the same 17,000."""

    def prefix(state: Any) -> None:
        state.conv.prefix.prefix = Prefix(shared=0, system=6_000, total=10_000)

    frame, _ = run(_files_session(), AUTO, preset, setup=prefix)
    assert compactions(frame) == [(8, "autocompact")]
    assert contexts(frame)[8] == 10_000 + 3_000 + 17_000 + reattached


def test_restore_extra_tokens_are_added_after_the_files() -> None:
    # 10,000 + 3,000 + 17,000 files + 1,234.
    frame, _ = run(_files_session(), {**AUTO, "autocompact.restore_extra_tokens": 1_234})
    assert contexts(frame)[8] == 31_234


def test_the_compaction_request_reads_the_conversation_cache_within_its_ttl() -> None:
    """One minute after request 7 the compaction request (171,800 + 700) reads request
    7's 46,700 from cache and writes the 125,100 new tokens; six minutes after, the
    5-minute entries are gone: it reads nothing and writes 171,800 (the system prefix at
    its marker, then the rest), so request 8 itself reads back the 10,000-token prefix."""
    frame, _ = run(_files_session(MINUTE), AUTO)
    assert usage(row(frame, 8, "compaction")) == (172_500, 700, 46_700, 125_100, SUMMARY_OUTPUT)
    assert usage(row(frame, 8))[:4] == (30_000, 0, 10_000, 20_000)
    frame, _ = run(_files_session(6 * MINUTE), AUTO)
    assert usage(row(frame, 8, "compaction")) == (172_500, 700, 0, 171_800, SUMMARY_OUTPUT)
    assert usage(row(frame, 8))[:4] == (30_000, 0, 10_000, 20_000)


# -- the circuit breaker --------------------------------------------------------------------


def _over_threshold(after: list[int]) -> Script:
    """uniform(16): request 16 holds 172,600 (over the threshold); then one Read round
    per entry of `after` (100 + tokens)."""
    s = uniform(16)
    for tokens in after:
        s.tool("Read", tokens)
        s.request()
    return s


def test_breaker_trips_after_three_consecutive_failures() -> None:
    """Every compaction fails (probability 1.0): requests 16, 17, 18 each send a failed
    compaction (context + 700 prompt, no output); the third trips the breaker (flagged on
    request 18's row only) and autocompact is never tried again. Contexts grow by 1,600 a
    round: 172,600, 174,200, 175,800, 177,400, 179,000; the last two are over the
    177,000 blocking limit: overflow."""
    s = _over_threshold([1_500] * 4)
    frame, state = run(s, {**AUTO, "autocompact.failure_probability": 1.0})
    assert compactions(frame) == [(k, "autocompact-failed") for k in (16, 17, 18)]
    failed = frame.filter(pl.col("kind") == "compaction")
    assert failed["context_tokens"].to_list() == [173_300, 174_900, 176_500]
    assert failed["output"].to_list() == [0, 0, 0]
    assert contexts(frame)[15:] == [162_500, 172_600, 174_200, 175_800, 177_400, 179_000]
    trips = frame.filter(pl.col("breaker_trip"))
    assert trips.height == 1 and (trips["request"][0], trips["kind"][0]) == (18, "request")
    assert requests(frame).filter(pl.col("overflow"))["request"].to_list() == [19, 20]
    assert (state.auto.tripped, state.auto.failures) == (True, 3)


def test_a_success_resets_the_failure_count() -> None:
    """Scripted outcomes (failure when the draw < 0.5): fail 16, fail 17, succeed 18
    (context 10,000 + 3,000), then a 160,000-token result crosses again at 19 (13,000 +
    100 + 160,000 = 173,100): fail 19, 20, 21. Without the reset the breaker would trip at
    19 (third failure); with it, at 21. Request 22 (177,900 > 177,000) overflows and
    tries no compaction."""
    s = _over_threshold([1_500, 1_500, 160_000, 1_500, 1_500, 1_500])

    def script_rng(state: Any) -> None:
        state.ctx.rng = Scripted([0.0, 0.0, 0.9, 0.0, 0.0, 0.0])

    frame, state = run(s, {**AUTO, "autocompact.failure_probability": 0.5}, setup=script_rng)
    failed = "autocompact-failed"
    assert compactions(frame) == [
        (16, failed),
        (17, failed),
        (18, "autocompact"),
        (19, failed),
        (20, failed),
        (21, failed),
    ]
    assert contexts(frame)[16:] == [172_600, 174_200, 13_000, 173_100, 174_700, 176_300, 177_900]
    assert frame.filter(pl.col("breaker_trip"))["request"].to_list() == [21]
    assert requests(frame).filter(pl.col("overflow"))["request"].to_list() == [22]
    assert state.ctx.rng.values == []  # exactly six draws: one per compaction attempt


def test_record_counts_consecutive_failures_only() -> None:
    auto = Autocompact(policy.build(NEWEST).params)
    ok, bad = Attempt(None, 1, True, ""), Attempt(None, 0, False, "failure")
    assert [auto.record([bad]), auto.record([bad]), auto.record([ok])] == [False] * 3
    assert auto.failures == 0
    assert [auto.record([bad]), auto.record([bad]), auto.record([bad])] == [False, False, True]
    assert auto.tripped
    assert auto.record([bad]) is False  # trips once
    assert not auto.due(10**9, auto.limits(200_000))


# -- prompt too long ------------------------------------------------------------------------


def _too_long() -> Script:
    """uniform(13) (request 13: 142,300), then a 60,000-token Read round: request 14
    holds 202,400; its compaction request would be 203,100 > 200,000 (3,100 over)."""
    s = uniform(13)
    s.tool("Read", 60_000)
    s.request()
    return s


def test_prompt_too_long_drops_the_oldest_groups_and_retries() -> None:
    """The refused attempt leaves no row. Dropping the oldest groups until 3,100 are gone:
    the user message (1,000), then round 1 (10,100): 11,100. The retry sends 203,100 -
    11,100 = 192,000 and succeeds; its start changed, so it reads only the 10,000-token
    system prefix from cache and writes the rest of the conversation (181,300)."""
    frame, state = run(_too_long(), AUTO)
    assert compactions(frame) == [(14, "autocompact")]
    assert usage(row(frame, 14, "compaction")) == (192_000, 700, 10_000, 181_300, SUMMARY_OUTPUT)
    assert contexts(frame)[13:] == [142_300, 13_000]
    assert state.auto.failures == 0


def test_prompt_too_long_without_retries_counts_as_a_failure() -> None:
    # No retry allowed: one refused attempt (no row), a failure; request 14 is sent as it
    # is (202,400 > 177,000: overflow).
    frame, state = run(_too_long(), {**AUTO, "autocompact.ptl_retries": 0})
    assert compactions(frame) == []
    assert contexts(frame)[14] == 202_400
    assert row(frame, 14)["overflow"] is True
    assert (state.auto.failures, state.auto.tripped) == (1, False)


def test_prompt_too_long_after_three_retries_is_a_failure() -> None:
    """Request 1 holds 11,100 + 195,000 = 206,100: the compaction request (206,800) is
    too long, and still too long with only the last group left (10,000 + 195,100 + 700
    = 205,800): the first attempt and its 3 retries are all refused, no row is billed,
    and the compaction counts as a failure (with a breaker of 1: it trips)."""
    s = Script()
    s.user(1_000)
    s.request()
    s.tool("Read", 195_000)
    s.request()
    attempts: list[list[Attempt]] = []

    def spy(state: Any) -> None:
        compact = state.auto.compact

        def logged(*args: Any, **kwargs: Any) -> list[Attempt]:
            out: list[Attempt] = compact(*args, **kwargs)
            attempts.append(out)
            return out

        state.auto.compact = logged

    frame, state = run(s, {**AUTO, "autocompact.breaker_failures": 1}, setup=spy)
    assert [[(a.view, a.reason) for a in run_] for run_ in attempts] == [
        [(None, "prompt-too-long")] * 4
    ]
    assert compactions(frame) == []
    r = row(frame, 1)
    assert (r["context_tokens"], r["overflow"], r["breaker_trip"]) == (206_100, True, True)
    assert state.auto.failures == 1


def test_prompt_too_long_retry_keeps_cache_edit_deletions() -> None:
    """Request 0: 1,000 user; rounds 1..12 of Bash 1,000: at request 12 cached
    microcompact deletes the 7 oldest results (17,200 left). Request 13: 100 assistant
    text + a 183,000-token user message: 200,300; the compaction request (201,000) is
    1,000 over. Dropping the oldest group (the 1,000-token user message) is enough: the
    retry is 200,000 (10,000 + 12 x 100 uses + 5 live results x 1,000 + 100 + 183,000 +
    700), within the window."""
    s = uniform(12, "Bash", 1_000)
    s.say(100)
    s.user(183_000)
    s.request()
    frame, _ = run(s, {**AUTO, "microcompact.cached.enabled": True})
    assert contexts(frame)[12] == 17_200
    assert compactions(frame) == [(13, "autocompact")]
    assert row(frame, 13, "compaction")["context_tokens"] == 200_000


# -- overflow -------------------------------------------------------------------------------


def test_overflow_is_recorded_and_replay_goes_on() -> None:
    """Autocompact off: request k holds 11,000 + 10,100 k; 16 (172,600) is under the
    177,000 blocking limit, 17-19 over (the last, 202,900, even over the window)."""
    frame, _ = run(uniform(19), {"autocompact.enabled": False})
    assert frame.height == 20 and compactions(frame) == []
    assert contexts(frame)[16:] == [172_600, 182_700, 192_800, 202_900]
    assert requests(frame)["overflow"].to_list() == [False] * 17 + [True] * 3
    assert frame["cost_total"].null_count() == 0


# -- session memory -------------------------------------------------------------------------


def _memory_session(filler: int, result: int, n: int) -> Script:
    """Request 0: a `filler`-token user message; rounds 1..n, each 100 assistant text +
    100 tool_use + a Read result (one text message per round)."""
    s = Script()
    s.user(filler)
    s.request()
    for _ in range(n):
        s.say(100)
        s.tool("Read", result)
        s.request()
    return s


@pytest.mark.parametrize(
    ("filler", "result", "n", "at", "tail"),
    [
        # Rounds of 3,200 from 150,000: request 5 166,000, request 6 169,200: due. From
        # the newest, 5 rounds give 5 text messages and 16,000 tokens (>= 10,000): kept.
        (140_000, 3_000, 6, 6, 16_000),
        # Rounds of 1,000: request 16 166,000, request 17 167,000: due. 5 rounds have the
        # 5 texts but only 5,000 tokens: 10 rounds are kept (10,000).
        (140_000, 800, 17, 17, 10_000),
    ],
)
def test_session_memory_keeps_a_tail_and_replaces_the_rest(
    filler: int, result: int, n: int, at: int, tail: int
) -> None:
    """The session memory (4,000 tokens) replaces everything before the tail: prefix
    10,000 + 4,000 + tail. One "session-memory" row: the conversation forked with the
    700-token prompt, writing the memory (4,000 output); no full compaction."""
    size = 200 + result
    frame, state = run(
        _memory_session(filler, result, n), {**AUTO, "autocompact.session_memory.enabled": True}
    )
    before = 10_000 + filler + size * n
    assert compactions(frame) == [(at, "session-memory")]
    mem = row(frame, at, "compaction")
    assert (mem["context_tokens"], mem["output"]) == (before + 700, 4_000)
    assert contexts(frame)[at - 1 :] == [before - size, 14_000 + tail]
    assert state.auto.compactions == 0


def test_session_memory_falls_back_to_a_full_compaction_beyond_the_tail_cap() -> None:
    """Rounds of 12,200 from 110,000: request 5 (171,000) is due. From the newest, 3
    rounds make 36,600 tokens and 3 texts; a 4th would pass the 40,000 cap before 5
    texts: no session memory, a full compaction (10,000 + 3,000 after)."""
    frame, _ = run(
        _memory_session(100_000, 12_000, 5), {**AUTO, "autocompact.session_memory.enabled": True}
    )
    assert compactions(frame) == [(5, "autocompact")]
    assert row(frame, 5, "compaction")["context_tokens"] == 171_700
    assert contexts(frame)[4:] == [158_800, 13_000]


# -- presets --------------------------------------------------------------------------------


def test_claude_code_at_latest_names_the_newest_preset() -> None:
    latest, named = policy.build("claude-code@latest"), policy.build("claude-code@2.1.221")
    assert latest.params == named.params
    assert latest.version == named.version == "2.1.221"
    assert set(PRESETS) <= set(policy.names())
    # `claude-code` itself is the version-matched policy: BASE plus what it was given.
    matched = policy.build("claude-code", {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "60"})
    assert matched.version == "matched"
    assert matched.spec().params == (("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "60"),)


@pytest.mark.parametrize(
    ("client", "preset"),
    [
        ("claude-code 1.0.53", "claude-code@1.0"),
        ("claude-code 2.1.6", "claude-code@2.1.6"),
        ("claude-code 2.1.9", "claude-code@2.1.6"),
        ("claude-code 2.1.10", "claude-code@2.1.88"),
        ("claude-code 2.1.29", "claude-code@2.1.88"),
        ("claude-code 2.1.91", "claude-code@2.1.88"),
        ("claude-code 2.1.92", "claude-code@2.1.92"),
        ("claude-code 2.1.143", "claude-code@2.1.92"),
        ("claude-code 2.1.144", "claude-code@2.1.144"),
        ("claude-code 2.1.199", "claude-code@2.1.144"),
        ("claude-code 2.1.200", "claude-code@2.1.221"),
        ("claude-code 2.1.237", "claude-code@2.1.221"),
        ("claude-code 2.0.76", "claude-code@2.1.6"),
        ("", "claude-code@latest"),
        ("claude-code unknown", "claude-code@latest"),
    ],
)
def test_preset_for_a_recording_client(client: str, preset: str) -> None:
    assert preset_for(client) == preset


#: Parameters whose values are words or tri-states: a changed value of each.
CHANGED: dict[str, Any] = {
    "autocompact.pct_format": "fraction",
    "window_1m": True,
    "autocompact.threshold_fraction": 0.5,
}


def _changed(value: Any, key: str = "") -> Any:
    """A different value of the same shape, for every parameter type in BASE."""
    if key in CHANGED:
        return CHANGED[key] if value != CHANGED[key] else None
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 + 0.25  # 0.0 changes too
    if value is None:
        return 1_234
    if isinstance(value, str):
        return "1h" if value != "1h" else "5m"
    if isinstance(value, list):
        return value[:-1]
    if isinstance(value, dict):
        return {**value, "Glob": 7}
    raise AssertionError(f"no change for {value!r}")


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("changed", [False, True])
def test_every_preset_and_parameter_round_trips(name: str, changed: bool) -> None:
    defaults = policy.get(name).defaults
    params = {k: _changed(v, k) for k, v in defaults.items()} if changed else {}
    p = policy.build(name, params)
    if changed:
        assert all(p.params[k] != v for k, v in defaults.items())
    spec = p.spec()
    q = policy.from_spec(spec)
    assert type(q) is type(p) and q.params == p.params and q.spec() == spec
    # Through JSON, as a run's manifest stores it.
    data = orjson.loads(orjson.dumps(spec.as_dict()))
    r = policy.build(data["name"], data["params"])
    assert r.params == p.params and r.spec().param_hash == spec.param_hash
    # Pickled, as a process pool ships it.
    loaded = pickle.loads(pickle.dumps(p))
    assert type(loaded) is type(p) and loaded.params == p.params
    assert loaded.spec() == spec


def test_a_pickled_policy_replays_identically() -> None:
    p = policy.build(NEWEST, AUTO)
    trace = uniform(17).trace()
    original = replay([("t", trace)], p)
    copied = replay([("t", trace)], pickle.loads(pickle.dumps(p)))
    assert original.equals(copied)
    assert compactions(original) == [(16, "autocompact")]


# -- running indices (issue 16): the same replay as the rescans they replaced ----------------


def snip_rescan(self: Snip, conv: Conversation, estimate: int, effective: int) -> int:
    """Snip as it was before the group index: the groups walked from scratch, the groups
    to drop collected as a set and removed wherever they are."""
    if not self.enabled or estimate < self.trigger * effective:
        return 0
    groups = conv.groups()
    if len(groups) <= self.head + self.tail:
        return 0
    bounds = [*groups, len(conv.items)]
    goal = estimate - int(self.target * effective)
    freed = 0
    drop: set[int] = set()
    for g in range(self.head, len(groups) - self.tail):
        if freed >= goal:
            break
        for key in conv.items[bounds[g] : bounds[g + 1]]:
            drop.add(key)
            freed += conv.item(key)[1]
    if not drop:
        return 0
    conv.remove_blocks(drop, edit="snip")
    self.snips += 1
    return freed


TOOLS = ("Bash", "Read", "skill")


@st.composite
def scripted_rounds(draw: st.DrawFn) -> Trace:
    """Rounds of three tools, human turns, idle gaps (time-based microcompact), rewinds
    and stripped blocks (items leaving: the indexes rebuild), assistant text."""
    s = Script(prefix=2_000)
    s.user(draw(st.integers(10, 400)))
    s.request()
    blocks: list[int] = []
    for _ in range(draw(st.integers(5, 40))):
        gap = MINUTE
        action = draw(
            st.sampled_from(("round", "round", "round", "user", "say", "gap", "rewind", "strip"))
        )
        if action == "round":
            use, result = s.tool(draw(st.sampled_from(TOOLS)), draw(st.integers(1, 9_000)))
            blocks += [use, result]
        elif action == "user":
            blocks.append(s.user(draw(st.integers(5, 300))))
        elif action == "say":
            blocks.append(s.say(draw(st.integers(5, 300))))
        elif action == "gap":
            gap = 61 * MINUTE
        elif action == "rewind" and blocks:
            for block in blocks[-draw(st.integers(1, min(4, len(blocks)))) :]:
                s.b.hide(block, s.k)
        elif action == "strip" and blocks:
            s.b.strip(draw(st.sampled_from(blocks)), s.k)
        s.request(gap)
    return s.trace()


#: (class, attribute, replacement): one method swapped for the time of one replay.
Patch = tuple[type, str, Any]


def _assert_same_replay(
    trace: Trace, built: Any, indexed: Patch, rescan: Patch, loss: bool = False
) -> None:
    """The replay with the `indexed` method (a checking wrapper of the running index) gives
    the rows and edits of the replay with the `rescan` one (the walk it replaced)."""
    results = []
    for target, name, method in (indexed, rescan):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(target, name, method)
            edits: list[Any] = []
            frame = replay([("t", trace)], built, edits=edits, loss=loss)
            results.append((frame, edits))
    (rows, edits), (want_rows, want_edits) = results
    assert rows.equals(want_rows)
    assert edits == want_edits


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=scripted_rounds(),
    trigger=st.sampled_from((0.001, 0.01, 0.05, 0.2)),
    target=st.sampled_from((0.0005, 0.005, 0.02)),
    head=st.integers(0, 2),
    tail=st.integers(0, 3),
    cached=st.booleans(),
    preset=st.sampled_from((NEWEST, "claude-code@2.1.221")),
)
def test_the_group_index_and_snip_match_the_rescan(
    trace: Trace, trigger: float, target: float, head: int, tail: int, cached: bool, preset: str
) -> None:
    """Snip over the group index (policies/claude_code/groups.py) gives the rows and edits
    of snip over the walk of the whole conversation, and at every request it asks, the
    index equals the walk."""
    params = {
        "snip.enabled": True,
        "snip.trigger_fraction": trigger,
        "snip.target_fraction": target,
        "snip.keep_head_groups": head,
        "snip.keep_tail_groups": tail,
        "microcompact.time_based.enabled": True,
        "microcompact.cached.enabled": cached,
        "microcompact.cached.trigger_count": 3,
        "microcompact.cached.keep": 1,
        "budget.per_message.enabled": True,
        "budget.per_message.max_chars": 20_000,
    }
    asked = 0
    indexed = GroupIndex.__call__

    def checked(self: GroupIndex, conv: Conversation) -> list[int]:
        nonlocal asked
        asked += 1
        got = indexed(self, conv)
        assert got == conv.groups()
        return got

    _assert_same_replay(
        trace,
        policy.build(preset, params),
        (GroupIndex, "__call__", checked),
        (Snip, "run", snip_rescan),
    )
    if trigger == 0.001 and len(trace.sessions[0].requests) > 2:
        assert asked > 0  # snip was due at every request after the first (2,000 > 180)


def test_the_group_index_follows_appends_and_rebuilds_when_items_leave() -> None:
    """Hand-checked: [user, use0, result0, use1, result1] is two groups after the user
    run (starts 0, 1, 3); appending a user turn adds a start, and dropping the first
    round (the epoch moves) re-walks: starts 0, 1, 3 again over the shorter items."""
    s = Script(prefix=2_000)
    s.user(100)
    s.request()
    s.rounds(2, "Bash", 500)
    s.user(50)
    s.request()
    frame_trace = s.trace()
    seen: list[list[int]] = []
    index = GroupIndex()

    def transform(self: Any, k: int, out: Any) -> dict[str, bool]:
        seen.append(list(index(self.conv)))
        if k == 3:
            self.conv.remove_blocks({1, 2})
            seen.append(list(index(self.conv)))
        return {}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_State, "transform", transform)
        replay([("t", frame_trace)], policy.build(NEWEST))
    assert seen == [[0], [0, 1], [0, 1, 3], [0, 1, 3, 5], [0, 1, 3]]


def collapse_walk(self: Collapse, conv: Conversation) -> Span | None:
    """The span a commit took before the indexes: every group walked, then every one
    before the first that does not open with a collapse summary scanned past."""
    groups = conv.groups()
    first = next(
        (
            i
            for i, g in enumerate(groups)
            if conv.items[g] >= 0 or conv.synthetic[conv.items[g]].kind != "collapse"
        ),
        None,
    )
    if first is None:
        return None
    end = min(first + self.span_groups, len(groups) - self.keep_tail)
    if end <= first:
        return None
    bounds = [*groups, len(conv.items)]
    return Span(first, end, bounds[first], bounds[end])


def collapse_rescan(self: _State, out: Any, ttl: int) -> None:
    """A commit as it was before the indexes: the view copied, the span found by the
    walk, its tokens summed, the summary request priced on the copy."""
    conv, stage = self.conv, self.collapse
    before = conv.sync().copy()
    span = collapse_walk(stage, conv)
    if span is None:
        return
    tokens = sum(conv.item(k)[1] for k in conv.items[span.lo : span.hi])
    summary = conv.add_synthetic(max(1, int(tokens * stage.ratio)), "collapse", stage.commits)
    conv.replace_range(span.lo, span.hi, [summary], edit="collapse")
    stage.commits += 1
    before.append(-1, chain(conv.ctx.root, 0xC011), int(self.p["collapse.prompt_tokens"]))
    marks = self.breakpoints(before, ttl, fork=True)
    out.call(before, Call("compaction", "collapse", marks, conv.synthetic[summary].tokens))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=scripted_rounds(),
    commit=st.sampled_from((0.001, 0.01, 0.05, 0.2)),
    span_groups=st.integers(1, 4),
    tail=st.integers(0, 3),
    ratio=st.sampled_from((0.1, 0.5)),
    snip=st.booleans(),
)
def test_the_indexed_collapse_commits_the_spans_of_the_walk(
    trace: Trace, commit: float, span_groups: int, tail: int, ratio: float, snip: bool
) -> None:
    """Collapse over its group index and its count of leading summaries
    (policies/claude_code/collapse.py) picks, at every commit it tries, the span the walk
    of the whole conversation picks, and the replay (rows with the loss columns, and
    edits) is the one of the commits as they were: walk, copied view. Snip, when on,
    removes groups in between (the index rebuilds); rewinds and strips move items."""
    params = {
        "collapse.enabled": True,
        "collapse.commit_fraction": commit,
        "collapse.block_fraction": min(0.95, 2 * commit),
        "collapse.span_groups": span_groups,
        "collapse.keep_tail_groups": tail,
        "collapse.summary_ratio": ratio,
        "snip.enabled": snip,
        "snip.trigger_fraction": 0.01,
        "snip.target_fraction": 0.005,
        "microcompact.time_based.enabled": True,
    }
    tried = committed = 0
    room = False  # an attempt found more groups than the kept tail before any commit
    indexed = Collapse.span

    def checked(self: Collapse, conv: Conversation) -> Span | None:
        nonlocal tried, committed, room
        tried += 1
        room = room or (not committed and len(conv.groups()) > self.keep_tail)
        got = indexed(self, conv)
        assert got == collapse_walk(self, conv)
        assert self.groups(conv) == conv.groups()
        committed += got is not None
        return got

    _assert_same_replay(
        trace,
        policy.build(NEWEST, params),
        (Collapse, "span", checked),
        (_State, "_collapse", collapse_rescan),
        loss=True,
    )
    if commit <= 0.01 and not snip and room:
        # Due at every request (1,800 tokens of 180,000 at most), and a group to commit.
        assert committed > 0


def test_collapse_commits_repair_the_group_index_and_skip_the_summaries() -> None:
    """Hand-checked, 2 groups a span, 1 kept: [user, use1, result1, use2, result2, use3,
    result3] is groups 0, 1, 3, 5. The first commit replaces groups 0-1 (items 0-2) by a
    summary S1: [S1, use2, result2, use3, result3], groups 0, 1, 3. The second starts
    after S1: min(1 + 2, 3 - 1) = 2, group 1 (items 1-2) becomes S2: groups 0, 1, 2. The
    third starts at group 2 and would end at min(4, 2): nothing to commit."""
    s = Script(prefix=2_000)
    s.user(100)
    s.request()
    s.rounds(3, "Bash", 500)
    seen: list[Any] = []
    stage = Collapse({**BASE, "collapse.span_groups": 2, "collapse.keep_tail_groups": 1})

    def transform(self: Any, k: int, out: Any) -> dict[str, bool]:
        if k == 3:
            conv = self.conv
            for _ in range(3):
                span = stage.span(conv)
                seen.append((span, list(stage.groups(conv)), conv.groups()))
                if span is not None:
                    stage.replace(conv, span)
        return {}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_State, "transform", transform)
        replay([("t", s.trace())], policy.build(NEWEST))
    assert seen == [
        (Span(0, 2, 0, 3), [0, 1, 3, 5], [0, 1, 3, 5]),
        (Span(1, 2, 1, 3), [0, 1, 3], [0, 1, 3]),
        (None, [0, 1, 2], [0, 1, 2]),
    ]
    assert stage.groups.generation == 1  # built once, repaired after each commit
    assert stage.commits == 2
