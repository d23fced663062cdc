"""The compiled context follows the recorded one (issue 12): a prefix per model, re-inferred
after a compaction, unlogged drops as explicit edits, server-tool passes as requests.

Every session here is built in code with explicit token counts (`tokens=` bypasses the
tokenizer), so each expectation is computed by hand from the numbers written below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import policy
from simulator.model import NEVER, CompactionEvent, Flag, Kind, Role, Session, Trace
from simulator.replay import replay
from traces import compiled
from traces.builder import Hasher, RecordedUsage, SessionBuilder, usage_iterations

T0 = 1_760_000_000_000
SECOND = 1_000
HOUR = 3_600_000
A, B = "claude-opus-4-5-20251101", "claude-sonnet-4-5-20250929"


def _usage(context: int, read: int = 0) -> RecordedUsage:
    """All of the context written except `read` (the write is what the cache model prices)."""
    return RecordedUsage(
        input=0, cache_read=read, cache_write_5m=context - read, cache_write_1h=0, output=10
    )


class _Session:
    """A session written request by request; `round` is a tool_use (the previous request's
    response) with its tool_result, both entering at the next request."""

    def __init__(self) -> None:
        self.b = SessionBuilder(
            Hasher(b"mechanisms"), id="s", kind="main", client="claude-code 2.1.90"
        )
        self.k = 0
        self.n = 0

    def block(self, kind: Kind, role: Role, tokens: int, **kw: Any) -> int:
        self.n += 1
        return self.b.add_block(
            msg=self.n - 1,  # 0-based: the compiled format checks msg < blocks
            kind=kind,
            role=role,
            text=f"b{self.n}",
            ts=T0,
            first_request=self.k,
            tokens=tokens,
            **kw,
        )

    def human(self, tokens: int) -> int:
        return self.block(Kind.TEXT, Role.USER, tokens, flags=Flag.HUMAN)

    def round(self, use: int, result: int, tool: str = "Bash") -> tuple[int, int]:
        uid = f"u{self.n}"
        u = self.block(Kind.TOOL_USE, Role.ASSISTANT, use, tool=tool, origin=self.k - 1, use_id=uid)
        r = self.block(Kind.TOOL_RESULT, Role.USER, result, tool=tool, result_for=uid)
        return u, r

    def request(self, ts: int, usage: RecordedUsage, model: str = A) -> int:
        k = self.b.add_request(ts=ts, model=model, usage=usage, ts_end=ts + SECOND)
        self.k += 1
        return k


def _view_sizes(s: Session) -> list[int]:
    prefix = s.prefix_at()
    return [
        int(s.blocks["tokens"][s.view_mask(k, as_recorded=True)].sum()) + int(prefix[k])
        for k in range(s.n_requests)
    ]


def _replayed_context(s: Session) -> list[int]:
    trace = Trace("claude-code", "0" * 64, [s])
    frame = replay([("t", trace)], policy.build("as-recorded", {}))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    return rows["context_tokens"].to_list()


def _idle_clearing() -> tuple[Session, list[int], list[tuple[int, int]], dict[str, int]]:
    """Prefix 1,000; a human message of 100; seven Bash rounds of 50 + 200 a minute apart
    (context 1,100 + 250 k); then, two hours later, a human message of 100 and a context of
    2,450: the client cleared the two oldest results (all but the 5 most recent), and with
    them their calls: 2,850 + 100 - 500."""
    w = _Session()
    w.human(100)
    contexts = [1_100]
    w.request(T0, _usage(1_100))
    rounds = []
    for i in range(1, 8):
        rounds.append(w.round(50, 200))
        contexts.append(1_100 + 250 * i)
        w.request(T0 + i * 60 * SECOND, _usage(contexts[-1], read=contexts[-2]))
    w.human(100)
    contexts.append(2_450)
    w.request(T0 + 7 * 60 * SECOND + 2 * HOUR, _usage(2_450))
    return w.b.finish(), contexts, rounds, w.b.stats


def test_a_drop_after_an_idle_gap_clears_the_oldest_tool_results() -> None:
    s, contexts, rounds, _ = _idle_clearing()
    assert s.prefix_tokens == 1_000
    assert _view_sizes(s) == contexts
    b = s.blocks
    cleared = [blk for pair in rounds[:2] for blk in pair]
    kept = [blk for pair in rounds[2:] for blk in pair]
    assert b["compacted_at"][cleared].tolist() == [8] * 4
    assert (b["flags"][cleared] & Flag.UNLOGGED).all()
    assert (b["compacted_at"][kept] == NEVER).all()
    assert b["tokens"][-1] == 100  # the new message keeps its own size
    # Only the recorded view lost them: the logical history policies project keeps them.
    assert s.view_mask(8, as_recorded=False)[cleared].all()
    assert not s.view_mask(8, as_recorded=True)[cleared].any()


def test_idle_clearing_is_counted_and_replays_at_the_recorded_size() -> None:
    s, contexts, _, stats = _idle_clearing()
    assert stats["edits_idle"] == 1
    assert stats["edits_unlogged"] == 0
    assert stats["edited_blocks"] == 4
    assert stats["edited_tokens"] == 500
    assert stats["unexplained_shrinks"] == 0
    assert _replayed_context(s) == contexts
    assert _idle_clearing()[0].blocks.equals(s.blocks)  # deterministic


def test_a_short_gap_is_not_idle() -> None:
    """The same drop a minute after the last request (the cache still warm) is an
    unexplained edit of the oldest droppable content, not idle clearing."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(1_100))
    for i in range(1, 8):
        w.round(50, 200)
        w.request(T0 + i * 60 * SECOND, _usage(1_100 + 250 * i, read=1_100 + 250 * (i - 1)))
    w.human(100)
    w.request(T0 + 8 * 60 * SECOND, _usage(2_450))
    s = w.b.finish()
    assert w.b.stats["edits_idle"] == 0 and w.b.stats["edits_unlogged"] == 1
    assert _view_sizes(s)[-1] == 2_450


