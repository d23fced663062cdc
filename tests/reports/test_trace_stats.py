"""Per-session trace statistics on a hand-built trace, with hand-computed dollars.

Rates (genai-prices 0.2.3, $/MTok): claude-sonnet-4-5 input 3, read 0.30, write 5m 3.75,
write 1h 6, output 15, and 6 / 0.60 / 7.50 / 12 / 22.50 above 200,000 total input tokens;
claude-haiku-4-5 input 1, read 0.10, write 5m 1.25, write 1h 2, output 5.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from reports.trace_stats import render_table, session_stats, to_json
from simulator.model import CompactionEvent, Session, Trace, request_columns
from simulator.pricing import SYNTHETIC, PriceBook, UnknownModelError

SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-4-5-20251001"


Row = tuple[int, int, bool, int, int, int, int, int]


def requests(rows: list[Row]) -> dict[str, npt.NDArray[Any]]:
    """(ts, model, has_usage, input, cache_read, write_5m, write_1h, output) per request."""
    names = ["ts", "model", "has_usage", "input", "cache_read", "cache_write_5m"]
    names += ["cache_write_1h", "output"]
    cols = {n: np.array([r[i] for r in rows]) for i, n in enumerate(names)}
    if not rows:
        cols = {n: np.zeros(0, dtype=np.int64) for n in names}
    cols["output_recorded"] = cols["output"].copy()
    return cols


def session(sid: str, kind: str, parent: int, models: list[str], rows: list[Row]) -> Session:
    return Session(
        id=sid,
        kind=kind,
        parent=parent,
        client="claude-code 2.1.31",
        prefix_tokens=0,
        tools=[],
        models=models,
        requests=request_columns(requests(rows)),
    )


def event(request: int) -> CompactionEvent:
    return CompactionEvent(request=request, trigger="auto", pre_tokens=-1, summary_block=-1, ts=0)


@pytest.fixture
def traces() -> list[tuple[str, Trace]]:
    main = session(
        "main-0001",
        "main",
        -1,
        [SONNET, SYNTHETIC],
        [
            (1_000_000, 0, True, 1_000, 2_000, 300, 400, 50),  # $0.007875
            (1_060_500, 1, False, 0, 0, 0, 0, 0),  # <synthetic>, no usage
            (1_125_000, 0, True, 20_001, 150_000, 20_000, 10_000, 1_000),  # long tier $0.502506
            (1_300_000, 0, False, 0, 0, 0, 0, 777),  # no usage: output is an estimate
        ],
    )
    main.events = [event(2), event(3)]
    sub = session(
        "agent-abc", "subagent", 0, [HAIKU], [(1_100_000, 0, True, 10, 5_000, 0, 2_000, 100)]
    )
    empty = session("agent-empty", "subagent", 0, [], [])
    one = Trace(format="claude-code", source_digest="d1", sessions=[main, sub, empty])
    one.skipped = {"invalid-json": 1}
    codex = session("rollout-1", "main", -1, ["gpt-4.5-turbo"], [(5, 0, True, 10, 0, 0, 0, 10)])
    two = Trace(format="codex", source_digest="d2", sessions=[codex])
    two.skipped = {"invalid-json": 3, "unknown-type": 2}
    return [("claude/some/long/path/main-0001.jsonl", one), ("codex/rollout-1.jsonl", two)]


def test_session_rows(traces: list[tuple[str, Trace]]) -> None:
    df = session_stats(traces, PriceBook())
    assert df.height == 4
    main, sub, empty, codex = df.to_dicts()

    assert main["trace"] == "claude/some/long/path/main-0001.jsonl"
    assert (main["session"], main["kind"], main["parent"]) == ("main-0001", "main", None)
    assert (main["format"], main["client"]) == ("claude-code", "claude-code 2.1.31")
    assert main["models"] == f"{SONNET},{SYNTHETIC}"
    assert (main["requests"], main["requests_with_usage"]) == (4, 2)
    assert main["duration_s"] == 300.0
    assert (main["input"], main["cache_read"]) == (21_001, 152_000)
    assert (main["cache_write_5m"], main["cache_write_1h"], main["output"]) == (
        20_300,
        10_400,
        1_050,
    )
    # 1,000*3 + 20,001*6 ; 2,000*0.3 + 150,000*0.6 ; 300*3.75 + 20,000*7.5 ; 400*6 + 10,000*12 ;
    # 50*15 + 1,000*22.5   (all / 1e6)
    assert main["cost_uncached_input"] == pytest.approx(0.123006)
    assert main["cost_cache_read"] == pytest.approx(0.0906)
    assert main["cost_cache_write_5m"] == pytest.approx(0.151125)
    assert main["cost_cache_write_1h"] == pytest.approx(0.1224)
    assert main["cost_output"] == pytest.approx(0.02325)
    assert main["cost_total"] == pytest.approx(0.007875 + 0.502506)
    assert main["unpriced_models"] is None
    assert (main["compactions"], main["skipped"]) == (2, 1)

    assert (sub["parent"], sub["kind"], sub["duration_s"]) == ("main-0001", "subagent", 0.0)
    # 10*1 + 5,000*0.1 + 2,000*2 (1-hour write at its own rate) + 100*5 = 5,010 / 1e6
    assert sub["cost_cache_write_1h"] == pytest.approx(0.004)
    assert sub["cost_total"] == pytest.approx(0.00501)

    assert (empty["requests"], empty["duration_s"], empty["cost_total"]) == (0, None, 0.0)
    assert empty["models"] == ""

    assert codex["unpriced_models"] == "gpt-4.5-turbo"
    assert codex["cost_total"] is None and codex["cost_output"] is None
    assert (codex["format"], codex["skipped"], codex["input"]) == ("codex", 5, 10)


def test_strict_raises_on_unknown_model(traces: list[tuple[str, Trace]]) -> None:
    with pytest.raises(UnknownModelError, match=r"gpt-4\.5-turbo"):
        session_stats(traces, PriceBook(), strict=True)


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_render_table(traces: list[tuple[str, Trace]]) -> None:
    projects = {"claude/some/long/path/main-0001.jsonl": "ctxsim", "codex/rollout-1.jsonl": "web"}
    text = render_table(session_stats(traces, PriceBook()), projects=projects, width=400)
    lines = _lines(text)
    assert lines[0].split()[:4] == ["project", "start", "session", "trace"]
    assert set(lines[1]) == {"─"}
    main, sub = lines[2], lines[3]
    # project and start (the first request, UTC) name the trace once; its sessions follow
    assert main.startswith("ctxsim") and "1970-01-01 00:16" in main
    assert sub.startswith(" ") and "agent-abc" in sub and "1970" not in sub
    assert lines[5].startswith("web")
    total = lines[-2]
    assert total.startswith("TOTAL") and "4 sessions" in total
    assert "152,000" in text and "21,021" in total  # thousands separators; 21,001+10+10
    assert "0.5104" in text  # the main session's dollars, 4 decimals below $1
    assert "0.5154*" in total  # priced sessions only, flagged
    assert total.endswith(" 6")  # skipped counted once per trace: 1 + 5
    assert "0:05:00" in text  # duration of the main session
    assert "sonnet-4-5" in main and "claude-" not in main  # short names (display)
    assert SYNTHETIC not in text
    assert lines[-1].startswith("* dollars exclude 1 session(s)") and "gpt-4.5-turbo" in lines[-1]
    header = lines[0].split()
    # input and output dollars: $0.123006 and $0.02325 for the main session (hand-computed
    # in test_session_rows), each with the column's decimals
    cells = main.split()
    assert "$" in header and "0.1230" in cells and "0.0233" in cells


def test_render_table_fits_narrow_terminals(traces: list[tuple[str, Trace]]) -> None:
    """At 80 columns the table keeps project, start, session, requests and total dollars,
    leaves out what does not fit, and says what it left out."""
    df = session_stats(traces, PriceBook())
    for width in (80, 120, 200):
        lines = _lines(render_table(df, projects={}, width=width))
        assert max(len(line) for line in lines) <= width, width
        assert lines[0].split()[:3] == ["project", "start", "session"]
        assert "$ total" in lines[0]
    narrow = " ".join(_lines(render_table(df, projects={}, width=80)))
    assert "column(s) left out at this width (trace" in narrow
    wide = render_table(df, projects={}, width=400)
    assert "left out" not in wide


def test_to_json_states_the_skipped_count_once(traces: list[tuple[str, Trace]]) -> None:
    df = session_stats(traces, PriceBook())
    document = json.loads(to_json(df))
    rows = document["sessions"]
    assert len(rows) == 4 and set(rows[0]) == set(df.columns) - {"skipped"}
    assert document["skipped_lines"] == 6  # 1 + 5, once per trace, not 1 + 1 + 1 + 5
    assert json.loads(to_json(df, skipped=349))["skipped_lines"] == 349
    assert rows[0]["parent"] is None and rows[1]["parent"] == "main-0001"
    assert rows[0]["start"] == "1970-01-01T00:16:40.000Z"  # ts 1,000,000 ms
    assert rows[2]["start"] is None  # no request
    assert rows[3]["cost_total"] is None


def test_no_traces() -> None:
    df = session_stats([], PriceBook())
    assert df.height == 0 and "cost_total" in df.columns
    assert "TOTAL" in render_table(df)
    assert json.loads(to_json(df)) == {"sessions": [], "skipped_lines": 0}


def test_recorded_compaction_call_and_logged_output_are_counted() -> None:
    """An acompact call attached to its event counts once in the tokens and dollars, priced
    on the model of the request before it; the logged output is shown beside the priced one."""
    s = session(
        "main-0002",
        "main",
        -1,
        [HAIKU, SONNET],
        [
            (1_000, 0, True, 10, 0, 1_000, 0, 500),  # haiku: 10 + 1,250 + 2,500 = $0.00376
            (2_000, 1, True, 20, 1_000, 100, 0, 1_000),  # sonnet
            (3_000, 0, True, 30, 2_000, 0, 0, 100),  # haiku: after the compaction
        ],
    )
    s.requests.data["output_recorded"] = np.array([500, 40, 100])  # request 1: a snapshot
    s.events = [
        CompactionEvent(2, "auto", 1_120, -1, 2_500, call_usage=(900, 30_000, 1_000, 0, 2_000))
    ]
    (row,) = session_stats([("t", Trace("claude-code", "d", [s]))], PriceBook()).to_dicts()
    assert (row["requests"], row["compactions"], row["compaction_calls"]) == (3, 1, 1)
    assert (row["input"], row["cache_read"], row["cache_write_5m"]) == (960, 33_000, 2_100)
    assert (row["output"], row["output_recorded"]) == (3_600, 2_640)
    # the call on sonnet (request 1's model): 900*3 + 30,000*0.3 + 1,000*3.75 + 2,000*15
    call = (2_700 + 9_000 + 3_750 + 30_000) / 1e6
    haiku = (10 * 1 + 1_000 * 1.25 + 500 * 5 + 30 * 1 + 2_000 * 0.1 + 100 * 5) / 1e6
    sonnet = (20 * 3 + 1_000 * 0.3 + 100 * 3.75 + 1_000 * 15) / 1e6
    assert row["cost_total"] == pytest.approx(call + haiku + sonnet)
    assert "out logged" in render_table(
        session_stats([("t", Trace("claude-code", "d", [s]))], PriceBook())
    )
