"""traces/synthetic.py: deterministic, well-formed, replayable as recorded, and fitted.

The generator's statistics are checked by measuring a generated corpus with the very code
that fits the real one (simulator/app/measure/synth_fit.py): what the fit reads from
generated sessions must be the parameters they were generated from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simulator import policy
from simulator.app.measure import synth_fit
from simulator.model import NEVER, Flag, Kind, Session, Trace
from simulator.replay import replay
from traces import compiled
from traces.synthetic import (
    COMPACT_AT,
    FIVE_MINUTES_MS,
    PARAMS_PATH,
    LogNormal,
    SynthParams,
    load_params,
    synthetic_session,
    synthetic_trace,
    write_corpus,
)

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
    _assert_tool_sizes_within_bounds(s)


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


def _assert_tool_sizes_within_bounds(s: Session) -> None:
    """Every tool_use and tool_result is inside its tool's fitted clipping bounds."""
    b = s.blocks
    by_name = {t.name: t for t in load_params().tools}
    for i in np.flatnonzero((b["kind"] == Kind.TOOL_USE) | (b["kind"] == Kind.TOOL_RESULT)):
        tool = by_name[s.tools[b["tool"][i]]]
        dist = tool.use if b["kind"][i] == Kind.TOOL_USE else tool.result
        assert dist.lo <= b["tokens"][i] <= dist.hi


# -- corpus files ---------------------------------------------------------------------------