def test_a_drop_while_the_cache_is_warm_starts_after_the_cached_part() -> None:
    """Seconds apart, the context drops by 350 and the request reads 1,450 from cache: the
    prefix (1,000), the message (100) and the first Read round (350) were unchanged, so the
    edit removes the second round, the first one starting at or after the read."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(1_100), model=B)  # Sonnet 4.5 caches from 1,024 tokens
    rounds = []
    contexts = [1_100]
    for i in range(1, 5):
        rounds.append(w.round(50, 300, tool="Read"))
        contexts.append(1_100 + 350 * i)
        w.request(T0 + i * 10 * SECOND, _usage(contexts[-1], read=contexts[-2]), model=B)
    w.human(20)
    contexts.append(contexts[-1] - 350 + 20)
    w.request(T0 + 60 * SECOND, _usage(contexts[-1], read=1_450), model=B)
    s = w.b.finish()
    assert _view_sizes(s) == contexts
    gone = s.blocks["compacted_at"] == 5
    assert np.flatnonzero(gone).tolist() == list(rounds[1])
    assert w.b.stats["edits_unlogged"] == 1 and w.b.stats["edits_idle"] == 0
    assert _replayed_context(s) == contexts
    trace = Trace("claude-code", "0" * 64, [s])
    frame = replay([("t", trace)], policy.build("as-recorded", {}))
    last = frame.filter((pl.col("kind") == "request") & (pl.col("request") == 5))
    assert last["cache_read"].item() == 1_450  # the cache reads what the recording read


def test_the_prefix_switches_with_the_model_and_back() -> None:
    """Model A has a 1,000-token prefix, model B (deferred tools) 300: at the switch the
    context drops by 700 though it grew by 40; back on A the first prefix returns."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(1_100))
    w.round(20, 80)
    w.request(T0 + SECOND, _usage(1_200, read=1_100))
    w.round(10, 30)
    w.request(T0 + 2 * SECOND, _usage(540), model=B)  # 300 + 200 + 40
    w.round(10, 50)
    w.request(T0 + 3 * SECOND, _usage(600, read=540), model=B)
    w.round(10, 40)
    w.request(T0 + 4 * SECOND, _usage(1_350), model=A)  # 1,000 + 300 + 50
    s = w.b.finish()
    assert s.prefix_at().tolist() == [1_000, 1_000, 300, 300, 1_000]
    assert s.prefix_tokens == 1_000
    assert _view_sizes(s) == [1_100, 1_200, 540, 600, 1_350]
    assert w.b.stats["prefix_models"] == 1
    assert w.b.stats["edited_blocks"] == 0 and w.b.stats["unexplained_shrinks"] == 0
    assert s.blocks["tokens"].tolist() == [100, 20, 80, 10, 30, 10, 50, 10, 40]
    assert _replayed_context(s) == [1_100, 1_200, 540, 600, 1_350]
    # The per-request prefix survives the compiled form.
    back = compiled.from_bytes(compiled.to_bytes(Trace("claude-code", "0" * 64, [s])))
    assert back.sessions[0].prefix_at().tolist() == [1_000, 1_000, 300, 300, 1_000]


