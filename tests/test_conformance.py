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
from traces.builder import Hasher, SessionBuilder
from traces.load import load_all, units

POLICIES = registry.names()
MODEL = "claude-sonnet-4-5-20250929"
SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples"


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
    b = s.blocks
    present = set(ids)
    link = b["link"]
    kinds = b["kind"]
    for block in ids:
        other = int(link[block])
        if other < 0:
            continue
        if kinds[block] == Kind.TOOL_RESULT:
            assert other in present, f"{name}: request {k} ({kind}) sends a result without its call"
        elif kinds[block] == Kind.TOOL_USE and b["first_request"][other] <= k:
            hidden = b["hidden_from"][other] <= k
            assert other in present or hidden, (
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


@pytest.fixture(scope="module")
def shared_traces(shared: Path) -> list[Trace]:
    """Every trace in ../shared/traces: Claude Code, Codex and SWE-agent."""
    return [item.trace for item in load_all(units([shared]), lenient=True)]


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
