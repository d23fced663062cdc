"""The run's request frame is built without a whole-frame sort or a second copy (issue 16),
and is the very frame the sort gave: same rows, same order, same dtypes, one chunk, same
Parquet bytes (simulator/frames.py `in_order`, `RowParts`, `recorded_priced`)."""

from __future__ import annotations

import itertools

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import policy as registry
from simulator import run as service
from simulator.frames import (
    REQUEST_ORDER,
    RowParts,
    as_written,
    build_run,
    compact,
    parquet_bytes,
    recorded,
    recorded_priced,
    request_rows,
    restored,
)
from simulator.model import Kind, Role, Trace
from simulator.replay import add_costs, default_prices
from tests.support.report_helpers import Toy, trace_a, trace_b
from traces.builder import Hasher, RecordedUsage, SessionBuilder

_SCHEMA = {
    "trace": pl.String,
    "session_index": pl.Int32,
    "request": pl.Int32,
    "call": pl.Int32,
    "kind": pl.String,
    "ts_ms": pl.Int64,
    "tokens": pl.Int64,
    "policy": pl.String,
    "params_hash": pl.String,
    "cost_total": pl.Float64,
}


def _rows(trace: str, policy: str, sessions: int, requests: int, big: bool = False) -> pl.DataFrame:
    """One policy's rows of one trace, in the engine's order (session, request, call)."""
    keys = [(s, r, c) for s in range(sessions) for r in range(requests) for c in range(1 + r % 2)]
    n = len(keys)
    return pl.DataFrame(
        {
            "trace": [trace] * n,
            "session_index": [k[0] for k in keys],
            "request": [k[1] for k in keys],
            "call": [k[2] for k in keys],
            "kind": ["compaction" if k[2] else "request" for k in keys],
            "ts_ms": [1_700_000_000_000 + i for i in range(n)],
            "tokens": [(2**40 if big else 1_000) + i for i in range(n)],
            "policy": [policy] * n,
            "params_hash": ["0123456789ab"] * n,
            "cost_total": [0.1 * i + 1e-9 * len(trace) for i in range(n)],
        },
        schema=_SCHEMA,
    )


def _sorted(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """What request_rows gave before issue 16: concatenate, then sort by the total key."""
    return as_written(pl.concat(frames, how="vertical").sort(list(REQUEST_ORDER)))


def test_traces_given_out_of_name_order_come_out_in_name_order_in_one_chunk() -> None:
    b, a = _rows("b", "p", 2, 3), _rows("a", "p", 1, 2)
    out = request_rows([b, a])
    # a: session 0, requests 0 (1 call) and 1 (2 calls); then b's 2 x (1 + 2 + 1) rows.
    assert out["trace"].to_list() == ["a"] * 3 + ["b"] * 8
    assert out["call"].to_list()[:3] == [0, 0, 1]
    assert all(s.n_chunks() == 1 for s in out.get_columns())
    assert out.equals(_sorted([b, a]))


def test_two_policies_interleave_call_by_call() -> None:
    p, q = _rows("t", "p", 1, 2), _rows("t", "q", 1, 2)
    out = request_rows([q, p])
    assert out.select("request", "call", "policy").rows() == [
        (0, 0, "p"),
        (0, 0, "q"),
        (1, 0, "p"),
        (1, 0, "q"),
        (1, 1, "p"),
        (1, 1, "q"),
    ]
    assert out.equals(_sorted([q, p]))


def test_compact_keeps_every_value_and_narrows_only_what_fits() -> None:
    small, big = _rows("t", "p", 1, 3), _rows("t", "p", 1, 3, big=True)
    assert compact(small).schema["tokens"] == pl.Int32
    assert compact(big).schema["tokens"] == pl.Int64  # 2**40 does not fit in 32 bits
    assert compact(small).schema["ts_ms"] == pl.Int64  # epoch milliseconds never fit
    assert compact(small).schema["trace"] == pl.Categorical
    for frame in (small, big):
        back = restored(compact(frame), frame.schema)
        assert back.schema == frame.schema and back.equals(frame)


def test_row_parts_hand_over_their_frames_once() -> None:
    parts = RowParts()
    frame = _rows("t", "p", 1, 2)
    parts.add(frame)
    assert len(parts) == 1
    (taken,) = parts.take()
    assert taken.equals(frame) and taken.schema == frame.schema
    assert len(parts) == 0 and parts.take() == []


def _chunked(frame: pl.DataFrame, cuts: list[int]) -> list[pl.DataFrame]:
    bounds = sorted({0, frame.height, *(c % (frame.height + 1) for c in cuts)})
    return [frame.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)]


