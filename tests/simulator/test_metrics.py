"""Every column of requests.parquet and sessions.parquet and every run-summary figure in
reports/METRICS.md, against numbers worked out by hand on two small sessions.

Session A (tests/support/report_helpers.py) replays under the toy policy: prefix 2,000; requests one
minute apart (so every cache entry is alive); the toy compacts before request 3 into a
300-token summary (its compaction call sends the view plus a 200-token prompt, uncached) and
fails a compaction before request 4, tripping its breaker; its window is 3,300.

  k  view                                    read   write  output
  0  P b0(100)                    = 2,100       0  2,100     50
  1  + b1(50) b2(1,000)           = 3,150   2,100  1,050     40
  2  + b3(40) b4(60)              = 3,250   3,150    100     30
  3c + b5(30) b6(20) + prompt 200 = 3,500  (uncached 3,500)  300
  3  P S(300)                     = 2,300   2,000    300     10
  4c + b7(10) b8(1,000) b9(25) + prompt = 3,535 (uncached)     0  breaker trip
  4  P S b7 b8 b9                 = 3,335   2,300  1,035      0  overflow (> 3,300)

Human blocks: b0 100, b4 60, b9 25. The agent edits a.py at k2 (its read b2 is still there)
and reads it again at k3, after the compaction removed b2: one stale reference.

Session B replays as-recorded: prefix 1,500; the recording's summary (150) and the context
it restored (80) replace the human's first message (200) and the agent's text (100) at k2,
where the human adds 50: the view is 1,500 + 150 + 80 + 50 = 1,780 (read 1,500, write 280).

Rates (genai-prices, $/MTok): input 3, cache read 0.30, 5-minute write 3.75, output 15.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest

from simulator import policy as registry
from simulator.frames import (
    LOSS_SCHEMA,
    SUMMARY_COLUMNS,
    bill_failed,
    overall_summary,
    policy_summary,
    request_rows,
    session_rows,
    versus_recorded,
    with_recorded,
)
from simulator.replay import replay
from tests.support import ROOT, SAMPLES
from tests.support.report_helpers import RATES, SONNET, T0, Toy, replayed, trace_a, trace_b

METRICS = ROOT / "reports" / "METRICS.md"
MIN = 60_000
START = datetime.fromtimestamp(T0 / 1000, UTC)

R, C, AC, ACF = "request", "compaction", "autocompact", "autocompact-failed"
# Per row: (request, call, kind, stage, context, uncached, read, write 5m, output, overflow,
# breaker trip), then (human, human verbatim, summary, stale refs, after compaction, re-sent).
TOY_A = [
    ((0, 0, R, "", 2100, 0, 0, 2100, 50, False, False), (100, 100, 0, 0, False, 0)),
    ((1, 0, R, "", 3150, 0, 2100, 1050, 40, False, False), (100, 100, 0, 0, False, 0)),
    ((2, 0, R, "", 3250, 0, 3150, 100, 30, False, False), (160, 160, 0, 0, False, 0)),
    ((3, 0, C, AC, 3500, 3500, 0, 0, 300, False, False), (160, 160, 200, 0, False, 0)),
    ((3, 1, R, "", 2300, 0, 2000, 300, 10, False, False), (160, 0, 300, 1, True, 300)),
    ((4, 0, C, ACF, 3535, 3535, 0, 0, 0, False, True), (185, 25, 500, 0, False, 0)),
    ((4, 1, R, "", 3335, 0, 2300, 1035, 0, True, False), (185, 25, 300, 0, False, 0)),
]
AS_RECORDED_B = [
    ((0, 0, R, "", 1700, 0, 0, 1700, 100, False, False), (200, 200, 0, 0, False, 0)),
    ((1, 0, R, "", 1800, 0, 1700, 100, 0, False, False), (200, 200, 0, 0, False, 0)),
    ((2, 0, R, "", 1780, 0, 1500, 280, 0, False, False), (250, 50, 230, 0, True, 280)),
]
FIELDS = (
    "request",
    "call",
    "kind",
    "stage",
    "context_tokens",
    "uncached_input",
    "cache_read",
    "cache_write_5m",
    "output",
    "overflow",
    "breaker_trip",
    "human_tokens",
    "human_verbatim_tokens",
    "summary_tokens",
    "stale_file_refs",
    "after_compaction",
    "resent_tokens",
)


def _expected_rows(
    table: list[tuple[tuple[Any, ...], tuple[Any, ...]]], trace: str, session: str, policy: str
) -> list[dict[str, Any]]:
    spec = registry.build("as-recorded").spec() if policy == "as-recorded" else Toy().spec()
    rows = []
    for engine, lost in table:
        row = dict(zip(FIELDS, [*engine, *lost], strict=True))
        row |= {
            "trace": trace,
            "session": session,
            "session_index": 0,
            "ts_ms": T0 + row["request"] * MIN,
            "model": SONNET,
            "cache_write_1h": 0,
            "threshold_tokens": None,  # neither policy states limits of its own
            "blocking_tokens": None,
            "edits": 0,  # nor edits its view without a call (tests/simulator/test_edits.py does)
            "edit_tokens": 0,
            "policy": policy,
            "params_hash": spec.param_hash,
            "cost_uncached_input": row["uncached_input"] * RATES["input"],
            "cost_cache_read": row["cache_read"] * RATES["read"],
            "cost_cache_write_5m": row["cache_write_5m"] * RATES["write_5m"],
            "cost_cache_write_1h": 0.0,
            "cost_output": row["output"] * RATES["output"],
        }
        row["cost_total"] = sum(v for k, v in row.items() if k.startswith("cost_"))
        rows.append(row)
    return rows


def _check(frame: pl.DataFrame, expected: list[dict[str, Any]]) -> None:
    assert set(frame.columns) == set(expected[0]), set(frame.columns) ^ set(expected[0])
    for got, want in zip(frame.iter_rows(named=True), expected, strict=True):
        exact = {k: v for k, v in want.items() if not k.startswith("cost_")}
        assert {k: got[k] for k in exact} == exact
        costs = {k: v for k, v in want.items() if k.startswith("cost_")}
        assert {k: got[k] for k in costs} == pytest.approx(costs)


@pytest.fixture(scope="module")
def toy_a() -> pl.DataFrame:
    return replayed([("a", trace_a())], Toy())


@pytest.fixture(scope="module")
def recorded_b() -> pl.DataFrame:
    return replayed([("b", trace_b())], registry.build("as-recorded"))


def test_request_rows_under_a_compacting_policy(toy_a: pl.DataFrame) -> None:
    _check(toy_a, _expected_rows(TOY_A, "a", "s-a", "toy"))


def test_request_rows_of_a_recorded_compaction(recorded_b: pl.DataFrame) -> None:
    _check(recorded_b, _expected_rows(AS_RECORDED_B, "b", "s-b", "as-recorded"))


def test_the_observer_changes_no_engine_column() -> None:
    """The loss pass only adds columns: the engine's rows are those of a plain replay."""
    for traces, policy in (
        ([("a", trace_a())], Toy()),
        ([("b", trace_b())], registry.build("as-recorded")),
    ):
        plain = replay(traces, policy)
        observed = replayed(traces, policy)
        assert observed.columns == [*plain.columns, *LOSS_SCHEMA]
        assert observed.select(plain.columns).equals(plain)


