"""Each Claude Code preset's window and threshold, and Claude Code's settings under their
real names, on hand-built sessions (policies/claude_code/settings.py, policy.py).

Conventions as in tests/policies/claude_code/test_claude_code_stages.py: the prefix is set
explicitly (10,000 tokens), no recorded usage unless a test gives it, 4 characters per token, so the
autocompact estimate equals the context. A "fire" session: request 0 holds 11,000 tokens
(prefix + a 1,000-token user message); request 1 adds a 100-token tool_use and a Read
result of R tokens, so its estimate is 11,100 + R.

Reserve min(32,000, model max output, 20,000) = 20,000 everywhere here, so on a window W
the default threshold is W - 33,000: 167,000 on 200k, 367,000 on 400k, 967,000 on 1M.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import polars as pl
import pytest

from policies.claude_code.autocompact import Autocompact
from policies.claude_code.settings import client_window, env_truthy, pct_share
from simulator import policy
from simulator.model import CompactionEvent, Kind, Role, Session, Trace
from simulator.models import session_facts
from simulator.replay import replay
from tests.support.scripted import compactions
from traces.builder import Hasher, RecordedUsage, SessionBuilder

T0 = 1_760_000_000_000
MINUTE = 60_000
OPUS5 = "claude-opus-5"  # genai-prices: 1,000,000
OPUS46 = "claude-opus-4-6"  # 200,000 unless [1m] or a recorded context above it
SONNET5 = "claude-sonnet-5"
SONNET45 = "claude-sonnet-4-5-20250929"  # 200,000
AUTO: dict[str, Any] = {"autocompact.summary_tokens": 3_000, "autocompact.restore_extra_tokens": 0}


def _session(
    client: str, model: str, results: list[int], *, usage: list[int] | None = None
) -> Session:
    """Request 0: a 1,000-token user message; request i (1..): a 100-token tool_use and a
    Read result of results[i-1] tokens. `usage`: recorded input tokens per request."""
    b = SessionBuilder(Hasher(b"presets"), id="s", kind="main", client=client)
    b.prefix_tokens = 10_000
    msg = 0
    for k in range(len(results) + 1):
        if k == 0:
            b.add_block(
                msg=msg, kind=Kind.TEXT, role=Role.USER, text="u".ljust(4_000, "x"),
                ts=T0, first_request=0, tokens=1_000,
            )  # fmt: skip
        else:
            uid = f"t{k}"
            msg += 1
            b.add_block(
                msg=msg, kind=Kind.TOOL_USE, role=Role.ASSISTANT, text=f"#{k}#".ljust(400, "x"),
                ts=T0 + k * MINUTE, first_request=k, tokens=100, origin=k - 1, tool="Read",
                use_id=uid,
            )  # fmt: skip
            msg += 1
            tokens = results[k - 1]
            b.add_block(
                msg=msg, kind=Kind.TOOL_RESULT, role=Role.USER,
                text=f"r{k}#".ljust(4 * tokens, "x"), ts=T0 + k * MINUTE, first_request=k,
                tokens=tokens, tool="Read", result_for=uid,
            )  # fmt: skip
        recorded = None if usage is None else RecordedUsage(usage[k], 0, 0, 0, 100)
        b.add_request(ts=T0 + k * MINUTE, model=model, usage=recorded)
    return b.finish()


def _threshold(preset: str, session: Session, params: dict[str, Any] | None = None) -> int:
    """The autocompact threshold the preset computes for the session (0: autocompact off)."""
    p = policy.build(preset, params or {}).params
    model = session.models[0]
    f = session_facts(session, model)
    auto = Autocompact(p)
    blocking = auto.limits(200_000, f.max_output).blocking
    window, allowed = client_window(session, model, f.window, p, blocking=blocking)
    if not (auto.enabled and allowed):
        return 0
    return auto.limits(window, f.max_output).threshold


def _fires(preset: str, client: str, model: str, result: int, params: dict[str, Any]) -> bool:
    trace = Trace("claude-code", "t", [_session(client, model, [result])])
    frame = replay([("t", trace)], policy.build(preset, {**AUTO, **params}))
    return compactions(frame) == [(1, "autocompact")]


# -- the window and threshold of each preset ------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "model", "threshold"),
    [
        # 2.1.2x-2.1.8x: at most 200,000 whatever the model: 167,000.
        ("claude-code@2.1.88", OPUS5, 167_000),
        ("claude-code@2.1.6", OPUS5, 155_000),  # reserve the whole 32,000: 168,000 - 13,000
        # 2.1.92-2.1.199: the model's 1M in full (Opus 4.6 capped at 400,000, see below).
        ("claude-code@2.1.92", OPUS5, 967_000),
        ("claude-code@2.1.144", OPUS5, 967_000),
        ("claude-code@2.1.221", OPUS5, 967_000),
        # sonnet-5's own autocompact window in 2.1.2xx: 967,000 - 33,000.
        ("claude-code@2.1.221", SONNET5, 934_000),
        ("claude-code@2.1.144", SONNET5, 967_000),
        # a 200k model: 167,000 in every 2.x preset since 2.1.10.
        ("claude-code@2.1.221", SONNET45, 167_000),
        ("claude-code@2.1.92", SONNET45, 167_000),
    ],
)
def test_threshold_of_each_preset(preset: str, model: str, threshold: int) -> None:
    assert _threshold(preset, _session("claude-code 2.1.221", model, [100])) == threshold


@pytest.mark.parametrize(
    ("preset", "threshold"),
    # 2.1.92 and 2.1.144 cap Opus 4.6's 1M autocompact window at 400,000: 367,000;
    # 2.1.2xx computes on the whole 1M: 967,000; 2.1.88 on 200,000: 167,000.
    [
        ("claude-code@2.1.92", 367_000),
        ("claude-code@2.1.144", 367_000),
        ("claude-code@2.1.221", 967_000),
        ("claude-code@2.1.88", 167_000),
    ],
)
def test_opus_4_6_on_its_1m_window(preset: str, threshold: int) -> None:
    assert _threshold(preset, _session("c", OPUS46 + "[1m]", [100])) == threshold


def test_the_1m_window_is_inferred_from_a_recorded_context_above_200k() -> None:
    """Opus 4.6 without [1m]: 200,000 (threshold 167,000) until a recorded context above
    200,000 says the 1M window was on (967,000 in 2.1.2xx)."""
    small = _session("c", OPUS46, [100, 100], usage=[11_000, 11_200, 11_400])
    large = _session("c", OPUS46, [100, 100], usage=[11_000, 11_200, 250_000])
    assert _threshold("claude-code@2.1.221", small) == 167_000
    assert _threshold("claude-code@2.1.221", large) == 967_000
    assert session_facts(large).window == 1_000_000
    assert session_facts(small).window == 200_000


def test_a_recorded_auto_compaction_below_200k_says_the_client_computed_on_200k() -> None:
    """An Opus 5 session (1M) whose recording auto-compacted at 166,000 tokens: 200,000."""
    from simulator.model import CompactionEvent

    s = _session("c", OPUS5, [100, 100], usage=[11_000, 11_200, 250_000])
    s.events.append(CompactionEvent(2, "auto", 166_000, -1, T0))
    assert _threshold("claude-code@2.1.221", s) == 167_000
    s.events[0] = CompactionEvent(2, "manual", 166_000, -1, T0)  # a /compact says nothing
    assert _threshold("claude-code@2.1.221", s) == 967_000


@pytest.mark.parametrize(
    ("reached", "threshold"),
    # Above 177,000 (200,000 - 20,000 - 3,000) without compacting: not the 200k window,
    # where the client compacts from 167,000 or refuses to send from 177,000; up to it, an
    # autocompact switched off on 200k could have sent it.
    [(177_001, 967_000), (177_000, 167_000)],
)
def test_a_context_past_the_200k_blocking_limit_says_the_1m_window(
    reached: int, threshold: int
) -> None:
    s = _session("claude-code 2.1.232", OPUS46, [100], usage=[11_000, reached])
    assert _threshold("claude-code@2.1.221", s) == threshold


def test_past_the_blocking_limit_a_200k_auto_compaction_still_says_200k() -> None:
    s = _session("claude-code 2.1.232", OPUS46, [100, 100], usage=[11_000, 190_000, 60_000])
    s.events.append(CompactionEvent(2, "auto", 166_000, -1, T0 + 2 * MINUTE))
    assert _threshold("claude-code@2.1.221", s) == 167_000


def _two_processes(event_at: int = 3) -> Session:
    """An Opus 5 session whose recording reached 210,100 tokens at request 1 without
    compacting (a process on the 1M window), then auto-compacted at `event_at` (preTokens
    210,300; recorded context 30,000 from then on) and again at 5 below 200,000 (a process
    on the 200k window). The blocks are sized as sent before `event_at` (usage equal to
    them, so every estimate is the context); the recorded contexts after the compaction
    only tell the window rule what the client did."""
    results = [199_000, 100, 100, 100, 100]
    usage = [11_000]
    for r in results:
        usage.append(usage[-1] + 100 + r)
    s = _session("claude-code 2.1.226", OPUS5, results, usage=usage)
    from simulator.model import CompactionEvent

    s.requests["input"][event_at:] = 30_000
    s.events.append(CompactionEvent(event_at, "auto", 210_300, -1, T0))
    s.events.append(CompactionEvent(5, "auto", 166_000, -1, T0))
    return s


def test_the_window_is_the_sending_processs_from_the_compaction_that_ends_the_longer_one() -> None:
    """Requests before the first auto-compaction after the last context above 200,000 ran
    on that context's 1M window (threshold 967,000): no compaction at 210,100 (request 1)
    or 210,200 (2); from request 3 on the standard one (167,000): the policy compacts at 3,
    where the recording did (policies/claude_code/settings.py `standard_window_from`)."""
    from policies.claude_code.settings import standard_window_from

    s = _two_processes()
    assert standard_window_from(s) == 3
    frame = replay(
        [("t", Trace("claude-code", "t", [s]))], policy.build("claude-code@2.1.221", AUTO)
    )
    assert compactions(frame) == [(3, "autocompact")]
    # window_1m pins one window for the whole session: on 200k the policy compacts at 2
    # (at 1 the summary request, 210,800 tokens, is refused as longer than the window).
    pinned = policy.build("claude-code@2.1.221", {**AUTO, "window_1m": False})
    frame = replay([("t", Trace("claude-code", "t", [s]))], pinned)
    assert compactions(frame)[0] == (2, "autocompact")


def test_no_switch_without_a_context_above_200k_or_an_auto_compaction_after_it() -> None:
    from policies.claude_code.settings import standard_window_from

    s = _two_processes()
    s.events[:] = [e for e in s.events if e.request != 3]
    assert standard_window_from(s) == 5  # the compaction at 5 follows the last 200k+ request
    s.events[:] = []
    assert standard_window_from(s) == 0
    s = _two_processes()
    s.events[:] = [replace(e, trigger="manual") for e in s.events]
    assert standard_window_from(s) == 0  # a /compact runs in the same process
    small = _session("c", OPUS5, [100, 100], usage=[11_000, 11_200, 11_400])
    assert standard_window_from(small) == 0


def _two_line_session(result: int, client: str, logged_output: int) -> Session:
    """Request 0: a 1,000-token message; its response has two lines, a 100-token text (the
    first) and a 2,000-token tool_use (8,000 characters); request 1 adds the tool's result
    of `result` tokens. The last usage is 11,000 in + `logged_output` out."""
    b = SessionBuilder(Hasher(client.encode()), id="s", kind="main", client=client)
    b.prefix_tokens = 10_000
    b.add_block(
        msg=0, kind=Kind.TEXT, role=Role.USER, text="u".ljust(4_000, "x"), ts=T0,
        first_request=0, tokens=1_000,
    )  # fmt: skip
    b.add_block(
        msg=1, kind=Kind.TEXT, role=Role.ASSISTANT, text="a".ljust(400, "x"), ts=T0 + 1,
        first_request=1, tokens=100, origin=0,
    )  # fmt: skip
    b.add_block(
        msg=1, kind=Kind.TOOL_USE, role=Role.ASSISTANT, text="#1#".ljust(8_000, "x"),
        ts=T0 + 2, first_request=1, tokens=2_000, origin=0, tool="Read", use_id="t1",
    )  # fmt: skip
    b.add_block(
        msg=2, kind=Kind.TOOL_RESULT, role=Role.USER, text="r".ljust(4 * result, "x"),
        ts=T0 + MINUTE, first_request=1, tokens=result, tool="Read", result_for="t1",
    )  # fmt: skip
    b.add_request(ts=T0, model=SONNET45, usage=RecordedUsage(11_000, 0, 0, 0, logged_output))
    b.add_request(ts=T0 + MINUTE, model=SONNET45, usage=None)
    return b.finish()


def _snapshot_session(result: int) -> Session:
    """_recount_session's layout, but the response's usage logs output_tokens 1 (a
    streaming snapshot) although its lines hold 2,100 tokens: the builder counts 2,100."""
    return _two_line_session(result, "claude-code 2.1.29", 1)


@pytest.mark.parametrize(
    ("preset", "params", "smallest"),
    [
        # 2.1.x: 11,000 + the logged 1 + R >= 167,000 from R = 155,999.
        ("claude-code@2.1.88", {}, 155_999),
        # The output counted from the response's lines: 11,000 + 2,100 + R from 153,900.
        ("claude-code@2.1.88", {"autocompact.estimate_logged_output": False}, 153_900),
        # 1.0 counts it too; its threshold is 92% of 168,000: 154,560 - 13,100 = 141,460.
        ("claude-code@1.0", {}, 141_460),
    ],
)
def test_the_trigger_adds_the_output_tokens_the_client_logged(
    preset: str, params: dict[str, Any], smallest: int
) -> None:
    """policies/claude_code/autocompact.py: 2.1.29's preTokens hold the logged snapshot."""
    session = _snapshot_session(smallest)
    assert int(session.requests["output"][0]) == 2_100
    assert int(session.requests["output_recorded"][0]) == 1
    for result, fires in [(smallest, True), (smallest - 1, False)]:
        trace = Trace("claude-code", "t", [_snapshot_session(result)])
        frame = replay([("t", trace)], policy.build(preset, {**AUTO, **params}))
        assert compactions(frame) == ([(1, "autocompact")] if fires else []), (result, fires)