def test_the_prefix_is_inferred_again_after_a_compaction() -> None:
    """A 1,000 prefix, then a compaction whose context (1,000) is smaller than the old
    prefix plus the summary (200): the prefix is re-inferred as 800, which is above the
    request's cache read (600)."""
    w = _Session()
    old = [w.human(100)]
    w.request(T0, _usage(1_100))
    old += list(w.round(50, 150))
    w.request(T0 + SECOND, _usage(1_300, read=1_100))
    for blk in old:
        w.b.compact_away(blk, 2)
    summary = w.block(Kind.SUMMARY, Role.USER, 200, flags=Flag.ARTIFACT)
    w.b.add_event(CompactionEvent(2, "auto", 1_300, summary, T0 + 2 * SECOND))
    w.request(T0 + 2 * SECOND, _usage(1_000, read=600))
    w.human(30)
    w.request(T0 + 3 * SECOND, _usage(1_030, read=1_000))
    s = w.b.finish()
    assert s.prefix_at().tolist() == [1_000, 1_000, 800, 800]
    assert w.b.stats["prefix_reinferred"] == 1
    assert int(s.blocks["tokens"][summary]) == 200
    assert _view_sizes(s) == [1_100, 1_300, 1_000, 1_030]
    assert _replayed_context(s) == [1_100, 1_300, 1_000, 1_030]
    assert w.b.stats["edited_blocks"] == 0


def test_server_tool_passes_become_requests() -> None:
    """A call the server ran twice (model, advisor, model) reports the sum of its passes;
    it becomes two requests, the second's growth an artifact that is gone at the next."""
    usage = {
        "input_tokens": 3,
        "cache_read_input_tokens": 2_100,
        "cache_creation_input_tokens": 160,
        "output_tokens": 60,
        "iterations": [
            {
                "type": "message",
                "input_tokens": 1,
                "cache_read_input_tokens": 1_000,
                "cache_creation_input_tokens": 100,
                "output_tokens": 20,
            },
            {"type": "advisor_message", "input_tokens": 900, "output_tokens": 500},
            {
                "type": "message",
                "input_tokens": 2,
                "cache_read_input_tokens": 1_100,
                "cache_creation_input_tokens": 60,
                "output_tokens": 40,
            },
        ],
    }
    passes = usage_iterations(usage)
    assert [(p.input, p.cache_read, p.cache_write_5m, p.output) for p in passes] == [
        (1, 1_000, 100, 20),
        (2, 1_100, 60, 40),
    ]
    assert usage_iterations({**usage, "input_tokens": 4}) == ()  # sums must agree
    assert usage_iterations({"input_tokens": 1}) == ()
    w = _Session()
    w.human(100)
    w.request(T0, RecordedUsage(1, 1_000, 100, 0, 20, iterations=passes))
    reply = w.block(Kind.TEXT, Role.ASSISTANT, 50, origin=0)
    w.human(40)
    w.request(T0 + 5 * SECOND, _usage(1_191, read=1_101))
    s = w.b.finish()
    r = s.requests
    assert s.n_requests == 3
    assert r["input"].tolist() == [1, 2, 0]
    assert int(r["cache_read"][:2].sum()) == 2_100 and int(r["cache_write_5m"][:2].sum()) == 160
    assert _view_sizes(s) == [1_101, 1_162, 1_191]
    b = s.blocks
    artifact = np.flatnonzero(b["kind"] == Kind.INJECTED)
    assert len(artifact) == 1 and b["tokens"][artifact[0]] == 61
    assert b["first_request"][artifact[0]] == 1 and b["compacted_at"][artifact[0]] == 2
    assert b["flags"][artifact[0]] & Flag.ARTIFACT
    moved = reply + 1 if artifact[0] <= reply else reply
    assert b["origin"][moved] == 1 and b["first_request"][moved] == 2
    assert w.b.stats["server_passes_split"] == 1
    assert _replayed_context(s) == [1_101, 1_162, 1_191]


