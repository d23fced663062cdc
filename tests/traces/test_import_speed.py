"""The import's fast paths give what the slow ones gave (issue 16).

The anchoring's running median must be np.median's value bit for bit (the compiled bytes
must not change), the parallel loader must hand results back in unit order, and a server
pass list too short to split must read as no split.
"""

from __future__ import annotations

import bisect
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import FIXTURES, SAMPLES
from traces import load
from traces.builder import _distribute, _distribute_numpy, _middle, usage_iterations
from traces.cache import CompileCache
from traces.load import load_all, load_unit, units
from traces.source import ImportUnit, SourceFile

ratios = st.floats(min_value=0.0, max_value=50.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(ratios, min_size=1, max_size=60))
def test_running_median_is_numpys(values: list[float]) -> None:
    ordered: list[float] = []
    for v in values:
        bisect.insort(ordered, v)
        got = _middle(ordered)
        want = float(np.median(ordered))
        assert got.hex() == want.hex()
        assert type(got) is float


def test_middle_of_even_count_is_the_mean_of_the_two() -> None:
    assert _middle([1.0, 2.0]) == 1.5
    assert _middle([0.1, 0.2, 0.7, 9.0]) == (0.2 + 0.7) / 2
    assert _middle([3.0]) == 3.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(-5, 10**6))
def test_one_weight_gets_the_whole_total(total: int, weight: int) -> None:
    got = _distribute(total, np.array([weight], dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == [total]


def test_one_iteration_is_no_split() -> None:
    one = {"type": "message", "input_tokens": 5, "output_tokens": 2}
    usage = {"input_tokens": 5, "output_tokens": 2, "iterations": [one]}
    assert usage_iterations(usage) == ()
    two = {**usage, "input_tokens": 10, "iterations": [one, one]}
    assert len(usage_iterations(two)) == 2


def test_parallel_load_keeps_unit_order_and_restores_the_switch_interval() -> None:
    found = units([SAMPLES, FIXTURES / "codex", FIXTURES / "swe_agent"])
    assert len(found) > 5
    before = sys.getswitchinterval()
    serial = [item.name for item in load_all(found, lenient=True, jobs=1)]
    parallel = [item.name for item in load_all(found, lenient=True, jobs=2)]
    assert parallel == serial
    assert sys.getswitchinterval() == before


def test_unit_size_sums_its_files_and_counts_a_missing_one_as_empty(tmp_path: Path) -> None:
    main, sub = tmp_path / "a.jsonl", tmp_path / "agent-b.jsonl"
    main.write_bytes(b"{}\n")
    sub.write_bytes(b"{}\n" * 50)
    files = [SourceFile(main, "a.jsonl"), SourceFile(sub, "agent-b.jsonl")]
    assert load._size(ImportUnit("claude-code", files, ["subagent"])) == 153
    gone = SourceFile(tmp_path / "gone.jsonl", "gone.jsonl")
    assert load._size(ImportUnit("claude-code", [gone, files[0]], ["subagent"])) == 3


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.lists(st.integers(0, 10**5), min_size=2, max_size=40))
def test_short_split_is_numpys(total: int, weights: list[int]) -> None:
    w = np.array(weights, dtype=np.int64)
    got = _distribute(total, w)
    assert got.dtype == np.int64
    assert got.tolist() == _distribute_numpy(total, w).tolist()
    assert int(got.sum()) == total


def test_short_split_breaks_ties_by_position() -> None:
    assert _distribute(2, np.array([1, 1, 1], dtype=np.int64)).tolist() == [1, 1, 0]
    assert _distribute(5, np.array([0, 0], dtype=np.int64)).tolist() == [3, 2]


def test_cache_writes_again_into_a_shard_removed_since(tmp_path: Path) -> None:
    found = units([FIXTURES / "codex"])
    cache = CompileCache(tmp_path / "cache")
    trace = load_unit(found[0], lenient=True).trace
    path = cache.put(trace)
    path.unlink()
    path.parent.rmdir()
    assert cache.put(trace) == path
    assert cache.get(trace.source_digest) is not None


def test_two_parallel_loads_at_once_leave_the_switch_interval_as_it_was() -> None:
    found = units([FIXTURES / "codex"])
    before = sys.getswitchinterval()
    a = load_all(found, lenient=True, jobs=2)
    b = load_all(found, lenient=True, jobs=2)
    next(a)
    next(b)
    assert sys.getswitchinterval() == min(before, load.SWITCH_INTERVAL)
    a.close()  # the first to start ends first: the second still runs on the short interval
    assert sys.getswitchinterval() == min(before, load.SWITCH_INTERVAL)
    b.close()
    assert sys.getswitchinterval() == before