def _recount_session(result: int) -> Session:
    """The two-line response of 2.1.226, its usage 11,000 in + 2,100 out."""
    return _two_line_session(result, "claude-code 2.1.226", 2_100)


@pytest.mark.parametrize(
    ("preset", "fires"), [("claude-code@2.1.221", True), ("claude-code@2.1.88", False)]
)
def test_2_1_2xx_counts_the_last_responses_later_lines_again(preset: str, fires: bool) -> None:
    """Estimate at request 1: 11,000 + 2,100 + the result's 153,000 = 166,100, under the
    167,000 trigger; 2.1.2xx adds the tool_use line after the response's first line
    (8,000 / 4 = 2,000): 168,100, over it (policies/claude_code/autocompact.py). Unpadded,
    so that the recount alone decides."""
    trace = Trace("claude-code", "t", [_recount_session(153_000)])
    params = {**AUTO, "autocompact.estimate_padding": 1.0}
    frame = replay([("t", trace)], policy.build(preset, params))
    assert compactions(frame) == ([(1, "autocompact")] if fires else [])


@pytest.mark.parametrize(
    ("model", "window_1m", "threshold"),
    [(OPUS5, False, 167_000), (OPUS46, True, 967_000), (OPUS46, False, 167_000)],
)
def test_window_1m_switches_the_1m_window(model: str, window_1m: bool, threshold: int) -> None:
    s = _session("c", model, [100])
    assert _threshold("claude-code@2.1.221", s, {"window_1m": window_1m}) == threshold