def test_idle_clearing_takes_only_clearable_results_before_the_five_most_recent() -> None:
    """A Task round (not a tool Claude Code's microcompact clears) and seven Bash rounds; two
    hours later the context has lost three rounds (750). The idle candidates are the two
    Bash results before the five most recent (rounds 2 and 3); the third round comes from
    the oldest droppable content left, the Task round."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(1_100))
    rounds = []
    for i in range(1, 9):
        rounds.append(w.round(50, 200, tool="Task" if i == 1 else "Bash"))
        w.request(T0 + i * 60 * SECOND, _usage(1_100 + 250 * i, read=1_100 + 250 * (i - 1)))
    w.human(100)
    w.request(T0 + 8 * 60 * SECOND + 2 * HOUR, _usage(1_100 + 250 * 8 + 100 - 750))
    s = w.b.finish()
    gone = np.flatnonzero(s.blocks["compacted_at"] == 9).tolist()
    assert gone == sorted([*rounds[0], *rounds[1], *rounds[2]])
    assert w.b.stats["edits_idle"] == 1
    assert _view_sizes(s)[-1] == 1_100 + 250 * 8 + 100 - 750


def test_a_new_models_prefix_is_warm_where_the_recording_read_it() -> None:
    """Sonnet 4.5 with a 3,000 prefix, then Sonnet 4 with 2,000 (smaller tools): its first
    request reads its whole prefix from cache (another session sent it), so the replay does
    too, and writes only the conversation."""
    s4 = "claude-sonnet-4-20250514"
    w = _Session()
    w.human(100)
    w.request(T0, _usage(3_100), model=B)
    w.round(50, 250)
    w.request(T0 + SECOND, _usage(3_400, read=3_100), model=B)
    w.round(10, 40)
    w.request(T0 + 2 * SECOND, _usage(2_450, read=2_000), model=s4)  # 2,000 + 400 + 50
    s = w.b.finish()
    assert s.prefix_at().tolist() == [3_000, 3_000, 2_000]
    trace = Trace("claude-code", "0" * 64, [s])
    frame = replay([("t", trace)], policy.build("as-recorded", {}))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    assert rows["context_tokens"].to_list() == [3_100, 3_400, 2_450]
    assert rows["cache_read"].to_list() == [0, 3_100, 2_000]
    assert rows["cache_write_5m"].to_list()[2] == 450


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 300), st.integers(1, 900), st.integers(-1_500, 1_500), st.booleans()
        ),
        min_size=1,
        max_size=25,
    )
)
def test_the_view_is_the_recorded_context_whenever_no_shrink_is_left(
    steps: list[tuple[int, int, int, bool]],
) -> None:
    """Whatever the recorded contexts do (above the prefix, the first message and the
    entering round), each request's as-recorded view equals its context unless an
    unexplained shrink is counted (the entering round's estimate can exceed it), and an
    edit never separates a tool_use from its tool_result."""
    w = _Session()
    w.human(100)
    contexts = [1_100]
    w.request(T0, _usage(1_100))
    ts = T0
    for use, result, delta, idle in steps:
        w.round(use, result)
        ts += 2 * HOUR if idle else 30 * SECOND
        contexts.append(max(1_100 + use + result, contexts[-1] + delta))
        w.request(ts, _usage(contexts[-1]))
    s = w.b.finish()
    if w.b.stats["unexplained_shrinks"] == 0:
        assert _view_sizes(s) == contexts
    b = s.blocks
    linked = np.flatnonzero(b["link"] >= 0)
    assert (b["compacted_at"][linked] == b["compacted_at"][b["link"][linked]]).all()
    assert ((b["flags"] & Flag.UNLOGGED) != 0).sum() == w.b.stats["edited_blocks"]


def test_content_after_the_message_marker_is_not_cached() -> None:
    """A request whose last 500 tokens (a note the client appended after its marker) were
    sent uncached: the replay puts the marker before them, so it writes 550, not 1,050,
    and the next request reads 3,650, as the recording did."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(3_100), model=B)
    w.round(50, 500)
    w.human(500)
    w.request(T0 + SECOND, RecordedUsage(500, 3_100, 550, 0, 10), model=B)
    w.human(40)
    w.request(T0 + 2 * SECOND, RecordedUsage(0, 3_650, 540, 0, 10), model=B)
    s = w.b.finish()
    frame = replay([("t", Trace("claude-code", "0" * 64, [s]))], policy.build("as-recorded", {}))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    assert rows["cache_read"].to_list() == [0, 3_100, 3_650]
    assert rows["cache_write_5m"].to_list() == [3_100, 550, 540]
    assert rows["uncached_input"].to_list() == [0, 500, 0]


def test_the_shared_prefix_is_warm_only_as_far_as_the_recording_read_it() -> None:
    """The first request reads 2,000 of a 3,000 prefix (warm from other sessions). After an
    idle hour the recording reads only 1,200: the shared part was warm only that far.
    After another it reads 2,000 again: warm again. The replay reads what it read."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(3_100, read=2_000), model=B)
    w.human(30)
    w.request(T0 + SECOND, _usage(3_130, read=3_100), model=B)
    w.human(40)
    w.request(T0 + 2 * HOUR, _usage(3_170, read=1_200), model=B)
    w.human(30)
    w.request(T0 + 2 * HOUR + SECOND, _usage(3_200, read=3_170), model=B)
    w.human(50)
    w.request(T0 + 5 * HOUR, _usage(3_250, read=2_000), model=B)
    s = w.b.finish()
    frame = replay([("t", Trace("claude-code", "0" * 64, [s]))], policy.build("as-recorded", {}))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    assert rows["cache_read"].to_list() == [2_000, 3_100, 1_200, 3_170, 2_000]
    without = replay(
        [("t", Trace("claude-code", "0" * 64, [s]))],
        policy.build("as-recorded", {"prefix_resets": False}),
    )
    rows = without.filter(pl.col("kind") == "request").sort("request")
    assert rows["cache_read"].to_list()[2] == 2_000  # kept warm for ever


def _warm_beyond_the_shared_part() -> Session:
    """A 3,000 prefix of which the first request reads 2,000 (warm from other sessions).
    After an idle two hours the recording reads 2,600: other sessions kept more of the
    prefix warm by then. Two hours later again it reads 2,000 only: the 2,600 was warm
    then, not for ever."""
    w = _Session()
    w.human(100)
    w.request(T0, _usage(3_100, read=2_000), model=B)
    w.human(30)
    w.request(T0 + SECOND, _usage(3_130, read=3_100), model=B)
    w.human(40)
    w.request(T0 + 2 * HOUR, _usage(3_170, read=2_600), model=B)
    w.human(30)
    w.request(T0 + 2 * HOUR + SECOND, _usage(3_200, read=3_170), model=B)
    w.human(50)
    w.request(T0 + 4 * HOUR, _usage(3_250, read=2_000), model=B)
    return w.b.finish()


def test_the_prefix_can_be_warm_beyond_the_shared_part_after_an_idle_gap() -> None:
    s = _warm_beyond_the_shared_part()
    frame = replay([("t", Trace("claude-code", "0" * 64, [s]))], policy.build("as-recorded", {}))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    assert rows["cache_read"].to_list() == [2_000, 3_100, 2_600, 3_170, 2_000]
    # What was not read is written: 3,170 - 2,600 and 3,250 - 2,000.
    assert rows["cache_write_5m"].to_list() == [1_100, 30, 570, 30, 1_250]


def test_warm_beyond_the_shared_part_needs_the_warm_start() -> None:
    """Without seeding what other sessions kept warm, the gaps read nothing."""
    s = _warm_beyond_the_shared_part()
    frame = replay(
        [("t", Trace("claude-code", "0" * 64, [s]))],
        policy.build("as-recorded", {"warm_start": False}),
    )
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    assert rows["cache_read"].to_list() == [0, 3_100, 0, 3_170, 0]
