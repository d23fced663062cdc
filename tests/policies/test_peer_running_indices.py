"""The running indices of masking, anthropic-context-editing and opencode (issue 16) give
the rows and edits of the rescans they replaced.

Each policy is replayed twice on the same session: as it is, and with its rule put back
to the rescan of the whole conversation it made before at every request (the reference
below, the code as it was). Sessions are scripted at random (hypothesis) with what makes
the indices rebuild: rewinds (blocks leaving), tool results and uses that stop counting
(cache_edits of a stripped block), excluded tools, human turns; plus the in-repo samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.peers.anthropic_context_editing import CLEARED_SALT, ContextEditingSession
from policies.peers.masking import MASK_SALT, MaskingSession
from policies.peers.opencode import OpencodeSession
from simulator import policy as registry
from simulator.model import Flag, Trace
from simulator.policy import Emitter
from simulator.replay import replay
from tests.support import SAMPLES
from tests.support.scripted import Script
from traces.load import load_all, units

# -- the rescans, as the policies made them before their running indices ------------------


def masking_rescan(self: MaskingSession, k: int, out: Emitter) -> None:
    conv = self.conv
    observations = [key for key in conv.items if conv.is_tool_result(key)]
    if self.keep_first and observations:
        observations = observations[1:]
    old = observations[: max(0, len(observations) - self.keep)]
    for key in old:
        if key not in self.masked:
            conv.mask(key, min(self.placeholder, conv.tokens[key]), MASK_SALT, edit="mask")
            self.masked.add(key)


def editing_wanted(self: ContextEditingSession, present: set[int]) -> dict[int, int]:
    conv = self.conv
    unedited = conv.total() + sum(self.cleared.values())
    if unedited < self.threshold_tokens():
        return {}
    results = [key for key in conv.items if conv.is_tool_result(key)]
    older = results[: max(0, len(results) - self.keep)]
    clear: dict[int, int] = {}
    for key in older:
        if conv.tool(key) in self.exclude:
            continue
        clear[key] = self.saving(key)
        use = conv.link[key]
        if self.clear_inputs and use in present:
            clear[use] = self.saving(use)
    if self.at_least > 0 and sum(clear.values()) < self.at_least:
        return {}
    return clear


def editing_restore(self: ContextEditingSession, keys: Iterable[int]) -> None:
    conv = self.conv
    for key in list(keys):
        conv.override.pop(key, None)
        conv.touch(conv.items.index(key))
        del self.cleared[key]


def editing_rescan(self: ContextEditingSession, k: int, out: Emitter) -> None:
    conv = self.conv
    present = set(conv.items)
    for key in [key for key in self.cleared if key not in present]:
        del self.cleared[key]
    wanted = editing_wanted(self, present)
    editing_restore(self, (key for key in self.cleared if key not in wanted))
    for key, saved in wanted.items():
        if key not in self.cleared:
            raw = self.raw_tokens(key)
            conv.mask(key, min(self.placeholder, raw), CLEARED_SALT, edit="clear_tool_uses")
            self.cleared[key] = saved
    if wanted:
        self.applied += 1


def opencode_user_turns(self: OpencodeSession) -> list[int]:
    conv = self.conv
    seen: set[int] = set()
    starts: list[int] = []
    for i in self.user_turn_starts():
        msg = conv.msg[conv.items[i]]
        if msg not in seen:
            seen.add(msg)
            starts.append(i)
    return starts


def opencode_prune_candidates(self: OpencodeSession) -> tuple[list[int], int]:
    conv = self.conv
    turns = opencode_user_turns(self)
    if len(turns) < self.protect_turns:
        return [], 0
    end = turns[-self.protect_turns] if self.protect_turns > 0 else len(conv.items)
    total = freed = 0
    marked: list[int] = []
    for key in reversed(conv.items[:end]):
        if key < 0:
            if conv.synthetic[key].kind == "summary":
                break
            continue
        if not conv.is_tool_result(key):
            continue
        tool = conv.tool(key)
        if tool is not None and tool.lower() in self.protected_tools:
            continue
        if key in self.pruned:
            break
        size = conv.sent(key)[1]
        total += size
        if total <= self.protect:
            continue
        freed += size
        marked.append(key)
    return marked, freed


RESCANS: dict[str, list[tuple[type, str, Any]]] = {
    "masking": [(MaskingSession, "transform", masking_rescan)],
    "swe-agent": [(MaskingSession, "transform", masking_rescan)],
    "anthropic-context-editing": [(ContextEditingSession, "transform", editing_rescan)],
    "opencode": [(OpencodeSession, "prune_candidates", opencode_prune_candidates)],
}


def _both(
    traces: list[tuple[str, Trace]],
    name: str,
    params: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[tuple[pl.DataFrame, list[Any]], tuple[pl.DataFrame, list[Any]]]:
    """(rows, edits) of the policy as it is, then of its rescan."""
    results = []
    for rescan in (False, True):
        with monkeypatch.context() as m:
            if rescan:
                for cls, attr, fn in RESCANS[name]:
                    m.setattr(cls, attr, fn)
            edits: list[Any] = []
            frame = replay(traces, registry.build(name, params), edits=edits)
            results.append((frame, edits))
    return results[0], results[1]


def _assert_same(
    traces: list[tuple[str, Trace]],
    name: str,
    params: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> int:
    """Same rows and edits; returns how many edits there were (a test that edits nothing
    compares little)."""
    (rows, edits), (want_rows, want_edits) = _both(traces, name, params, monkeypatch)
    assert rows.equals(want_rows)
    assert edits == want_edits
    return len(edits)


# -- random scripted sessions --------------------------------------------------------------

TOOLS = ("Bash", "Read", "skill")


@st.composite
def scripted(draw: st.DrawFn) -> Trace:
    """A session of rounds and human turns, with rewinds (blocks hidden from a request on)
    and blocks that stop counting (stripped) scattered through it."""
    s = Script(prefix=2_000)
    s.user(draw(st.integers(10, 400)))
    s.request()
    blocks: list[int] = []
    for _ in range(draw(st.integers(5, 40))):
        action = draw(st.sampled_from(("round", "round", "round", "user", "rewind", "strip")))
        if action == "round":
            tool = draw(st.sampled_from(TOOLS))
            use, result = s.tool(draw(st.integers(1, 9_000)), tool)
            blocks += [use, result]
        elif action == "user":
            blocks.append(s.user(draw(st.integers(5, 300))))
        elif action == "rewind" and blocks:
            for block in blocks[-draw(st.integers(1, min(4, len(blocks)))) :]:
                s.b.hide(block, s.k)
        elif action == "strip" and blocks:
            s.b.strip(draw(st.sampled_from(blocks)), s.k)
        s.request()
    trace = s.trace()
    assert trace.sessions[0].blocks["flags"].dtype is not None  # built
    return trace


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trace=scripted(), keep=st.integers(0, 4), keep_first=st.booleans())
def test_masking_matches_its_rescan(trace: Trace, keep: int, keep_first: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        params = {"keep_observations": keep, "keep_first_observation": keep_first}
        _assert_same([("t", trace)], "masking", params, mp)


@SETTINGS
@given(
    trace=scripted(),
    keep=st.integers(0, 4),
    trigger=st.integers(0, 40_000),
    at_least=st.sampled_from((0, 0, 5_000, 30_000)),
    clear_inputs=st.booleans(),
    exclude=st.sampled_from(([], ["Read"])),
)
def test_context_editing_matches_its_rescan(
    trace: Trace, keep: int, trigger: int, at_least: int, clear_inputs: bool, exclude: list[str]
) -> None:
    params = {
        "keep_tool_uses": keep,
        "trigger_tokens": trigger,
        "clear_at_least_tokens": at_least,
        "clear_tool_inputs": clear_inputs,
        "exclude_tools": exclude,
    }
    with pytest.MonkeyPatch.context() as mp:
        _assert_same([("t", trace)], "anthropic-context-editing", params, mp)


@SETTINGS
@given(
    trace=scripted(),
    protect=st.integers(0, 20_000),
    minimum=st.integers(0, 10_000),
    turns=st.integers(0, 3),
    at=st.sampled_from(("turn_end", "request")),
)
def test_opencode_pruning_matches_its_rescan(
    trace: Trace, protect: int, minimum: int, turns: int, at: str
) -> None:
    params = {
        "prune.protect_tokens": protect,
        "prune.minimum_tokens": minimum,
        "prune.protect_turns": turns,
        "prune.at": at,
        "input_limit_tokens": 60_000,  # compactions too: the turn index is rebuilt after each
    }
    with pytest.MonkeyPatch.context() as mp:
        _assert_same([("t", trace)], "opencode", params, mp)


def test_a_rewind_and_a_stripped_candidate_are_met_by_context_editing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hand-built: the edit fires, a cleared result is rewound away, a candidate stops
    counting, the prompt falls back under the trigger; each is an edit on the record."""
    s = Script(prefix=1_000)
    s.user(50)
    s.request()
    results = []
    for _ in range(6):
        results.append(s.tool(4_000)[1])
        s.request()
    s.b.hide(results[-1], s.k)  # a rewind: the newest result leaves
    s.b.strip(results[0], s.k)  # the oldest (cleared) result stops counting
    s.request()
    s.rounds(2, 4_000)
    trace = s.trace()
    session = trace.sessions[0]
    assert (session.blocks["flags"] & Flag.STRIPPED).any()
    params = {"keep_tool_uses": 2, "trigger_tokens": 12_000}
    assert _assert_same([("t", trace)], "anthropic-context-editing", params, monkeypatch) >= 4