# -- the settings under their real names ------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "threshold"),
    [
        # min(floor(980,000 x 0.60), 967,000): the override can lower the threshold ...
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": 60}, 588_000),
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "60"}, 588_000),
        # ... never raise it: floor(980,000 x 0.99) = 970,200 > 967,000.
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "99"}, 967_000),
        # "0.8" is 0.8 percent: floor(980,000 x 0.008) = 7,840; as a fraction 784,000.
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "0.8"}, 7_840),
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "0.8", "autocompact.pct_format": "fraction"}, 784_000),
        # out of (0, 100] or not a number: ignored.
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "150"}, 967_000),
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "abc"}, 967_000),
        # the decompile's example: window 350,000, 35%: floor(330,000 x (35 / 100)), which
        # in doubles (the client's JavaScript too) is floor(115,499.99...) = 115,499 (the
        # issue rounds it to "about 115,500").
        (
            {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 350_000, "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": 35},
            115_499,
        ),
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "300k"}, 267_000),
        # clamped to 1M: no change on a 1M model; 100k-199,999 (and below, clamped to
        # 100k) turns autocompact off; 200,000 is allowed.
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 5_000_000}, 967_000),
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 150_000}, 0),
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 50_000}, 0),
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 200_000}, 167_000),
        # the output limit sizes the reserve: 1M - 8,000 - 13,000.
        ({"CLAUDE_CODE_MAX_OUTPUT_TOKENS": 8_000}, 979_000),
        ({"DISABLE_AUTO_COMPACT": "1"}, 0),
        ({"DISABLE_AUTO_COMPACT": "true"}, 0),
        ({"DISABLE_AUTO_COMPACT": "0"}, 967_000),
        ({"DISABLE_COMPACT": 1}, 0),
        ({"autoCompactEnabled": False}, 0),
        ({"autoCompactEnabled": "false"}, 0),
    ],
)
def test_settings_on_2_1_221(params: dict[str, Any], threshold: int) -> None:
    assert _threshold("claude-code@2.1.221", _session("c", OPUS5, [100]), params) == threshold