def _session_a() -> dict[str, Any]:
    read, write, uncached, output = 9_550, 4_585, 7_035, 430
    cost = {
        "cost_uncached_input": uncached * RATES["input"],
        "cost_cache_read": read * RATES["read"],
        "cost_cache_write_5m": write * RATES["write_5m"],
        "cost_cache_write_1h": 0.0,
        "cost_output": output * RATES["output"],
    }
    return {
        "trace": "a",
        "session_index": 0,
        "session": "s-a",
        "policy": "toy",
        "params_hash": Toy().spec().param_hash,
        "models": SONNET,
        "requests": 5,
        "calls": 7,
        "compactions": 2,
        "overflows": 1,
        "breaker_trips": 1,
        "edits": 0,
        "edit_tokens": 0,
        "input_tokens": 21_170,
        "uncached_input": uncached,
        "cache_read": read,
        "cache_write_5m": write,
        "cache_write_1h": 0,
        "output": output,
        "context_max": 3_535,
        "cache_hit_ratio": read / 21_170,
        "start": START,  # the first request's time, as a UTC timestamp
        "duration_s": 240.0,
        **cost,
        "cost_total": sum(cost.values()),
        "unpriced_calls": 0,
        # request rows: human 100+100+160+160+185, kept 100+100+160+0+25
        "human_verbatim_share": 385 / 705,
        # summary 300+300 over context 2,100+3,150+3,250+2,300+3,335
        "summary_share": 600 / 14_135,
        "stale_file_refs": 1,
        "post_compaction_requests": 1,
        "resent_tokens": 300,
    }


