"""Dollar sums do not depend on the order or chunking of the rows they add (simulator/frames.py
`float_sum`): polars adds a group's floats in partial sums that follow its threads and chunks,
and the files of a run must be identical on rerun."""

from __future__ import annotations

import itertools
import random

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.frames import float_sum, session_rows
from tests.support import SAMPLES

_COSTS = st.lists(
    st.floats(min_value=0.0, max_value=50.0, allow_nan=False, allow_infinity=False),
    min_size=2,
    max_size=400,
)


def _chunked(frame: pl.DataFrame, cuts: list[int]) -> pl.DataFrame:
    """The same rows as a frame of several chunks (cut at `cuts`), not rechunked."""
    bounds = sorted({0, frame.height, *(c % (frame.height + 1) for c in cuts)})
    parts = [frame.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    return pl.concat(parts, rechunk=False)


@settings(max_examples=60, deadline=None)
@given(_COSTS, st.integers(0, 2**32), st.lists(st.integers(0, 400), max_size=5))
def test_a_group_sum_is_the_same_for_any_order_and_chunking(
    costs: list[float], seed: int, cuts: list[int]
) -> None:
    groups = [i % 3 for i in range(len(costs))]
    frame = pl.DataFrame({"g": groups, "x": costs})
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=seed)
    want = frame.group_by("g").agg(float_sum(pl.col("x"))).sort("g")
    for other in (shuffled, _chunked(shuffled, cuts)):
        got = other.group_by("g").agg(float_sum(pl.col("x"))).sort("g")
        assert got["x"].to_list() == want["x"].to_list()  # bit for bit, not approximately


def test_the_plain_sum_is_not_so() -> None:
    """Why `float_sum` exists: the same values in another order add up to other bits."""
    rng = random.Random(7)
    values = [rng.random() * 10 for _ in range(1_000)]
    orders = {sum(rng.sample(values, len(values))) for _ in range(20)}
    assert len(orders) > 1
    frame = pl.DataFrame({"x": values})
    sums = {
        frame.sample(fraction=1.0, shuffle=True, seed=s).select(float_sum(pl.col("x"))).item()
        for s in range(20)
    }
    assert len(sums) == 1


def test_session_dollars_are_the_same_for_rows_in_any_order() -> None:
    """sessions.parquet's dollars from the samples' request rows in another order and in
    several chunks: the same bits."""
    from simulator.app import api
    from simulator.frames import COST_COLUMNS

    run = api.replay(api.load([SAMPLES], cache=False), ["as-recorded"])
    rows = run.requests
    assert rows.height > 50
    keys = ["trace", "session_index"]
    want = session_rows(rows).sort(keys).select(*keys, *COST_COLUMNS)
    for seed in range(5):
        mixed = _chunked(rows.sample(fraction=1.0, shuffle=True, seed=seed), [13, 37, 61])
        got = session_rows(mixed).sort(keys).select(*keys, *COST_COLUMNS)
        assert got.rows() == want.rows()