def test_a_small_window_is_only_a_hole_from_2_1_2xx() -> None:
    """2.1.92 has no 100k-199k rule: a 150,000 window compacts at 117,000."""
    s = _session("c", OPUS5, [100])
    assert _threshold("claude-code@2.1.92", s, {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": 150_000}) == (
        117_000
    )


@pytest.mark.parametrize(
    ("value", "on"),
    [
        *[(None, False), ("", False), ("1", True), ("TRUE", True), ("yes", True), ("on", True)],
        *[(True, True), (1, True), ("0", False), (0, False), ("off", False), (False, False)],
    ],
)
def test_env_truthy_reads_a_setting_as_claude_code_does(value: Any, on: bool) -> None:
    assert env_truthy(value) is on


def test_pct_share() -> None:
    assert pct_share("60", "percent") == 0.6
    assert pct_share(60, "fraction") == 0.6  # above 1: a percent either way
    assert pct_share("0.6", "fraction") == 0.6
    assert pct_share(None, "percent") is None
    assert pct_share("0", "percent") is None


@pytest.mark.parametrize(
    ("params", "threshold"),
    # On a 200k model under 2.1.221: 167,000 by default; 60%: floor(180,000 x 0.6).
    [({}, 167_000), ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "60"}, 108_000)],
)
def test_the_replay_fires_at_the_threshold_the_settings_give(
    params: dict[str, Any], threshold: int
) -> None:
    """Unpadded, estimate 11,100 + R: R = threshold - 11,100 fires, one token less does
    not (the 2.1.2xx padding is the next test's)."""
    unpadded = {**params, "autocompact.estimate_padding": 1.0}
    for result, fires in [(threshold - 11_100, True), (threshold - 11_101, False)]:
        assert _fires("claude-code@2.1.221", "c", SONNET45, result, unpadded) is fires