@settings(max_examples=40, deadline=None)
@given(
    traces=st.lists(
        st.sampled_from(["a", "b", "c", "é", "B"]), min_size=1, max_size=4, unique=True
    ),
    policies=st.lists(st.sampled_from(["p", "q", "r"]), min_size=1, max_size=3, unique=True),
    sessions=st.integers(1, 3),
    requests=st.integers(1, 4),
    cuts=st.lists(st.integers(0, 200), max_size=4),
    shuffle=st.randoms(use_true_random=False),
    big=st.booleans(),
)
def test_the_frame_is_the_sorted_concatenation_however_the_rows_arrive(
    traces: list[str],
    policies: list[str],
    sessions: int,
    requests: int,
    cuts: list[int],
    shuffle: object,
    big: bool,
) -> None:
    frames = [_rows(t, p, sessions, requests, big) for t in traces for p in policies]
    pieces = [piece for f in frames for piece in _chunked(f, cuts)]
    shuffle.shuffle(pieces)  # type: ignore[attr-defined]
    expected = _sorted(pieces)
    parts = RowParts()
    for piece in pieces:
        parts.add(piece)
    for out in (request_rows(pieces), request_rows(parts)):
        assert out.schema == expected.schema
        assert out.equals(expected)
        assert all(s.n_chunks() == 1 for s in out.get_columns())
        assert parquet_bytes(out) == parquet_bytes(expected)
    # Float sums by group are the same bits (polars sums a chunked column chunk by chunk).
    keys = ["trace", "session_index", "policy"]
    sums = pl.col("cost_total").sum()
    got = request_rows(pieces).group_by(keys).agg(sums).sort(keys)
    assert got.equals(expected.group_by(keys).agg(sums).sort(keys))


def test_a_null_key_or_unequal_schemas_take_the_plain_sort() -> None:
    frame = _rows("t", "p", 1, 3)
    holed = frame.with_columns(
        pl.when(pl.col("request") == 1).then(None).otherwise(pl.col("request")).alias("request")
    )
    assert request_rows([holed]).equals(_sorted([holed]))  # nulls first, as polars sorts
    with pytest.raises(pl.exceptions.SchemaError):
        request_rows([frame, frame.with_columns(pl.col("tokens").cast(pl.Float64))])


def test_a_run_writes_what_concatenating_and_sorting_wrote() -> None:
    traces = [("b", trace_b()), ("a", trace_a())]
    policies = [registry.build("as-recorded"), Toy()]
    outputs = service.run(traces, policies)
    frames = [service.rows([t], p, edits=[]) for p in policies for t in traces]
    assert outputs.requests.equals(_sorted(frames))
    again = build_run(
        frames,
        [p.spec() for p in policies],
        traces,
        seed=0,
        cache="auto",
        prices_version=default_prices().version,
        lenient=False,
    )
    for name in ("requests.parquet", "sessions.parquet"):
        assert outputs.files[name] == again.files[name]


def _used(name: str, models: list[str]) -> Trace:
    """A trace of one session per model, each with two requests that logged usage."""
    sessions = []
    for i, model in enumerate(models):
        b = SessionBuilder(Hasher(name.encode()), id=f"s{i}", kind="main", client="claude-code")
        b.prefix_tokens = 1_000
        b.add_block(
            msg=0, kind=Kind.TEXT, role=Role.USER, text="x" * 40, ts=0, first_request=0, tokens=10
        )
        b.add_request(ts=0, model=model, usage=RecordedUsage(1_000 * (i + 1), 7, 3, 0, 11))
        b.add_request(ts=1, model=model, usage=RecordedUsage(333, 10**6, 0, 5, 1))
        sessions.append(b.finish())
    return Trace("claude-code", name, sessions)


def test_recorded_dollars_are_those_of_pricing_every_row_at_once() -> None:
    sonnet, haiku = "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"
    traces = [("b", _used("b", [sonnet, haiku])), ("a", _used("a", ["no-such-model", sonnet]))]
    priced = recorded_priced(traces)
    assert priced is not None
    everything = add_costs(recorded(traces), default_prices())
    assert priced.columns == ["trace", "session_index", "cost_total"]
    assert priced.equals(everything.select(priced.columns))
    assert priced["cost_total"].null_count() == 2  # the unknown model's requests
    assert priced["cost_total"].sum() == everything["cost_total"].sum()
    # Sonnet 4.5 ($3 in, $0.30 cache read, $3.75 5m write, $6 1h write, $15 out per MTok).
    first = 1_000 * 3 + 7 * 0.3 + 3 * 3.75 + 11 * 15
    assert priced["cost_total"][0] == pytest.approx(first / 1e6, rel=1e-12)
    assert recorded_priced([("t", trace_a())]) is None  # nothing logged usage
