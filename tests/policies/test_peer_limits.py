"""Every peer policy states its own limits (simulator/policy.py `Limits`), and the stated
threshold is where it really acts.

The sessions are `tests/support/scripted.py` scripts (its conventions: a 10,000-token prefix, no
recorded usage, 4 characters per token, a round being a 100-token tool_use and its result,
each request's output the tokens of its response). Model: Sonnet 4.5, a 200,000-token
window and 64,000 tokens of max output. A stated threshold is the smallest count (in the
units the policy compares) at which it acts: a policy whose rule is "more than X" states
X + 1. Every expectation is a literal computed by hand (derivation beside it).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.peers.gemini_cli import GeminiCliSession
from policies.peers.goose import GooseSession
from simulator import policy
from simulator.policy import Limits
from simulator.replay import ReplayOptions, replay, session_context
from tests.support.scripted import Script, compactions

PREFIX = 10_000
#: Requests 0-4 of `climb`: 11,000, then 1,000 more a request (rounds of 100 + 900).
SMALL_ROUNDS = 4
BEFORE_CLIMB = PREFIX + 1_000 + 1_000 * SMALL_ROUNDS  # request 4's view: 15,000
CLIMB = SMALL_ROUNDS + 1  # the request whose view is `view`


def climb(view: int, *, human_after: bool = False) -> Script:
    """Request 0: a 1,000-token human message; requests 1-4: rounds of 1,000; request 5: a
    round that brings the view to exactly `view`; request 6: a round of 1,000 (and, with
    `human_after`, a 500-token human message). Request 5's output (request 6's tool_use)
    is 100 tokens, so a policy counting the last usage + output sees `view` + 100 at 6."""
    s = Script(prefix=PREFIX)
    s.user(1_000)
    s.request()
    s.rounds(SMALL_ROUNDS, 900)
    s.rounds(1, view - BEFORE_CLIMB - 100)
    s.tool(900)
    if human_after:
        s.user(500)
    s.request()
    return s


def run(script: Script, name: str, params: dict[str, Any] | None = None) -> pl.DataFrame:
    return replay([("t", script.trace())], policy.build(name, params or {}))


def stated(frame: pl.DataFrame) -> tuple[list[int | None], list[int | None]]:
    """The distinct threshold and blocking limit every row of a replay carries."""
    return (
        frame["threshold_tokens"].unique().to_list(),
        frame["blocking_tokens"].unique().to_list(),
    )


def edits_at(frame: pl.DataFrame, request: int) -> int:
    """Edits (truncation, clearing) made before request `request`'s own call."""
    rows = frame.filter((pl.col("request") == request) & (pl.col("kind") == "request"))
    return int(rows["edits"].item())


# -- what each peer states -------------------------------------------------------------------

STATED = [
    # Cline's table: 200,000 - 40,000.
    ("cline", {}, 160_000),
    ("cline", {"reserve_tokens": 50_000}, 150_000),
    # 0.5 x 200,000; the older versions' 0.7 x 200,000.
    ("gemini-cli", {}, 100_000),
    ("gemini-cli", {"compression_threshold": 0.7}, 140_000),
    # The input limit 200,000 - min(20,000, max output 64,000); with an 8,000 max output
    # 200,000 - 8,000; with an input limit of 150,000: 130,000.
    ("opencode", {}, 180_000),
    ("opencode", {"max_output_tokens": 8_000}, 192_000),
    ("opencode", {"input_limit_tokens": 150_000}, 130_000),
    # min(max(200,000 / 16, 1,024), 8,192) = 8,192; summarised above it: 8,193. With
    # --max-chat-history-tokens 20,000: 20,001.
    ("aider", {}, 8_193),
    ("aider", {"history.max_tokens_override": 20_000}, 20_001),
    # tokens / 200,000 > 0.8: from 160,001 (0.6: 120,001).
    ("goose", {}, 160_001),
    ("goose", {"threshold": 0.6}, 120_001),
    # More than the trigger's input tokens.
    ("anthropic-context-editing", {}, 100_001),
    ("anthropic-context-editing", {"trigger_tokens": 30_000}, 30_001),
    ("anthropic-server-compaction", {}, 150_001),
    ("anthropic-server-compaction", {"trigger_tokens": 60_000}, 60_001),
    # More than int(0.9 x 200,000) = 180,000; int(0.5 x 200,000) = 100,000.
    ("sliding-window", {}, 180_001),
    ("sliding-window", {"trigger_fraction": 0.5, "target_fraction": 0.4}, 100_001),
    # min(unset, 0.9 x 200,000): the session logs no window.
    ("codex", {}, 180_000),
]