@pytest.mark.parametrize(
    ("preset", "params", "smallest"),
    [
        # 2.1.2xx: 11,100 + ceil(4R/3) >= 167,000 from R = 116,925 (4R/3 = 155,900 exactly;
        # R = 116,924 gives ceil(155,898.67) = 155,899, one token short).
        ("claude-code@2.1.221", {}, 116_925),
        # 60%: 108,000; ceil(4R/3) >= 96,900 from R = 72,675.
        ("claude-code@2.1.221", {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "60"}, 72_675),
        # 2.1.88 does not pad: 11,100 + R >= 167,000 from R = 155,900.
        ("claude-code@2.1.88", {}, 155_900),
        # the padding is a parameter of every preset.
        ("claude-code@2.1.88", {"autocompact.estimate_padding": 4 / 3}, 116_925),
    ],
)
def test_2_1_2xx_pads_what_the_last_usage_does_not_hold(
    preset: str, params: dict[str, Any], smallest: int
) -> None:
    """The last usage (11,000 + 100 output) is taken as it is; the Read result after it
    (R tokens by length/4) is padded by 4/3 in 2.1.2xx (policies/claude_code/autocompact.py:
    flutter-docker's 2.1.226 session fired on preTokens 166,612 and not on 166,150)."""
    assert _fires(preset, "c", SONNET45, smallest, params)
    assert not _fires(preset, "c", SONNET45, smallest - 1, params)