def _session_b() -> dict[str, Any]:
    read, write, output = 3_200, 2_080, 100
    cost = {
        "cost_uncached_input": 0.0,
        "cost_cache_read": read * RATES["read"],
        "cost_cache_write_5m": write * RATES["write_5m"],
        "cost_cache_write_1h": 0.0,
        "cost_output": output * RATES["output"],
    }
    return {
        "trace": "b",
        "session_index": 0,
        "session": "s-b",
        "policy": "as-recorded",
        "params_hash": registry.build("as-recorded").spec().param_hash,
        "models": SONNET,
        "requests": 3,
        "calls": 3,
        "compactions": 0,
        "overflows": 0,
        "breaker_trips": 0,
        "edits": 0,
        "edit_tokens": 0,
        "input_tokens": 5_280,
        "uncached_input": 0,
        "cache_read": read,
        "cache_write_5m": write,
        "cache_write_1h": 0,
        "output": output,
        "context_max": 1_800,
        "cache_hit_ratio": read / 5_280,
        "start": START,
        "duration_s": 120.0,
        **cost,
        "cost_total": sum(cost.values()),
        "unpriced_calls": 0,
        "human_verbatim_share": 450 / 650,
        "summary_share": 230 / 5_280,
        "stale_file_refs": 0,
        "post_compaction_requests": 1,
        "resent_tokens": 280,
    }


def _approx_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    exact = {k: v for k, v in want.items() if not isinstance(v, float)}
    assert {k: got[k] for k in exact} == exact
    floats = {k: v for k, v in want.items() if isinstance(v, float)}
    assert {k: got[k] for k in floats} == pytest.approx(floats)


def test_session_rows(toy_a: pl.DataFrame, recorded_b: pl.DataFrame) -> None:
    sessions = session_rows(pl.concat([toy_a, recorded_b]))
    expected = [_session_a(), _session_b()]
    assert sessions.columns == list(expected[0])
    for got, want in zip(sessions.iter_rows(named=True), expected, strict=True):
        _approx_equal(got, want)


SUMMARY_KEYS = (
    "requests",
    "calls",
    "compactions",
    "overflows",
    "breaker_trips",
    "edits",
    "edit_tokens",
)
SUMMARY_KEYS += ("input_tokens", "cost_total", "unpriced_calls", "cache_hit_ratio")
SUMMARY_KEYS += ("human_verbatim_share", "summary_share", "stale_file_refs")
SUMMARY_KEYS += ("post_compaction_requests", "resent_tokens")


def test_run_summaries(toy_a: pl.DataFrame, recorded_b: pl.DataFrame) -> None:
    """Per spec, a run summary is its session's figures here (one session each); over
    both specs the sums and ratios of sums."""
    rows = pl.concat([toy_a, recorded_b])
    summary = policy_summary(rows)
    assert summary.columns == ["policy", "params_hash", *SUMMARY_COLUMNS]
    assert set(SUMMARY_COLUMNS) == set(SUMMARY_KEYS)
    a, b = _session_a(), _session_b()
    by_policy = {r["policy"]: r for r in summary.iter_rows(named=True)}
    for want in (a, b):
        _approx_equal(by_policy[want["policy"]], {k: want[k] for k in SUMMARY_KEYS})
    overall = overall_summary(rows)
    counts = {k: a[k] + b[k] for k in SUMMARY_KEYS if isinstance(a[k], int)}
    _approx_equal(
        overall,
        counts
        | {
            "cost_total": a["cost_total"] + b["cost_total"],
            "cache_hit_ratio": (9_550 + 3_200) / (21_170 + 5_280),
            "human_verbatim_share": (385 + 450) / (705 + 650),
            "summary_share": (600 + 230) / (14_135 + 5_280),
        },
    )


