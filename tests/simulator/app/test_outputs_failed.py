"""A call above the model's window is a failed call (simulator/frames.py bill_failed): the
provider refuses it and bills nothing, so its billed tokens and dollars are 0, and every
summary flags the policy instead of letting it score cheap (reports/METRICS.md)."""

from __future__ import annotations

import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from simulator import policy as registry
from simulator import run as service
from simulator.frames import BILLED_COLUMNS, bill_failed, policy_summary
from simulator.replay import COST_COLUMNS
from tests.support.report_helpers import RATES, Toy, trace_a, trace_b

TRACES = [("a", trace_a()), ("b", trace_b())]


def _frame(rows: list[tuple[int, int, bool | None]]) -> pl.DataFrame:
    """Rows of (uncached input, output, overflow) with the columns bill_failed reads."""
    return pl.DataFrame(
        {
            "context_tokens": [u for u, _, _ in rows],
            "uncached_input": [u for u, _, _ in rows],
            "cache_read": [0] * len(rows),
            "cache_write_5m": [0] * len(rows),
            "cache_write_1h": [0] * len(rows),
            "output": [o for _, o, _ in rows],
            "overflow": [f for _, _, f in rows],
            "breaker_trip": [False] * len(rows),
            **{
                c: [u * RATES["input"] + o * RATES["output"] for u, o, _ in rows]
                for c in COST_COLUMNS
            },
            "resent_tokens": [u for u, _, _ in rows],
        },
        schema_overrides={
            "overflow": pl.Boolean,
            "breaker_trip": pl.Boolean,
            **{c: pl.Int64 for c in ("context_tokens", "resent_tokens")},
            **{c: pl.Int64 for c in ("uncached_input", "cache_read", "output")},
            **{c: pl.Int64 for c in ("cache_write_5m", "cache_write_1h")},
            **{c: pl.Float64 for c in COST_COLUMNS},
        },
    )


def test_a_failed_call_bills_nothing_and_keeps_what_it_tried_to_send() -> None:
    frame = _frame([(1_000, 10, False), (300_000, 20, True)])
    billed = bill_failed(frame)
    assert billed.columns.index("failed") == billed.columns.index("overflow") + 1
    ok, failed = billed.iter_rows(named=True)
    assert ok["failed"] is False and failed["failed"] is True
    assert ok["uncached_input"] == 1_000 and ok["cost_total"] == 1_000 * 3e-6 + 10 * 15e-6
    assert failed["context_tokens"] == 300_000  # what the policy tried to send
    assert all(failed[c] == 0 for c in BILLED_COLUMNS)
    assert bill_failed(billed).equals(billed)  # applied once however often it is called


def test_a_part_with_no_failed_call_gets_the_flag_alone_and_is_left_as_it_was() -> None:
    """Nearly every part: nothing failed (a null overflow is none), so only the flag is
    added, where a failed call's part has it, and the frame given is not changed."""
    frame = _frame([(1_000, 10, False), (2_000, 20, None)])
    billed = bill_failed(frame)
    assert "failed" not in frame.columns
    assert billed.columns == [*frame.columns[:7], "failed", *frame.columns[7:]]
    assert billed.schema["failed"] == pl.Boolean
    assert billed["failed"].to_list() == [False, False]
    assert billed.drop("failed").equals(frame)
    some = bill_failed(_frame([(1_000, 10, False), (300_000, 20, True)]))
    assert some.columns == billed.columns and some.schema == billed.schema


@given(st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**5), st.booleans() | st.none())))
def test_only_failed_rows_change(rows: list[tuple[int, int, bool | None]]) -> None:
    frame = _frame(rows)
    billed = bill_failed(frame)
    assert billed.height == frame.height
    kept = billed.filter(~pl.col("failed")).drop("failed")
    assert kept.equals(frame.filter(~pl.col("overflow").fill_null(False)))
    gone = billed.filter(pl.col("failed"))
    assert all(int(gone[c].abs().sum() or 0) == 0 for c in BILLED_COLUMNS)


def test_the_run_service_prices_the_toys_overflow_at_zero() -> None:
    """The toy overflows once, at request 4 of session a (tests/support/report_helpers.py): that row
    is failed and billed $0, every other row is priced as the engine priced it."""
    from simulator.loss import replay_with_loss
    from simulator.replay import ReplayOptions, default_prices

    engine = replay_with_loss(TRACES, Toy(), ReplayOptions(), default_prices())
    rows = service.rows(TRACES, Toy())
    failed = rows.filter(pl.col("failed"))
    assert failed.select("trace", "request", "kind").rows() == [("a", 4, "request")]
    assert failed["cost_total"].item() == 0.0 and failed["context_tokens"].item() == 3_335
    overflowed = engine.filter(pl.col("overflow"))["cost_total"].item()
    assert overflowed > 0
    assert rows["cost_total"].sum() == engine["cost_total"].sum() - overflowed
    summary = policy_summary(rows)
    assert summary["overflows"].to_list() == [1]  # the column a table flags on


def test_a_policy_that_does_not_overflow_is_unchanged() -> None:
    from simulator.loss import replay_with_loss
    from simulator.replay import ReplayOptions, default_prices

    policy = registry.build("as-recorded")
    engine = replay_with_loss(TRACES, policy, ReplayOptions(), default_prices())
    assert service.rows(TRACES, policy).drop("failed").equals(engine)