# -- version matching ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "threshold"),
    [
        ("claude-code 2.1.6", 155_000),
        ("claude-code 2.1.88", 167_000),
        ("claude-code 1.0.53", 154_560),
    ],
)
def test_claude_code_replays_each_session_under_its_versions_preset(
    client: str, threshold: int
) -> None:
    for result, fires in [(threshold - 11_100, True), (threshold - 11_101, False)]:
        assert _fires("claude-code", client, SONNET45, result, {}) is fires


def test_claude_code_applies_its_parameters_over_the_matched_preset() -> None:
    """2.1.6 compacts at 155,000; 60% of its 168,000 effective window is 100,800."""
    params = {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "60"}
    assert _fires("claude-code", "claude-code 2.1.6", SONNET45, 100_800 - 11_100, params)
    assert not _fires("claude-code", "claude-code 2.1.6", SONNET45, 100_800 - 11_101, params)


# -- the thrashing detector --------------------------------------------------------------------


def _thrash_frame(preset: str) -> pl.DataFrame:
    """Every request adds a 160,000-token result: 11,100 + 160,000 at request 1, then
    13,000 (prefix + summary) + 100 + 160,000 = 173,100 after each compaction: each
    request is due (167,000)."""
    trace = Trace("claude-code", "t", [_session("c", SONNET45, [160_000] * 6)])
    # No tail kept verbatim (2.1.2xx keeps the newest round), so every compaction leaves
    # the prefix and the summary only.
    return replay(
        [("t", trace)], policy.build(preset, {**AUTO, "autocompact.preserve_tail_groups": 0})
    )


def test_the_thrashing_detector_turns_autocompact_off() -> None:
    """2.1.144 on: compactions at 1, 2, 3, 4 (2, 3, 4 each 1 request after the previous:
    three rapid ones in a row), then off: request 5 and 6 send 173,100 + 160,100."""
    frame = _thrash_frame("claude-code@2.1.221")
    assert [k for k, _ in compactions(frame)] == [1, 2, 3, 4]
    tripped = frame.filter(pl.col("breaker_trip"))["request"].to_list()
    assert tripped == [4]
    without = _thrash_frame("claude-code@2.1.92")
    assert [k for k, _ in compactions(without)] == [1, 2, 3, 4, 5, 6]


def test_2_1_2xx_keeps_the_newest_round_and_not_the_first_message_again() -> None:
    """Request 1 (11,100 + 156,000 = 167,100) compacts. 2.1.221: prefix 10,000 + summary
    3,000 + the newest round kept verbatim (tool_use 100 + result 156,000) = 169,100, and
    no second copy of the first message; 2.1.144 keeps no tail: 13,000."""
    trace = Trace("claude-code", "t", [_session("c", SONNET45, [156_000])])
    after = {}
    for preset in ("claude-code@2.1.221", "claude-code@2.1.144"):
        frame = replay([("t", trace)], policy.build(preset, AUTO))
        assert compactions(frame) == [(1, "autocompact")]
        after[preset] = frame.filter(pl.col("kind") == "request").sort("request")["context_tokens"][
            1
        ]
    assert after == {"claude-code@2.1.221": 169_100, "claude-code@2.1.144": 13_000}


def test_the_summary_call_writes_5_minute_entries_from_2_1_92() -> None:
    """The session's own requests keep their TTL (5 minutes here, no recorded usage); the
    summary call's writes are 5-minute in 2.1.92 on and follow the request in 2.1.88."""
    trace = Trace("claude-code", "t", [_session("c", SONNET45, [160_000])])
    for preset in ("claude-code@2.1.92", "claude-code@2.1.88"):
        frame = replay([("t", trace)], policy.build(preset, {**AUTO, "cache.ttl": "1h"}))
        call = frame.filter(pl.col("kind") == "compaction").row(0, named=True)
        assert (call["cache_write_5m"] > 0) is (preset == "claude-code@2.1.92")
        assert (call["cache_write_1h"] > 0) is (preset == "claude-code@2.1.88")
