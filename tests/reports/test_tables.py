"""Terminal tables fit the terminal (reports/tables.py): every table-printing command at
COLUMNS=80 and 200, the run summary's figures per policy, and the layout rules by hand.

The run replays three compiled traces: the tiny trace of tests/support/tiny.py (recorded
usage: 13,000 cache read x $0.30 + 7,800 written x $3.75 + 600 output x $15 per MTok = $0.04215)
and tests/support/report_helpers.py's traces a and b (no recorded usage), under as-recorded, the
toy policy (which overflows: tests/reports/test_compare.py) and claude-code with
CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=60.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.tables import Column, fit, render, wrap
from simulator import policy as registry
from simulator.app.cli import main
from tests.support.report_helpers import Toy, trace_a, trace_b
from tests.support.tiny import tiny_trace
from traces import compiled

WIDTHS = (80, 200)
RUN = ["--policy", "as-recorded", "--policy", "toy", "--policy", "claude-code"]
RUN += ["-P", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=60", "--no-report"]


@pytest.fixture(autouse=True)
def _toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, Toy.name, Toy)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tables") / "in"
    folder.mkdir()
    compiled.write(tiny_trace(), folder / "tiny.ctxt")
    compiled.write(trace_a(), folder / "a.ctxt")
    compiled.write(trace_b(), folder / "b.ctxt")
    return folder


def ctxsim(width: int, *args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result


def _widest(result: Result) -> int:
    return max(len(line) for line in result.output.splitlines())


@pytest.mark.parametrize("width", WIDTHS)
def test_every_table_command_fits_the_width(corpus: Path, tmp_path: Path, width: int) -> None:
    runs = [tmp_path / "r1", tmp_path / "r2"]
    outputs = [
        ctxsim(width, "run", corpus, "--out", runs[0], *RUN),
        ctxsim(width, "run", corpus, "--out", runs[1], "--policy", "as-recorded", "--no-report"),
        ctxsim(width, "traces", "stats", corpus),
        ctxsim(width, "fidelity", corpus),
        ctxsim(width, "policies", "show", "claude-code"),
        ctxsim(width, "policies", "list"),
    ]
    compared = CliRunner().invoke(
        main, ["compare", str(runs[1]), str(runs[0])], env={"COLUMNS": str(width)}
    )
    assert compared.exit_code == 0, compared.output
    for result in [*outputs, compared]:
        assert _widest(result) <= width, result.output
    if width == 200:  # the wide terminal shows every column of the run and fidelity tables
        assert all("left out at this width" not in r.output for r in (outputs[0], outputs[3]))


def _summary_rows(result: Result) -> dict[str, list[str]]:
    lines = result.output.splitlines()
    assert set(lines[1]) == {"─"}
    header = lines[0]
    rows = {}
    for line in lines[2:]:
        if not line or line.split()[0] not in ("as-recorded", "toy", "claude-code"):
            break
        rows[line.split()[0]] = line.split()
    assert header.startswith("policy")
    return rows


def test_the_what_if_prints_dollars_events_and_losses_per_policy(
    corpus: Path, tmp_path: Path
) -> None:
    result = ctxsim(200, "run", corpus, "--out", tmp_path / "o", *RUN)
    header = result.output.splitlines()[0].split("  ")
    header = [h.strip() for h in header if h.strip()]
    assert header == [
        "policy",
        "params",
        "recorded $",
        "simulated $",
        "diff $",
        "diff %",
        "all sessions $",
        "compact",
        "overflow",
        "trips",
        "cache hit",
        "human kept",
        "summary",
        "stale refs",
    ]
    rows = _summary_rows(result)
    assert set(rows) == {"as-recorded", "toy", "claude-code"}
    # Only the tiny trace logged usage: recorded $, simulated $ and diff are each policy's
    # dollars on that trace against the recording's, so the row adds up; its dollars on
    # every trace are a column of their own.
    sessions = pl.read_parquet(tmp_path / "o" / "sessions.parquet")
    for policy, cells in rows.items():
        assert cells[2] == "0.0421"  # the recorded usage, the same for every policy
        mine = sessions.filter(pl.col("policy") == policy)
        tiny = mine.filter(pl.col("trace") == "tiny")["cost_total"].sum()
        assert float(cells[3]) == pytest.approx(tiny, abs=1e-4)
        assert cells[4][0] in "+-"
        assert float(cells[4]) == pytest.approx(tiny - 0.04215, abs=1e-4)
        assert float(cells[4]) == pytest.approx(float(cells[3]) - float(cells[2]), abs=2e-4)
        assert float(cells[6]) == pytest.approx(mine["cost_total"].sum(), abs=1e-4)
        assert float(cells[6]) > float(cells[3])  # the other traces cost something too
    assert rows["as-recorded"][4] == "+0.0000"  # it sends what was sent: the same dollars
    toy = rows["toy"]
    assert toy[7:10] == ["2", "4", "!"]  # two compaction calls; four overflows, marked
    assert rows["as-recorded"][7:9] == ["0", "0"]
    text = " ".join(result.output.split())
    assert "! overflowed: toy (4) request(s) larger than the model's context window" in text
    assert "recorded: $0.0421" in text
    sessions_n = sessions.filter(pl.col("policy") == "toy").height
    assert (
        f"recorded $ ($0.0421), simulated $ and diff cover the 1 of {sessions_n} replayed "
        "sessions (a subagent's its own) that logged usage of priced models; all sessions $: "
        "the policy's dollars over every session" in text
    )


def test_a_narrow_terminal_keeps_the_what_if_figures(corpus: Path, tmp_path: Path) -> None:
    result = ctxsim(80, "run", corpus, "--out", tmp_path / "o", *RUN)
    header = result.output.splitlines()[0].split()
    for kept in ("policy", "simulated", "diff", "compact", "overflow", "human", "summary"):
        assert kept in header
    text = " ".join(result.output.split())
    assert re.search(r"column\(s\) left out at this width \(params, recorded \$", text)


# -- layout rules, by hand -----------------------------------------------------------------


COLUMNS = [
    Column("name"),
    Column("meaning", wrap=True),
    Column("a", right=True, drop=2),
    Column("b", right=True, drop=1),
]
ROWS = [["x" * 10, "word " * 12, "1,234", "5,678"], ["y", "short", "1", "2"]]


def test_optional_columns_go_lowest_rank_first() -> None:
    # natural width: 10 + 2 + 59 + 2 + 5 + 2 + 5 = 85; with the meaning wrapped at 16
    # characters 10 + 2 + 16 + 2 + 5 + 2 + 5 = 42 fits 42 and keeps all four
    assert fit(COLUMNS, ROWS, 42) == [0, 1, 2, 3]
    assert fit(COLUMNS, ROWS, 41) == [0, 1, 2]  # b (rank 1) goes first
    assert fit(COLUMNS, ROWS, 34) == [0, 1]  # then a; name and meaning always stay


def test_render_wraps_text_right_aligns_numbers_and_names_what_it_left_out() -> None:
    text = render(COLUMNS, ROWS, width=41, notes=["a note " * 10])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 41
    assert lines[0].split() == ["name", "meaning", "a"]
    assert lines[2].startswith("xxxxxxxxxx  word word") and lines[2].endswith("1,234")
    assert set(lines[3].split()) == {"word"}  # the meaning wraps under itself
    assert any(line.endswith("    1") for line in lines)  # numbers right-aligned
    joined = " ".join(lines)
    assert "1 column(s) left out at this width (b)" in joined
    assert "a note a note" in joined
    with pytest.raises(ValueError, match="a row of 1 cells for 4 columns"):
        render(COLUMNS, [["x"]], width=80)


def test_cells_are_text_not_markup() -> None:
    text = render([Column("name")], [["[bold]x[/bold] :smile:"]], width=80)
    assert "[bold]x[/bold] :smile:" in text


def test_wrap_keeps_short_lines_and_indents_continuations() -> None:
    assert wrap(["short"], 40) == ["short"]
    wrapped = wrap(["word " * 20], 40)
    assert all(len(line) <= 40 for line in wrapped) and wrapped[1].startswith("  word")


_CELL = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n_columns=st.integers(1, 6),
    width=st.integers(40, 200),
)
def test_no_line_is_wider_than_asked(data: st.DataObject, n_columns: int, width: int) -> None:
    """Whatever the cells, columns and width: every line fits, always-shown columns stay."""
    columns = [
        Column(
            f"c{i}",
            right=data.draw(st.booleans()),
            wrap=data.draw(st.booleans()),
            drop=data.draw(st.none() | st.integers(0, 3)) if i else None,
        )
        for i in range(n_columns)
    ]
    rows = data.draw(st.lists(st.lists(_CELL, min_size=n_columns, max_size=n_columns), max_size=5))
    text = render(columns, rows, width=width, notes=[data.draw(_CELL)])
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert lines[0].split()[0] == "c0"


def test_a_wrapping_column_keeps_its_header_when_nothing_fits() -> None:
    """Only always-shown columns, too wide together: the widest cell is cut, not the one
    column that may wrap (which rich took to nothing, header and all)."""
    columns = [Column("c0", wrap=True), *(Column(f"c{i}") for i in range(1, 6))]
    text = render(columns, [["", "", "", "", "0000000", "0" * 18]], width=40)
    header, _, row = text.splitlines()[:3]
    assert header.split() == ["c0", "c1", "c2", "c3", "c4", "c5"]
    assert row.split() == ["0000000", "0" * 14 + "…"] and len(row) <= 40
