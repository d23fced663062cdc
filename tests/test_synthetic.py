"""traces/synthetic.py: deterministic, well-formed, and replayable as recorded."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import policy
from simulator.model import NEVER, Flag, Kind, Trace
from simulator.replay import replay
from traces.synthetic import COMPACT_AT, synthetic_session, synthetic_trace

N = 600


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthetic_trace(N, 3)


def _trace(n: int, seed: int) -> Trace:
    return Trace("synthetic", "", [synthetic_session(n, seed)])


def test_same_seed_same_session_other_seed_different() -> None:
    assert _trace(300, 1).equals(_trace(300, 1))
    assert not _trace(300, 1).equals(_trace(300, 2))


@pytest.mark.parametrize("n", [1, 2, 57, N])
def test_request_count(n: int) -> None:
    assert synthetic_session(n, 0).n_requests == n


def test_fewer_than_one_request_is_refused() -> None:
    with pytest.raises(ValueError):
        synthetic_session(0, 0)


def test_timestamps_are_monotone_with_short_and_idle_gaps(trace: Trace) -> None:
    s = trace.sessions[0]
    gaps = np.diff(s.requests["ts"])
    assert (gaps > 0).all()
    assert (gaps < 5 * 60_000).mean() > 0.9
    assert ((gaps >= 6 * 60_000) & (gaps <= 70 * 60_000)).any()
    assert (np.diff(s.blocks["ts"]) >= 0).all()


def test_recorded_context_stays_under_the_window_and_compacts(trace: Trace) -> None:
    s = trace.sessions[0]
    context = s.recorded_context()
    assert context.max() <= COMPACT_AT < 200_000
    assert s.events, "600 requests should pass the compaction threshold"
    for event in s.events:
        assert context[event.request] < context[event.request - 1]  # the sawtooth
        summary = event.summary_block
        assert s.blocks["kind"][summary] == Kind.SUMMARY
        assert s.blocks["flags"][summary] & Flag.ARTIFACT
    assert (s.blocks["compacted_at"] < NEVER).any()


def test_recorded_usage_is_the_view_and_a_five_minute_cache(trace: Trace) -> None:
    """Context = prefix + the as-recorded view; tool sizes within their bounds; reads are
    the previous context after a short gap, the prefix after an idle one or a compaction."""
    s = trace.sessions[0]
    r = s.requests
    tokens = s.blocks["tokens"]
    assert (r["input"] == 0).all() and (r["cache_write_1h"] == 0).all()
    assert not (s.blocks["kind"] == Kind.INJECTED).any()
    context = s.recorded_context()
    compacted = {e.request for e in s.events}
    for k in range(s.n_requests):
        assert context[k] == s.prefix_tokens + tokens[s.view_mask(k, as_recorded=True)].sum()
        warm = k > 0 and k not in compacted and r["ts"][k] - r["ts"][k - 1] < 5 * 60_000
        assert r["cache_read"][k] == (context[k - 1] if warm else s.prefix_tokens)
    results = tokens[s.blocks["kind"] == Kind.TOOL_RESULT]
    assert results.min() >= 50 and results.max() <= 20_000


def test_tool_results_follow_their_tool_use(trace: Trace) -> None:
    b = trace.sessions[0].blocks
    results = np.flatnonzero(b["kind"] == Kind.TOOL_RESULT)
    uses = b["link"][results]
    assert (uses >= 0).all()
    assert (b["kind"][uses] == Kind.TOOL_USE).all()
    assert (b["first_request"][uses] == b["first_request"][results]).all()
    assert (b["origin"][uses] == b["first_request"][results] - 1).all()


def test_as_recorded_replay_runs_and_reproduces_the_recorded_usage(trace: Trace) -> None:
    frame = replay([("synthetic", trace)], policy.build("as-recorded"))
    s = trace.sessions[0]
    assert frame.height == s.n_requests
    assert frame["context_tokens"].to_list() == s.recorded_context().tolist()
    assert frame["cache_read"].to_list() == s.requests["cache_read"].tolist()
    assert frame["cache_write_5m"].to_list() == s.requests["cache_write_5m"].tolist()
    assert frame["uncached_input"].to_list() == s.requests["input"].tolist()
    assert frame["cost_total"].null_count() == 0
