"""One suite, every registered policy: the invariants any context policy must keep.

* two replays give identical rows;
* a tool_use and its tool_result are never separated in what a request sends;
* a request whose view exceeds the model's window is flagged as an overflow;
* no compaction makes the conversation bigger;
* the policy (its spec) survives pickling, and the pickled copy replays identically;
* hypothesis-generated sessions hold all of the above.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import policy as registry
from simulator.model import Kind, Role, Session, Trace
from simulator.models import facts
from simulator.policy import Call
from simulator.prompt_cache import Usage
from simulator.replay import replay
from simulator.view import View
from tests.support import SAMPLES, Named, source_folders, stable_pick
from traces.builder import Hasher, SessionBuilder
from traces.load import load_all, units

POLICIES = registry.names()
MODEL = "claude-sonnet-4-5-20250929"


@dataclass
class Seen:
    """What the observer saw: per call, the block ids of the view and its size."""

    views: list[tuple[int, int, str, list[int], int]] = field(default_factory=list)

    def __call__(self, session: int, k: int, view: View, call: Call, usage: Usage) -> None:
        ids = [b for b in view.ids if b >= 0]
        self.views.append((session, k, call.kind, ids, view.total))


def _check(trace: Trace, name: str) -> pl.DataFrame:
    seen = Seen()
    policy = registry.build(name)
    frame = replay([("t", trace)], policy, observe=seen)
    again = replay([("t", trace)], policy)
    assert frame.equals(again), f"{name}: two replays differ"
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.spec() == policy.spec()
    assert replay([("t", trace)], copy).equals(frame), f"{name}: pickled copy differs"
    for session_index, k, kind, ids, _ in seen.views:
        s = trace.sessions[session_index]
        _tool_pairs_kept(s, ids, k, name, kind)
    requests = frame.filter(pl.col("kind") == "request")
    for s_index, s in enumerate(trace.sessions):
        if not s.n_requests:
            continue
        window = facts(s.models[int(s.requests["model"][0])]).window
        rows = requests.filter(pl.col("session_index") == s_index)
        over = rows.filter(pl.col("context_tokens") > window)
        assert over["overflow"].all(), f"{name}: a request above the window is not flagged"
    _compactions_shrink(frame, trace, name)
    numeric = [c for c, t in frame.schema.items() if t.is_numeric()]
    for c in numeric:
        assert (frame[c].drop_nulls() >= 0).all(), f"{name}: negative {c}"
    return frame


def _tool_pairs_kept(s: Session, ids: list[int], k: int, name: str, kind: str) -> None:
    """Every result sent has its call sent, and every call sent whose result exists by k has
    its result sent (unless the result was rewound away)."""
    b = s.blocks
    sent = np.asarray(ids, dtype=np.int64)
    if not len(sent):
        return
    other = b["link"][sent].astype(np.int64)
    linked = other >= 0
    present = np.zeros(len(b), dtype=bool)
    present[sent] = True
    kinds = b["kind"][sent]
    results = linked & (kinds == Kind.TOOL_RESULT)
    assert present[other[results]].all(), (
        f"{name}: request {k} ({kind}) sends a result without its call"
    )
    calls = linked & (kinds == Kind.TOOL_USE)
    partner = other[calls]
    due = b["first_request"][partner] <= k
    hidden = b["hidden_from"][partner] <= k
    assert (present[partner] | hidden | ~due).all(), (
        f"{name}: request {k} ({kind}) sends a call without its result"
    )


def _compactions_shrink(frame: pl.DataFrame, trace: Trace, name: str) -> None:
    """A request right after a compaction sends no more than the previous request plus
    what entered since: compacting never makes the conversation bigger."""
    requests = frame.filter(pl.col("kind") == "request")
    compacted = frame.filter(pl.col("kind") == "compaction").select("session_index", "request")
    for s_index, k in compacted.unique().iter_rows():
        if k == 0:
            continue
        rows = requests.filter(pl.col("session_index") == s_index)
        before = rows.filter(pl.col("request") == k - 1)["context_tokens"]
        after = rows.filter(pl.col("request") == k)["context_tokens"]
        if before.is_empty() or after.is_empty():
            continue
        b = trace.sessions[s_index].blocks
        entered = int(b["tokens"][b["first_request"] == k].sum())
        assert after[0] <= before[0] + entered, (
            f"{name}: the compaction at request {k} of session {s_index} made the context bigger"
        )


@pytest.fixture(scope="module")
def samples() -> list[tuple[str, Trace]]:
    return [(item.name, item.trace) for item in load_all(units([SAMPLES]))]


@pytest.mark.parametrize("name", POLICIES)
def test_policy_conforms_on_the_samples(name: str, samples: list[tuple[str, Trace]]) -> None:
    for _, trace in samples:
        _check(trace, name)


def _conformance_sample(named: list[tuple[str, Trace]], salt: str) -> list[Trace]:
    """What the invariants need of one source folder: its longest trace (the largest
    contexts, so overflows and compactions), up to two with a recorded compaction (artifacts,
    recorded events), and one picked by a keyed hash (an ordinary session). The invariants
    hold per call, so a sample of each source's shapes checks them; replaying all 400+
    shared traces three times under each of 20 policies took eight minutes."""

    def size(t: Trace) -> int:
        return sum(s.n_requests for s in t.sessions)

    by_name = dict(named)
    longest = sorted(by_name, key=lambda n: (-size(by_name[n]), n))[:1]
    compacted = [
        n
        for n in sorted(by_name, key=lambda n: (-size(by_name[n]), n))
        if any(s.events for s in by_name[n].sessions)
    ][:2]
    picked = stable_pick(sorted(by_name), 1, salt)
    return [by_name[n] for n in dict.fromkeys([*longest, *compacted, *picked])]


@pytest.fixture(scope="module")
def shared_traces(shared: Path, shared_corpus: Callable[[str], Named]) -> list[Trace]:
    """A sample of every source folder of ../shared/traces: Claude Code, Codex, SWE-agent."""
    return [
        trace
        for folder in source_folders(shared)
        for trace in _conformance_sample(shared_corpus(folder), folder)
    ]


def test_the_shared_sample_covers_every_source_and_a_large_context(
    shared: Path, shared_traces: list[Trace]
) -> None:
    assert len(shared_traces) >= len(source_folders(shared))
    assert {"claude-code", "codex", "swe-agent"} <= {t.format for t in shared_traces}
    contexts = [int(s.recorded_context().max(initial=0)) for t in shared_traces for s in t.sessions]
    assert max(contexts) > 200_000  # a 1M-window session is in the sample
    assert any(s.events for t in shared_traces for s in t.sessions)


@pytest.mark.parametrize("name", POLICIES)
def test_policy_conforms_on_the_shared_traces(name: str, shared_traces: list[Trace]) -> None:
    for trace in shared_traces:
        _check(trace, name)


@pytest.fixture(scope="module")
def synthetic_corpus() -> list[Trace]:
    from traces.synthetic import synthetic_session

    return [Trace("claude-code", f"s{i}", [synthetic_session(400, seed=i)]) for i in range(3)]


@pytest.mark.parametrize("name", POLICIES)
def test_policy_conforms_on_a_synthetic_corpus(name: str, synthetic_corpus: list[Trace]) -> None:
    for trace in synthetic_corpus:
        _check(trace, name)


# -- generated sessions -------------------------------------------------------------------


@st.composite
def sessions(draw: st.DrawFn) -> Trace:
    """A tool-using session that grows past the compaction thresholds of most policies."""
    builder = SessionBuilder(
        Hasher(b"conformance"), id="g", kind="main", client="claude-code 2.1.40"
    )
    builder.prefix_tokens = draw(st.integers(0, 20_000))
    n = draw(st.integers(2, 40))
    big = draw(st.booleans())
    t = 0
    msg = 0
    for k in range(n):
        if k:
            builder.add_block(
                msg=msg,
                kind=Kind.TEXT,
                role=Role.ASSISTANT,
                text=f"a{k}",
                ts=t,
                first_request=k,
                origin=k - 1,
                tokens=draw(st.integers(1, 300)),
            )
            use = builder.add_block(
                msg=msg,
                kind=Kind.TOOL_USE,
                role=Role.ASSISTANT,
                text=f"u{k}",
                ts=t,
                first_request=k,
                origin=k - 1,
                tool="Bash",
                use_id=f"t{k}",
                tokens=draw(st.integers(5, 200)),
            )
            del use
            msg += 1
            size = draw(st.integers(10, 40_000 if big else 3_000))
            builder.add_block(
                msg=msg,
                kind=Kind.TOOL_RESULT,
                role=Role.USER,
                text=f"r{k}",
                ts=t,
                first_request=k,
                tool="Bash",
                result_for=f"t{k}",
                tokens=size,
            )
        if k == 0 or draw(st.integers(0, 5)) == 0:
            builder.add_block(
                msg=msg,
                kind=Kind.TEXT,
                role=Role.USER,
                text=f"h{k}",
                ts=t,
                first_request=k,
                tokens=draw(st.integers(1, 2_000)),
            )
        msg += 1
        t += draw(st.sampled_from([2_000, 30_000, 400_000, 4_000_000]))
        builder.add_request(ts=t, model=MODEL, usage=None)
    session = builder.finish()
    np.testing.assert_array_equal(session.blocks["tokens"], session.blocks["tokens_raw"])
    return Trace("claude-code", "g", [session])


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=sessions())
def test_policy_conforms_on_generated_sessions(name: str, trace: Trace) -> None:
    _check(trace, name)