def test_write_corpus_same_seed_same_bytes(tmp_path: Path) -> None:
    a = write_corpus(tmp_path / "a", 3, 80, 7)
    b = write_corpus(tmp_path / "b", 3, 80, 7)
    other = write_corpus(tmp_path / "c", 3, 80, 8)
    assert [p.name for p in a] == ["synth-7-0.ctxt", "synth-7-1.ctxt", "synth-7-2.ctxt"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert len({p.read_bytes() for p in a}) == 3, "the sessions of one corpus differ"
    assert not {p.read_bytes() for p in a} & {p.read_bytes() for p in other}
    back = compiled.read(a[1])
    assert back.equals(synthetic_trace(80, 7, index=1))
    assert back.sessions[0].n_requests == 80


def test_trace_is_the_session_and_index_gives_independent_sessions() -> None:
    t = synthetic_trace(200, 5, index=2)
    assert _trace(200, 5).sessions[0].blocks.equals(synthetic_trace(200, 5).sessions[0].blocks)
    assert synthetic_session(200, 5, index=2).blocks.equals(t.sessions[0].blocks)
    other = synthetic_trace(200, 5, index=3)
    assert not t.sessions[0].blocks.equals(other.sessions[0].blocks)
    assert t.source_digest != other.source_digest
    assert t.sessions[0].models == [load_params().model]


# -- thinking -------------------------------------------------------------------------------


def test_thinking_stripped_at_a_human_turn_for_a_model_that_drops_it() -> None:
    """Sonnet 4.5 drops earlier turns' thinking: the context shrinks by it at a human turn,
    the warm read is the previous context less it, and replay reproduces the usage."""
    trace = Trace("synthetic", "", [synthetic_session(400, 11, model="claude-sonnet-4-5-20250929")])
    s = trace.sessions[0]
    b, r = s.blocks, s.requests
    thinking = b["kind"] == Kind.THINKING
    stripped = (b["flags"] & Flag.STRIPPED) != 0
    assert stripped.any() and (thinking | ~stripped).all()
    human = np.unique(b["first_request"][(b["flags"] & Flag.HUMAN) != 0])
    assert set(b["hidden_from"][stripped].tolist()) <= set(human.tolist())
    context = s.recorded_context()
    compacted = {e.request for e in s.events}
    for k in range(1, s.n_requests):
        assert context[k] == s.prefix_tokens + b["tokens"][s.view_mask(k, as_recorded=True)].sum()
        left = stripped & (b["hidden_from"] == k) & (b["first_request"] < k)
        warm = k not in compacted and r["ts"][k] - r["ts"][k - 1] < FIVE_MINUTES_MS
        expected = context[k - 1] - b["tokens"][left].sum() if warm else s.prefix_tokens
        assert r["cache_read"][k] == expected
    frame = replay([("synthetic", trace)], policy.build("as-recorded"))
    assert frame["context_tokens"].to_list() == context.tolist()
    assert frame["cache_read"].to_list() == r["cache_read"].tolist()
    assert frame["cache_write_5m"].to_list() == r["cache_write_5m"].tolist()


def test_the_fitted_model_keeps_thinking(trace: Trace) -> None:
    b = trace.sessions[0].blocks
    assert (b["kind"] == Kind.THINKING).any()
    assert not (b["flags"] & Flag.STRIPPED).any()


# -- statistics -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured() -> synth_fit.Sample:
    """20 sessions x 300 requests, measured by the code that fits the real corpus."""
    sample = synth_fit.Sample()
    for index in range(20):
        sample.add(synthetic_session(300, 2024, index=index))
    return sample


def _median_ratio(values: list[int], dist: LogNormal) -> float:
    return float(np.median(values)) / dist.median


def test_tool_mix_matches_the_fit(measured: synth_fit.Sample) -> None:
    params = load_params()
    total = sum(len(v) for v in measured.uses.values())
    assert set(measured.uses) <= {t.name for t in params.tools}
    for t in params.tools:
        assert abs(len(measured.uses[t.name]) / total - t.share) < 0.02, t.name


def test_tool_sizes_and_errors_match_the_fit(measured: synth_fit.Sample) -> None:
    """Median sizes of the well-sampled tools within 25% of the fitted median exp(mu)."""
    checked = 0
    for t in load_params().tools:
        results = measured.results[t.name]
        if len(results) < 500:
            continue
        checked += 1
        assert abs(_median_ratio(results, t.result) - 1) < 0.25, t.name
        assert abs(_median_ratio(measured.uses[t.name], t.use) - 1) < 0.25, t.name
        assert abs(np.mean(measured.errors[t.name]) - t.error) < 0.03, t.name
    assert checked >= 3


def test_turns_responses_and_messages_match_the_fit(measured: synth_fit.Sample) -> None:
    p = load_params()
    assert abs(measured.human_requests / measured.later_requests - p.human_share) < 0.012
    assert abs(_median_ratio(measured.human_tokens, p.human) - 1) < 0.3
    calls = sum(c for k, c in measured.calls.items() if k > 0)
    assert abs(measured.calls[1] / calls - p.calls[0]) < 0.02
    assert max(measured.calls) <= len(p.calls)
    assert (
        abs(len(measured.text_with_tools) / measured.tool_responses - p.text_with_tools_share)
        < 0.03
    )
    assert abs(_median_ratio(measured.text_with_tools, p.text_with_tools) - 1) < 0.15
    assert abs(_median_ratio(measured.text_final, p.text_final) - 1) < 0.3
    assert abs(len(measured.thinking) / measured.thinking_responses - p.thinking_share) < 0.02
    assert abs(_median_ratio(measured.thinking, p.thinking) - 1) < 0.15


def test_gaps_match_the_fit(measured: synth_fit.Sample) -> None:
    p = load_params()
    for gaps, c in ((measured.gaps_turn, p.gap_turn), (measured.gaps_human, p.gap_human)):
        g = np.asarray(gaps)
        short = g[g < FIVE_MINUTES_MS]
        assert abs(float(np.median(short)) / c.short.median - 1) < 0.2
        assert abs((g >= FIVE_MINUTES_MS).mean() - c.idle) < max(0.3 * c.idle, 0.005)
    idle = np.asarray(measured.gaps_turn + measured.gaps_human)
    idle = idle[idle >= FIVE_MINUTES_MS]
    assert idle.min() > FIVE_MINUTES_MS and idle.max() <= p.idle_max_ms


# -- parameters -----------------------------------------------------------------------------


def test_committed_params_load_and_are_validated() -> None:
    data = json.loads(PARAMS_PATH.read_text())
    params = SynthParams.from_dict(data)
    assert params == load_params()
    assert params.tools[-1].name == "Other"
    assert math.isclose(sum(t.share for t in params.tools), 1, abs_tol=0.01)
    data["calls_per_response"]["p"] = [0.5] * 9
    with pytest.raises(ValueError):
        SynthParams.from_dict(data)


def test_check_tolerates_only_rounding() -> None:
    assert synth_fit.differences({"a": [1.234, 5]}, {"a": [1.235, 5]}) == []
    assert synth_fit.differences({"a": [1.234, 5]}, {"a": [1.24, 5]}) != []
    assert synth_fit.differences({"a": 5}, {"a": 6}) != []
    assert synth_fit.differences({"a": 1}, {"b": 1}) != []


@pytest.mark.shared
def test_committed_params_are_the_fit_of_the_shared_corpus(shared: Path) -> None:
    assert synth_fit.main(["--check", "--corpus", str(shared / "claude-code")]) == 0


def test_synth_command_writes_identical_corpora(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from simulator.app.cli import main

    for name in ("a", "b"):
        args = [
            "synth",
            "--sessions",
            "2",
            "--requests",
            "30",
            "--seed",
            "5",
            "--out",
            str(tmp_path / name),
        ]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    first = sorted((tmp_path / "a").iterdir())
    assert [p.name for p in first] == ["synth-5-0.ctxt", "synth-5-1.ctxt"]
    for p in first:
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes()
