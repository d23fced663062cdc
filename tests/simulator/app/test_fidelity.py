"""Fidelity: the cost model against recorded usage, on a tiny trace built by hand.

The trace (tests/support/tiny.py): one Sonnet 4.5 session (cache minimum 1,024 tokens),
three requests one minute apart (well inside the 5-minute TTL), each adding blocks to the
context:

    request 0 at t=0:    prefix 5,000 + A 1,000                        context 6,000
    request 1 at t=60s:  + B 200 (response to 0) + C 800              context 7,000
    request 2 at t=120s: + D 300 (response to 1) + E 500              context 7,800

Anthropic's rules with breakpoints at the end of the system prompt and on the last block,
nothing cached before the session: request 0 writes everything (5,000 for the system
marker, then 1,000 more for the message marker); request 1 reads the 6,000 written by
request 0 (its last breakpoint looks back 3 blocks and finds A's entry) and writes the
1,000 new tokens; request 2 reads 7,000 and writes 800. No token is left uncached.

Rates (genai-prices 0.2.3, $/MTok, as in tests/reports/test_trace_stats.py): input 3, read 0.30,
write 5m 3.75, output 15.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from simulator import policy as registry
from simulator.app.cli import main
from simulator.app.fidelity import compare, summarize, worst
from simulator.app.fidelity_report import render
from simulator.model import Trace
from simulator.replay import replay
from tests.support.tiny import EXACT, tiny_trace
from traces import compiled

READ, WRITE_5M, OUTPUT = 0.30e-6, 3.75e-6, 15e-6


def _compare(trace: Trace) -> pl.DataFrame:
    named = [("tiny", trace)]
    return compare(replay(named, registry.build("as-recorded")), named)


def _cost(u: tuple[int, int, int, int, int]) -> float:
    return u[1] * READ + u[2] * WRITE_5M + u[4] * OUTPUT


def test_exact_usage_is_reproduced_exactly() -> None:
    per_request = _compare(tiny_trace())
    assert per_request.height == 3
    assert per_request["recorded_context"].to_list() == [6_000, 7_000, 7_800]
    assert per_request["sim_context"].to_list() == [6_000, 7_000, 7_800]
    for i, c in enumerate(["uncached_input", "cache_read", "cache_write_5m", "cache_write_1h"]):
        assert per_request[f"sim_{c}"].to_list() == [u[i] for u in EXACT]
        assert per_request[f"err_{c}"].to_list() == [0, 0, 0]
        assert per_request[f"err_{c}_share"].to_list() == [0.0, 0.0, 0.0]
    assert per_request["matched"].to_list() == [True, True, True]
    assert per_request["rec_cost"].to_list() == pytest.approx([_cost(u) for u in EXACT])
    assert per_request["err_cost"].to_list() == [0.0, 0.0, 0.0]

    sessions, overall = summarize(per_request)
    row = sessions.row(0, named=True)
    assert (row["requests"], row["matched"], row["matched_share"]) == (3, 3, 1.0)
    assert row["rec_cost"] == pytest.approx(0.0255 + 0.01005 + 0.0066)
    assert row["err_cost"] == 0.0 and row["err_cost_share"] == 0.0
    assert overall["matched_share"] == 1.0
    assert overall["corpus_cost_error"] == 0.0
    assert overall["median_abs_session_cost_error"] == 0.0
    assert overall["sessions_within_tolerance"] == 1


def test_a_mismatch_is_reported_with_its_size() -> None:
    """Request 2 recorded as if A's entry had expired: it read only the 5,000-token system
    prefix and wrote 2,800. The simulator (one minute later, entry alive) reads 7,000."""
    usage = [*EXACT[:2], (0, 5_000, 2_800, 0, 100)]
    per_request = _compare(tiny_trace(usage))
    last = per_request.row(2, named=True)
    assert (last["err_cache_read"], last["err_cache_write_5m"], last["err_cache_write"]) == (
        2_000,
        -2_000,
        -2_000,
    )
    assert last["err_cache_read_share"] == pytest.approx(2_000 / 7_800)
    assert last["matched"] is False
    assert last["err_cost"] == pytest.approx(2_000 * READ - 2_000 * WRITE_5M)
    assert per_request["matched"].to_list() == [True, True, False]

    sessions, overall = summarize(per_request)
    row = sessions.row(0, named=True)
    rec = sum(_cost(u) for u in usage)
    assert row["matched"] == 2 and row["matched_share"] == pytest.approx(2 / 3)
    assert row["err_cost"] == pytest.approx(-0.0069)
    assert row["err_cost_share"] == pytest.approx(-0.0069 / rec)
    assert overall["corpus_cost_error"] == pytest.approx(-0.0069 / rec)
    assert overall["sessions_within_tolerance"] == 0
    text = render(sessions, overall)
    assert "+2,000" in text and "-2,000" in text  # the session's read and write token error
    rec_read = sum(u[1] for u in usage)
    rec_write = sum(u[2] + u[3] for u in usage)
    read, write = f"{2_000 / rec_read:+.2%}", f"{-2_000 / rec_write:+.2%}"
    assert f"cache read +2,000 ({read}), cache write -2,000 ({write})" in text


def test_match_tolerance_is_one_percent_of_recorded_context() -> None:
    """Off by 78 tokens of 7,800 (exactly 1%) matches; off by 79 does not."""
    at = _compare(tiny_trace([*EXACT[:2], (0, 6_922, 878, 0, 100)]))
    over = _compare(tiny_trace([*EXACT[:2], (0, 6_921, 879, 0, 100)]))
    assert at["err_cache_read"][2] == 78 and at["matched"][2]
    assert over["err_cache_read"][2] == 79 and not over["matched"][2]


def test_worst_orders_by_absolute_dollars() -> None:
    good = tiny_trace(sid="good")
    bad = tiny_trace([*EXACT[:2], (0, 5_000, 2_800, 0, 100)], sid="bad")
    named = [("a-good", good), ("b-bad", bad)]
    per_request = compare(replay(named, registry.build("as-recorded")), named)
    sessions, overall = summarize(per_request)
    assert sessions["session"].to_list() == ["good", "bad"]
    assert worst(sessions, 1)["session"].to_list() == ["bad"]
    assert overall["median_abs_session_cost_error"] == pytest.approx(
        abs(sessions["err_cost_share"][1]) / 2
    )


def test_requests_without_usage_are_not_compared() -> None:
    trace = tiny_trace()
    trace.sessions[0].requests.data["has_usage"][1] = False
    per_request = _compare(trace)
    assert per_request["request"].to_list() == [0, 2]


def test_compare_refuses_a_frame_of_several_policies() -> None:
    named = [("tiny", tiny_trace())]
    frame = replay(named, registry.build("as-recorded"))
    both = pl.concat([frame, frame.with_columns(pl.lit("x").alias("params_hash"))])
    with pytest.raises(ValueError, match="more than one policy"):
        compare(both, named)


def test_cli_fidelity_prints_and_writes(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    compiled.write(tiny_trace(), tmp_path / "in" / "tiny.ctxt")
    bad = tiny_trace([*EXACT[:2], (0, 5_000, 2_800, 0, 100)], sid="s-bad")
    compiled.write(bad, tmp_path / "in" / "bad.ctxt")
    result = CliRunner().invoke(
        main, ["fidelity", str(tmp_path / "in"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "requests compared: 6 in 2 session(s)" in out
    assert "matched (read and writes within 1% of context): 83.3%" in out
    assert "worst 2 session(s)" in out
    worst_part = out.split("worst 2 session(s)")[1]
    assert worst_part.index("s-bad") < worst_part.index("s-main")
    per_request = pl.read_parquet(tmp_path / "o" / "fidelity.parquet")
    sessions = pl.read_parquet(tmp_path / "o" / "fidelity_sessions.parquet")
    assert per_request.height == 6 and sessions.height == 2
    assert per_request.schema["ts"] == pl.Datetime("ms", "UTC") and "ts_ms" not in per_request
    assert sessions["trace"].to_list() == ["bad", "tiny"]
    assert sessions["matched"].to_list() == [2, 3]


def test_a_request_that_cached_only_part_of_the_prefix_had_no_message_marker() -> None:
    """Request 0 recorded as the first requests of 2.1.1xx sessions are: the 2,000 tokens
    through the system marker written, the other 4,000 (the rest of the 5,000 prefix and A)
    uncached. Request 1 reads back to that marker (2,000: the prefix's `system` mark, and a
    reset there) and writes the other 5,000; request 2 is as in the exact trace. Marked at
    the prefix's end, request 0 would write 5,000 and leave only A's 1,000 uncached."""
    usage = [(4_000, 0, 2_000, 0, 200), (0, 2_000, 5_000, 0, 300), (0, 7_000, 800, 0, 100)]
    per_request = _compare(tiny_trace(usage))
    assert per_request["sim_uncached_input"].to_list() == [4_000, 0, 0]
    assert per_request["sim_cache_read"].to_list() == [0, 2_000, 7_000]
    assert per_request["sim_cache_write_5m"].to_list() == [2_000, 5_000, 800]
    assert per_request["matched"].to_list() == [True, True, True]