@pytest.mark.parametrize(("name", "params", "threshold"), STATED)
def test_every_row_carries_the_threshold_the_policy_states(
    name: str, params: dict[str, Any], threshold: int
) -> None:
    frame = run(climb(40_000), name, params)
    assert stated(frame) == ([threshold], [None])


@pytest.mark.parametrize("name", ["openhands", "llm-summary", "masking", "swe-agent", "none"])
def test_policies_without_a_token_trigger_state_no_threshold(name: str) -> None:
    """Event, turn and observation counts are not sizes: no threshold, no blocking limit
    (the window); `none` states nothing at all."""
    frame = run(climb(190_000), name)
    assert stated(frame) == ([None], [None])


def test_count_triggered_policies_state_their_limits_explicitly() -> None:
    """Stated (a `Limits` with no threshold), not left unstated like `none`."""
    trace = climb(40_000).trace()
    ctx = session_context("t", trace.sessions[0], ReplayOptions())
    for name in ("openhands", "llm-summary", "masking", "swe-agent"):
        assert policy.build(name).session(ctx).limits() == Limits(None, None)
    assert policy.build("none").session(ctx).limits() is None
    assert policy.build("goose", {"threshold": 0}).session(ctx).limits() == Limits(None, None)


def test_goose_switched_off_states_no_threshold() -> None:
    """A threshold <= 0 or >= 1 turns goose's compaction off: no line to draw."""
    for share in (0.0, 1.0):
        frame = run(climb(40_000), "goose", {"threshold": share})
        assert stated(frame) == ([None], [None])


# -- the stated threshold is where the policy acts --------------------------------------------


@pytest.mark.parametrize("delta", [-1, 0])
def test_sliding_window_cuts_at_the_stated_view(delta: int) -> None:
    """The view itself is compared: request 5 holds 180,001 + delta tokens."""
    frame = run(climb(180_001 + delta), "sliding-window")
    assert stated(frame)[0] == [180_001]
    assert edits_at(frame, CLIMB) == (1 if delta >= 0 else 0)


@pytest.mark.parametrize("delta", [-1, 0])
def test_anthropic_server_compaction_compacts_at_the_stated_input(delta: int) -> None:
    """Request 5's input is 150,001 + delta; one below, the compaction waits for request
    6 (151,000 + delta)."""
    frame = run(climb(150_001 + delta), "anthropic-server-compaction", {"summary_tokens": 2_000})
    assert stated(frame)[0] == [150_001]
    assert compactions(frame) == [(CLIMB if delta >= 0 else CLIMB + 1, "server-compact")]


@pytest.mark.parametrize("delta", [-1, 0])
def test_anthropic_context_editing_clears_at_the_stated_prompt(delta: int) -> None:
    """At request 5 the results R1-R5 are sent; clearing keeps the newest 3 (R1, R2 go):
    one request earlier nothing is over the trigger."""
    frame = run(climb(100_001 + delta), "anthropic-context-editing")
    assert stated(frame)[0] == [100_001]
    assert edits_at(frame, CLIMB) == (2 if delta >= 0 else 0)