@pytest.mark.parametrize("name", sorted(RESCANS))
def test_the_samples_match_the_rescans(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = [(item.name, item.trace) for item in load_all(units([SAMPLES]), lenient=True)]
    params: dict[str, Any] = {}
    if name == "anthropic-context-editing":
        params = {"trigger_tokens": 5_000, "keep_tool_uses": 1}
    if name == "opencode":
        params = {"prune.protect_tokens": 500, "prune.minimum_tokens": 0}
    _assert_same(traces, name, params, monkeypatch)


def test_a_candidate_that_stops_counting_frees_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`clear_at_least` 7,000 with results of 4,000 (each frees 3,990): two older results
    are enough, until the oldest stops counting (stripped) before the edit fires. Then it
    frees nothing, the edit waits for a third, and the index must not remember 3,990."""
    s = Script(prefix=1_000)
    s.user(50)
    s.request()
    first = s.tool(4_000)[1]
    s.request()
    s.tool(4_000)
    s.request()  # one older result (3,990): not enough
    s.b.strip(first, s.k)
    s.tool(4_000)
    s.request()  # two older results, the first freeing nothing now
    s.rounds(2, 4_000)
    params = {"keep_tool_uses": 1, "trigger_tokens": 0, "clear_at_least_tokens": 7_000}
    traces = [("t", s.trace())]
    (_, edits), _ = _both(traces, "anthropic-context-editing", params, monkeypatch)
    cleared_at = sorted({e[3] for e in edits if e[5] == "clear_tool_uses"})
    # Cleared from the request where a third result became older on (then one more each).
    assert cleared_at == [4, 5]
    assert _assert_same(traces, "anthropic-context-editing", params, monkeypatch) > 0
