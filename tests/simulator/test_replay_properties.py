"""Properties of the replay engine (simulator/replay.py) over random small sessions.

Sessions are built directly as simulator.model.Session objects with numpy columns and
replayed under the registered `as-recorded` policy. Whatever the session, every row must
be a consistent split of its context: nothing negative, nothing read beyond what is sent,
the parts summing to the whole, and an append-only session never reading more than the
previous request sent. Replay is deterministic.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.replay as replay_module
from simulator import policy
from simulator.model import (
    NEVER,
    CompactionEvent,
    Flag,
    Kind,
    Role,
    Session,
    Trace,
    block_columns,
)
from simulator.model import request_columns as make_request_columns
from simulator.pricing import PriceBook
from simulator.replay import ROW_SCHEMA, replay
from tests.support import SAMPLES
from tests.support.sessions import hand_session

#: Sonnet 4.5 (Anthropic, minimum 1,024), Opus 4.5 (Anthropic, minimum 4,096), GPT-5
#: (automatic cache): all priced by genai-prices, so every cost column is filled.
MODELS = ["claude-sonnet-4-5-20250929", "claude-opus-4-5-20251101", "gpt-5"]
T0 = 1_700_000_000_000
SECOND = 1_000
HOUR = 3_600 * SECOND
TOKEN_COLUMNS = [
    "context_tokens",
    "uncached_input",
    "cache_read",
    "cache_write_5m",
    "cache_write_1h",
    "output",
]
COST_COLUMNS = list(replay_module.COST_COLUMNS)
PRICES = PriceBook()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Gaps between requests: seconds, minutes (around the 5-minute TTL), hours (around 1 hour).
GAPS = st.one_of(
    st.integers(1 * SECOND, 60 * SECOND),
    st.integers(60 * SECOND, 15 * 60 * SECOND),
    st.integers(15 * 60 * SECOND, 3 * HOUR),
)
MAYBE_ZERO = st.one_of(st.just(0), st.integers(1, 6_000))
#: Flags that keep a block in the context, and those that may take it out.
KEPT_FLAGS = [0, int(Flag.HUMAN), int(Flag.REGENERABLE)]
REMOVAL_FLAGS = [*KEPT_FLAGS, int(Flag.ARTIFACT), int(Flag.STRIPPED)]


@st.composite
def sessions(draw: st.DrawFn, sid: str, removal: bool) -> Session:
    """A random session. `removal`: blocks may be hidden (rewind, or STRIPPED thinking) or
    compacted away, some are compaction artifacts, and the recording compacted at random
    requests; without it the context only grows."""
    n = draw(st.integers(1, 10))
    gaps = draw(st.lists(GAPS, min_size=n - 1, max_size=n - 1))
    ts = np.cumsum([T0, *gaps]).astype(np.int64)
    m = draw(st.integers(0, 40))
    first = np.array(sorted(draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))))
    events: list[CompactionEvent] = []
    if removal:
        ends = st.one_of(st.just(int(NEVER)), st.integers(0, n))
        hidden = draw(st.lists(ends, min_size=m, max_size=m))
        compacted = draw(st.lists(ends, min_size=m, max_size=m))
        flags = draw(st.lists(st.sampled_from(REMOVAL_FLAGS), min_size=m, max_size=m))
        at = draw(st.sets(st.integers(1, n - 1), max_size=2)) if n > 1 else set()
        events = [CompactionEvent(k, "auto", -1, -1, int(ts[k])) for k in sorted(at)]
    else:
        hidden = compacted = [int(NEVER)] * m
        flags = draw(st.lists(st.sampled_from(KEPT_FLAGS), min_size=m, max_size=m))
    tokens = draw(st.lists(st.integers(0, 3_000), min_size=m, max_size=m))
    # Distinct content per block (equal hashes would claim equal content, and tokens).
    salt = draw(st.integers(0, 2**32 - 1)) << 32
    blocks: dict[str, Any] = {
        "msg": np.arange(m) // 2,
        "kind": draw(st.lists(st.sampled_from(list(Kind)), min_size=m, max_size=m)),
        "role": np.where(np.arange(m) % 2 == 0, int(Role.USER), int(Role.ASSISTANT)),
        "tool": np.full(m, -1),
        "link": np.full(m, -1),
        "tokens_raw": tokens,
        "tokens": tokens,
        "chars": np.array(tokens, dtype=np.int64) * 4,
        "hash": np.array([salt | (i + 1) for i in range(m)], dtype=np.uint64),
        "ts": ts[first] if m else np.zeros(0),
        "first_request": first,
        "hidden_from": hidden,
        "compacted_at": compacted,
        "origin": np.full(m, -1),
        "flags": flags,
        "path_hash": np.zeros(m),
    }
    prefix_tokens = draw(st.integers(0, 8_000))
    models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True))
    if draw(st.booleans()):
        # Plausible recorded reads: after the first request, at least the whole prefix (no
        # unlogged prefix reset is inferred, so the prefix cache stays usable).
        later = st.integers(prefix_tokens, prefix_tokens + 20_000)
        read = [draw(MAYBE_ZERO), *draw(st.lists(later, min_size=n - 1, max_size=n - 1))]
    else:
        read = draw(st.lists(MAYBE_ZERO, min_size=n, max_size=n))
    output = draw(st.lists(st.integers(0, 4_000), min_size=n, max_size=n))
    requests: dict[str, Any] = {
        "ts": ts,
        "model": draw(st.lists(st.integers(0, len(models) - 1), min_size=n, max_size=n)),
        "has_usage": np.ones(n, dtype=bool),
        "input": draw(st.lists(st.integers(0, 6_000), min_size=n, max_size=n)),
        "cache_read": read,
        "cache_write_5m": draw(st.lists(MAYBE_ZERO, min_size=n, max_size=n)),
        "cache_write_1h": draw(st.lists(MAYBE_ZERO, min_size=n, max_size=n)),
        "output": output,
        "output_recorded": output,
    }
    return Session(
        id=sid,
        kind="main",
        parent=-1,
        client="ctxsim-test",
        prefix_tokens=prefix_tokens,
        tools=[],
        models=models,
        blocks=block_columns({k: np.asarray(v) for k, v in blocks.items()}),
        requests=make_request_columns({k: np.asarray(v) for k, v in requests.items()}),
        events=events,
    )


@st.composite
def traces(draw: st.DrawFn, removal: bool = True) -> Trace:
    count = draw(st.integers(1, 2))
    return Trace(
        format="claude-code",
        source_digest="0" * 64,
        sessions=[draw(sessions(f"s{i}", removal)) for i in range(count)],
    )


def run(trace: Trace) -> pl.DataFrame:
    return replay([("t", trace)], policy.build("as-recorded"), prices=PRICES)


def _check_rows(trace: Trace, frame: pl.DataFrame) -> None:
    assert frame.height == sum(s.n_requests for s in trace.sessions)
    assert list(frame.columns[: len(ROW_SCHEMA)]) == list(ROW_SCHEMA)
    for name in TOKEN_COLUMNS + COST_COLUMNS:
        column = frame[name]
        assert column.null_count() == 0, name
        assert column.min() >= 0, (name, column.min())  # type: ignore[operator]
    parts = (
        frame["uncached_input"]
        + frame["cache_read"]
        + frame["cache_write_5m"]
        + frame["cache_write_1h"]
    )
    assert (parts == frame["context_tokens"]).all()
    assert (frame["cache_read"] <= frame["context_tokens"]).all()


@SETTINGS
@given(trace=traces())
def test_rows_are_consistent_splits_of_the_context(trace: Trace) -> None:
    """read <= context, everything >= 0, uncached + read + writes == context."""
    _check_rows(trace, run(trace))


@SETTINGS
@given(trace=traces(removal=False))
def test_append_only_never_reads_more_than_previous_view(trace: Trace) -> None:
    frame = run(trace)
    _check_rows(trace, frame)
    for i, session in enumerate(trace.sessions):
        rows = frame.filter(pl.col("session_index") == i).sort("request", "call")
        assert rows["kind"].to_list() == ["request"] * session.n_requests
        context = rows["context_tokens"].to_list()
        read = rows["cache_read"].to_list()
        # Append-only: the view never shrinks.
        assert all(b >= a for a, b in itertools.pairwise(context))
        # The first request can read only the part of the prefix warmed by other sessions.
        shared = min(int(session.requests["cache_read"][0]), session.prefix_tokens)
        assert read[0] <= shared
        for k in range(1, len(read)):
            assert read[k] <= context[k - 1], (k, read[k], context[k - 1])


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), other=traces())
def test_replay_is_deterministic(trace: Trace, other: Trace) -> None:
    """Two replays give identical frames, whether the policy object is fresh or reused
    (per-session state lives in SessionPolicy), and a trace's rows do not depend on what
    else is replayed in the same run."""
    first, second = run(trace), run(trace)
    assert first.equals(second)
    reused = policy.build("as-recorded")
    assert replay([("t", trace)], reused, prices=PRICES).equals(first)
    assert replay([("t", trace)], reused, prices=PRICES).equals(first)
    both = replay([("o", other), ("t", trace)], reused, prices=PRICES)
    assert both.filter(pl.col("trace") == "t").equals(first)


def _hand_session(blocks: list[tuple[int, int, int, int, int, int]], n: int) -> Session:
    """(kind, tokens, first_request, hidden_from, compacted_at, flags) per block; `n`
    requests one second apart on Sonnet 4.5 (minimum 1,024), each recorded as writing 5m
    entries; no system prefix (prefix_tokens 0), so no prefix inference comes in."""
    m = len(blocks)
    kind, tokens, first, hidden, compacted, flags = (list(c) for c in zip(*blocks, strict=True))
    ts = T0 + np.arange(n, dtype=np.int64) * SECOND
    columns: dict[str, Any] = {
        "msg": np.arange(m),
        "kind": kind,
        "role": np.full(m, int(Role.ASSISTANT)),
        "tool": np.full(m, -1),
        "link": np.full(m, -1),
        "tokens_raw": tokens,
        "tokens": tokens,
        "chars": np.array(tokens) * 4,
        "hash": np.arange(1, m + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15),
        "ts": ts[first],
        "first_request": first,
        "hidden_from": hidden,
        "compacted_at": compacted,
        "origin": np.full(m, -1),
        "flags": flags,
        "path_hash": np.zeros(m),
    }
    requests: dict[str, Any] = {
        "ts": ts,
        "model": np.zeros(n),
        "has_usage": np.ones(n, dtype=bool),
        "input": np.zeros(n),
        "cache_read": np.zeros(n),
        "cache_write_5m": np.full(n, 100),
        "cache_write_1h": np.zeros(n),
        "output": np.full(n, 10),
        "output_recorded": np.full(n, 10),
    }
    return hand_session(columns, requests, MODELS[0])


def _usage(session: Session) -> list[tuple[int, int, int, int, int]]:
    frame = run(Trace("claude-code", "0" * 64, [session]))
    cols = ["context_tokens", "uncached_input", "cache_read", "cache_write_5m", "cache_write_1h"]
    return frame.select(cols).rows()


def test_hand_session_append_only() -> None:
    """Sanity anchor for the properties: a 3-request append-only session by hand."""
    never = int(NEVER)
    session = _hand_session(
        [
            (int(Kind.TEXT), 2000, 0, never, never, 0),
            (int(Kind.TEXT), 500, 1, never, never, 0),
            (int(Kind.TEXT), 300, 2, never, never, 0),
        ],
        3,
    )
    assert _usage(session) == [
        (2000, 0, 0, 2000, 0),  # writes 2,000 at the message marker
        (2500, 0, 2000, 500, 0),  # reads 2,000, writes the new 500
        (2800, 0, 2500, 300, 0),  # reads 2,500, writes the new 300
    ]


def test_stripped_block_compacted_away_leaves_the_view() -> None:
    never = int(NEVER)
    session = _hand_session(
        [
            (int(Kind.TEXT), 2000, 0, never, never, 0),
            # Thinking, compacted away at request 1, stripped (hidden) only from request 2.
            (int(Kind.THINKING), 500, 0, 2, 1, int(Flag.STRIPPED)),
            (int(Kind.TEXT), 300, 1, never, never, 0),
        ],
        2,
    )
    assert _usage(session) == [
        (2500, 0, 0, 2500, 0),  # writes 2,500 at the marker on the thinking block
        # Compacted view [text 2,000, text 300]: its only entry (through the thinking block)
        # is gone from the prefix, so nothing is read and 2,300 is written.
        (2300, 0, 0, 2300, 0),
    ]


# -- the loss columns against a from-scratch recount -----------------------------------------


class _Recount:
    """The loss proxies of reports/METRICS.md recomputed from the whole view of every call
    (the engine's observer hook), with nothing kept between calls but what the definitions
    need (the artifacts at the last request row, the compaction calls of this request): the
    twin of simulator/loss.py's running totals."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.rows: list[tuple[int, int, int, int, bool, int]] = []
        self.index = -1
        self.seen: set[int] = set()
        self.summarized: list[tuple[int, int]] = []
        #: The previous call's last item (position, prefix hash), as it was sent.
        self.last: tuple[int, int] | None = None

    def __call__(self, index: int, k: int, view: Any, call: Any, usage: Any) -> None:
        session = self.trace.sessions[index]
        if index != self.index:
            self.index, self.seen, self.summarized, self.last = index, set(), [], None
        b = session.blocks
        flags = b["flags"].astype(np.int64)
        artifact = (flags & int(Flag.ARTIFACT)) != 0
        human = ((flags & int(Flag.HUMAN)) != 0) & ~artifact
        visible = (b["first_request"] <= k) & (k < b["hidden_from"])
        human_tokens = int(b["tokens"][human & visible].sum())
        hashes, tokens = b["hash"].astype(np.uint64).tolist(), b["tokens"].tolist()
        items = list(zip(view.ids, view.hashes, view.tokens, strict=True))
        verbatim = {i for i, h, t in items if i >= 0 and h == hashes[i] and t == tokens[i]}
        kept = sum(t for i, h, t in items if i in verbatim and human[i] and h == hashes[i])
        inserted = sum(t for i, _, t in items if i < 0) - session.prefix_tokens
        summary = sum(t for i, _, t in items if i >= 0 and artifact[i]) + max(0, inserted)
        stale, after = 0, False
        if call.kind == "request":
            path, kind, origin = b["path_hash"], b["kind"], b["origin"]
            read = (
                (kind == int(Kind.TOOL_RESULT))
                & ((flags & int(Flag.PATH_READ)) != 0)
                & ((flags & int(Flag.ERROR)) == 0)
                & ~artifact
            )
            use = (kind == int(Kind.TOOL_USE)) & (path != 0) & (origin == k) & ~artifact
            for block in np.flatnonzero(use).tolist():
                older = np.flatnonzero(read & visible & (path == path[block]))
                older = older[older < block]
                stale += bool(older.size) and int(older[-1]) not in verbatim
            chains = view.chains
            after = any(p >= len(chains) or chains[p] != c for p, c in self.summarized)
            in_view = {i for i, _, _ in items if i >= 0 and artifact[i]}
            after = after or bool(in_view - self.seen)
            self.seen, self.summarized = in_view, []
        elif call.kind == "compaction" and len(view.chains) >= 2:
            self.summarized.append((len(view.chains) - 2, view.chains[-2]))
        elif call.kind == "compaction" and self.last is not None:
            self.summarized.append(self.last)  # it sends no view: it summarized the last one
        self.last = (len(view.chains) - 1, view.chains[-1]) if view.chains else None
        resent = usage[0] + usage[2] + usage[3] if after else 0
        self.rows.append((human_tokens, kept, summary, stale, after, resent))


LOSS_COLUMNS = [
    "human_tokens",
    "human_verbatim_tokens",
    "summary_tokens",
    "stale_file_refs",
    "after_compaction",
    "resent_tokens",
]


def _check_loss_recount(traces: list[tuple[str, Trace]], name: str, params: Any = None) -> None:
    for label, trace in traces:
        recount = _Recount(trace)
        frame = replay([(label, trace)], policy.build(name, params), observe=recount, loss=True)
        assert frame.columns[-len(LOSS_COLUMNS) :] == LOSS_COLUMNS
        assert frame.select(LOSS_COLUMNS).rows() == recount.rows, (name, label)


#: Every Claude Code stage on: the stages that rewrite the middle of the view (clearing,
#: snip, collapse) as well as compaction calls.
ALL_STAGES = {
    "budget.per_message.enabled": True,
    "snip.enabled": True,
    "microcompact.time_based.enabled": True,
    "microcompact.cached.enabled": True,
    "autocompact.session_memory.enabled": True,
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_loss_columns_equal_a_recount_on_random_sessions(trace: Trace) -> None:
    """Recorded compactions and artifacts (as-recorded), policies that compact and mask:
    the running totals give what a recount of each view gives."""
    for name, params in (
        ("as-recorded", None),
        ("claude-code", ALL_STAGES),
        ("masking", None),
    ):
        _check_loss_recount([("t", trace)], name, params)


def test_loss_columns_equal_a_recount_under_every_policy_on_the_samples() -> None:
    """The samples have file reads and uses (stale references) and recorded compactions;
    every registered policy, and Claude Code with every stage on."""

    from traces.load import load

    samples = SAMPLES
    named = [(item.name, item.trace) for item in load([samples])]
    for name in policy.names():
        _check_loss_recount(named, name)
    _check_loss_recount(named, "claude-code", ALL_STAGES)
    _check_loss_recount(named, "claude-code", {**ALL_STAGES, "collapse.enabled": True})


def test_injected_at_counts_the_artifacts_entering_at_a_request() -> None:
    """`Session.injected_at`, the unlogged attachments the builder booked at a request:
    INJECTED blocks flagged ARTIFACT entering there, nothing else."""
    injected, artifact = int(Kind.INJECTED), int(Flag.ARTIFACT)
    session = _hand_session(
        [
            (injected, 70, 1, NEVER, NEVER, artifact),
            (injected, 300, 2, NEVER, NEVER, artifact),
            (injected, 200, 2, NEVER, NEVER, 0),  # a reminder, not booked for the usage
            (int(Kind.TEXT), 50, 2, NEVER, NEVER, artifact),
            (injected, 11, 2, NEVER, NEVER, artifact),
        ],
        3,
    )
    assert [session.injected_at(k) for k in range(3)] == [0, 70, 311]