def test_a_frame_without_loss_columns_has_null_loss_figures(toy_a: pl.DataFrame) -> None:
    """Runs made before the loss proxies existed still summarise (loss figures null)."""
    old = toy_a.drop(list(LOSS_SCHEMA))
    sessions = session_rows(old)
    assert sessions["human_verbatim_share"].to_list() == [None]
    assert overall_summary(old)["stale_file_refs"] is None
    assert policy_summary(old)["cost_total"].to_list() == pytest.approx(
        [_session_a()["cost_total"]]
    )


def _documented(section: str) -> set[str]:
    """Column names in the first column of a METRICS.md table under `## section`."""
    text = METRICS.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([a-z_0-9]+)`", first))
    return names


def test_every_documented_column_is_tested_and_every_column_documented(
    toy_a: pl.DataFrame,
) -> None:
    requests_tested = set(_expected_rows(TOY_A, "a", "s-a", "toy")[0])
    assert requests_tested == set(toy_a.columns)
    # requests.parquet holds the rows as written: `ts` for `ts_ms`, and `failed` (the
    # written columns are tested in tests/simulator/app/test_outputs_parquet.py)
    written = set(request_rows([bill_failed(toy_a)]).columns)
    assert written == requests_tested - {"ts_ms"} | {"ts", "failed"}
    assert _documented("requests.parquet") == written
    sessions_tested = set(_session_a())
    sessions = session_rows(toy_a)
    assert sessions_tested == set(sessions.columns)
    # `recorded_cost` joins the session rows in build_run (tested below)
    assert _documented("sessions.parquet") == sessions_tested | {"recorded_cost"}
    documented = _documented("Run summary")
    assert documented == set(SUMMARY_KEYS) | {
        "human_verbatim_share",
        "summary_share",
        "stale_file_refs",
        "post_compaction_requests",
        "resent_tokens",
    }


def test_the_loss_pass_lines_up_with_every_registered_policy() -> None:
    """Every registered policy's loss proxies on the samples stay within bounds."""
    from traces.load import load

    samples = SAMPLES
    traces = [(item.name, item.trace) for item in load([samples])]
    for name in registry.names():
        rows = replayed(traces, registry.build(name))
        assert rows.filter(pl.col("human_verbatim_tokens") > pl.col("human_tokens")).is_empty()
        assert rows.filter(pl.col("summary_tokens") > pl.col("context_tokens")).is_empty()
        if name == "as-recorded":  # the samples' recordings compact twice
            assert int(rows["after_compaction"].sum()) == 2


def test_session_rows_carry_the_recording_s_dollars_where_it_logged_usage() -> None:
    """`with_recorded` puts each session's recorded dollars after `cost_total`, null for a
    session that logged none; `versus_recorded` compares a spec's dollars over those only."""
    sessions = pl.DataFrame(
        {
            "trace": ["a", "b", "a", "b"],
            "session_index": pl.Series([0, 0, 0, 0], dtype=pl.Int32),
            "policy": ["p", "p", "q", "q"],
            "params_hash": ["h", "h", "k", "k"],
            "cost_total": [1.0, 5.0, 2.0, 7.0],
            "unpriced_calls": [0, 0, 0, 0],
        }
    )
    recorded = pl.DataFrame(
        {"trace": ["a"], "session_index": pl.Series([0], dtype=pl.Int32), "recorded_cost": [1.5]}
    )
    rows = with_recorded(sessions, recorded)
    assert rows.columns.index("recorded_cost") == rows.columns.index("cost_total") + 1
    assert rows["recorded_cost"].to_list() == [1.5, None, 1.5, None]
    versus = versus_recorded(rows).to_dicts()
    assert versus == [
        {
            "policy": "p",
            "params_hash": "h",
            "compared_cost": 1.0,
            "recorded_cost": 1.5,
            "compared_sessions": 1,
            "sessions": 2,
        },
        {
            "policy": "q",
            "params_hash": "k",
            "compared_cost": 2.0,
            "recorded_cost": 1.5,
            "compared_sessions": 1,
            "sessions": 2,
        },
    ]