@pytest.mark.parametrize("delta", [-1, 0])
def test_gemini_cli_compresses_at_the_stated_estimate(delta: int) -> None:
    """The estimate at request 5 is request 4's view and output (15,100) plus length / 4 of
    the new result: the view itself, 100,000 + delta."""
    frame = run(climb(100_000 + delta), "gemini-cli", {"summary_tokens": 2_000})
    assert stated(frame)[0] == [100_000]
    at = CLIMB if delta >= 0 else CLIMB + 1  # one below: request 6, 100,999
    assert compactions(frame) == [(at, "compress"), (at, "verify")]


@pytest.mark.parametrize("delta", [-1, 0])
def test_aider_summarises_at_the_stated_history(delta: int) -> None:
    """Aider counts the history without the 10,000-token prefix: request 5's view of
    18,193 + delta is 8,193 + delta of history (the tail then keeps the newest group of
    3,193 + delta, and the head of 5,000 is summarised). One below, the history waits for
    request 6 (9,192); after a summary at 5 the history is 511 + 3,193 + 1,000 at 6."""
    frame = run(climb(PREFIX + 8_193 + delta), "aider", {"summary_tokens": 500})
    assert stated(frame)[0] == [8_193]
    assert compactions(frame) == [(CLIMB if delta >= 0 else CLIMB + 1, "summarize")]


@pytest.mark.parametrize("delta", [-1, 0])
def test_cline_truncates_at_the_stated_usage(delta: int) -> None:
    """Cline compares the last usage + output: at request 6, request 5's view + 100, so a
    view of 159,900 + delta at request 5 is a count of 160,000 + delta at 6."""
    frame = run(climb(160_000 - 100 + delta), "cline")
    assert stated(frame)[0] == [160_000]
    assert edits_at(frame, CLIMB) == 0
    assert edits_at(frame, CLIMB + 1) == (1 if delta >= 0 else 0)


@pytest.mark.parametrize("delta", [-1, 0])
def test_opencode_compacts_at_the_stated_usage(delta: int) -> None:
    """opencode compares the last usage + output, as Cline: 179,900 + delta at request 5
    is 180,000 + delta at request 6."""
    frame = run(climb(180_000 - 100 + delta), "opencode", {"summary_tokens": 2_000})
    assert stated(frame)[0] == [180_000]
    assert compactions(frame) == ([(CLIMB + 1, "compact")] if delta >= 0 else [])


@pytest.mark.parametrize("delta", [-1, 0])
def test_goose_compacts_at_the_stated_count_when_the_user_writes(delta: int) -> None:
    """Goose checks when a human message arrives (request 6): its count is request 5's
    view + output, 160,001 + delta."""
    frame = run(climb(160_001 - 100 + delta, human_after=True), "goose", {"summary_tokens": 2_000})
    assert stated(frame)[0] == [160_001]
    assert compactions(frame) == ([(CLIMB + 1, "compact")] if delta >= 0 else [])


# -- the stated threshold is the trigger's own rule, for every share and window ---------------


@given(
    share=st.floats(min_value=1e-6, max_value=1 - 1e-6, allow_nan=False),
    window=st.integers(min_value=1, max_value=2_000_000),
)
def test_goose_threshold_is_the_first_count_over_the_share(share: float, window: int) -> None:
    """t / window > share as goose divides, for t at the threshold and not one below (the
    ratio grows with t, so that is the whole rule)."""
    at = GooseSession.threshold_tokens(SimpleNamespace(threshold=share, window=window))  # type: ignore[arg-type]
    assert at is not None
    assert at / window > share
    assert not (at - 1) / window > share


@given(
    share=st.floats(min_value=1e-6, max_value=1.0, allow_nan=False),
    window=st.integers(min_value=1, max_value=2_000_000),
)
def test_gemini_threshold_is_the_first_count_at_the_share(share: float, window: int) -> None:
    """The estimate compresses at share x window: the threshold reaches it, one below not."""
    state = SimpleNamespace(fraction=share, window=window)
    at = GeminiCliSession.threshold_tokens(state)  # type: ignore[arg-type]
    assert at >= share * window > at - 1
    assert at == math.ceil(share * window)
