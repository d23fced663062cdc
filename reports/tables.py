"""Terminal tables that fit the terminal: every table a `ctxsim` command prints goes
through `render` (rich lays the columns out; nothing is hand-padded).

The width is `COLUMNS` when set, else the terminal's when stdout is one; output piped to a
file or another program has no width limit (every column, no line wrapped), so that a
script reads the same text whatever terminal started it. A table wider than that first
loses its optional columns, least important first, and says which it left out (the JSON
and Parquet outputs keep them all); then rich wraps the text columns that may wrap and
shortens the others with an ellipsis. Notes printed under a table are wrapped to the same
width. Output is plain text (no colour, no markup read from cells), so it is the same on
every terminal.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

#: Width of "no limit" (stdout is not a terminal and COLUMNS is not set).
UNLIMITED = 100_000
#: Narrowest a wrapping column is planned at before optional columns are dropped.
WRAP_MIN = 16
#: Narrowest table drawn at all (a smaller COLUMNS is taken as this).
MIN_WIDTH = 40


@dataclass(frozen=True)
class Column:
    """A column: its header, alignment, whether its text may wrap onto more lines, and its
    `drop` rank: None for a column always shown, else the lower ranks go first when the
    table does not fit."""

    header: str
    right: bool = False
    wrap: bool = False
    drop: int | None = None


def terminal_width() -> int:
    """COLUMNS, else the terminal's width when stdout is a terminal, else UNLIMITED."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    if sys.stdout.isatty():
        return max(MIN_WIDTH, shutil.get_terminal_size((UNLIMITED, 24)).columns)
    return UNLIMITED


def _table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    title: str | None,
    squeeze: bool = False,
) -> Table:
    """The rich table; `squeeze`: it is wider than the width even with every optional
    column left out, so every column may fold. Rich narrows only the columns that may
    wrap, below their headers if it must: with one wrapping column among long unwrappable
    cells it took that column to nothing, header and all (a policy column of empty cells
    beside 18-digit ones at 40 characters: the hypothesis case of
    tests/reports/test_tables.py). Folding lets it narrow the widest first."""
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        title=title,
        title_justify="left",
        header_style="",
        title_style="",
        safe_box=True,
    )
    for col in columns:
        table.add_column(
            Text(col.header),
            justify="right" if col.right else "left",
            no_wrap=not (col.wrap or squeeze),
            overflow="fold" if col.wrap else "ellipsis",
            # Never narrower than the header: when even the always-shown columns are too wide,
            # the widest cells are cut, not the headers that say what a column is.
            min_width=len(col.header),
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _draw(table: Table, width: int) -> list[str]:
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        color_system=None,
        force_terminal=False,
        legacy_windows=False,
        emoji=False,
        highlight=False,
        markup=False,
    )
    console.print(table, crop=True)
    return [line.rstrip() for line in buf.getvalue().splitlines()]


def _natural_width(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> int:
    """How wide the table is drawn with no limit (wrapping columns at WRAP_MIN): a one-row
    table of each column's widest cell, so planning costs one small draw per try."""
    widest = []
    for i, col in enumerate(columns):
        cells = [row[i] for row in rows]
        longest = max(cells, key=len, default="")
        widest.append(longest[:WRAP_MIN] if col.wrap else longest)
    lines = _draw(_table(columns, [widest], None), UNLIMITED)
    return max((len(line) for line in lines), default=0)


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns kept at `width`: optional ones are left out, lowest rank
    first, until the rest fit."""
    return _fit(columns, rows, width)[0]


def _fit(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
) -> tuple[list[int], int]:
    """`fit`, and the natural width of the columns kept (above `width` where even the
    always-shown ones do not fit)."""
    kept = list(range(len(columns)))
    optional = sorted(
        (i for i, c in enumerate(columns) if c.drop is not None),
        key=lambda i: (columns[i].drop, -i),
    )
    while True:
        shown = [columns[i] for i in kept]
        body = [[row[i] for i in kept] for row in rows]
        natural = _natural_width(shown, body)
        if natural <= width or not optional:
            return kept, natural
        kept.remove(optional.pop(0))


def render(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    notes: Sequence[str] = (),
    width: int | None = None,
) -> str:
    """The table, then its notes, as lines no wider than `width` (default: the terminal)."""
    width = terminal_width() if width is None else max(MIN_WIDTH, width)
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row of {len(row)} cells for {len(columns)} columns")
    kept, natural = _fit(columns, rows, width)
    shown = [columns[i] for i in kept]
    body = [[row[i] for i in kept] for row in rows]
    lines = _draw(_table(shown, body, title, squeeze=natural > width), width)
    hidden = [c.header for i, c in enumerate(columns) if i not in kept]
    extra = list(notes)
    if hidden:
        extra.append(
            f"{len(hidden)} column(s) left out at this width ({', '.join(hidden)}); "
            "a wider terminal (COLUMNS) shows them"
        )
    lines += wrap(extra, width)
    return "\n".join(lines) + "\n"


def wrap(lines: Sequence[str], width: int | None = None) -> list[str]:
    """Each line wrapped to `width` (default: the terminal), continuation lines indented."""
    width = terminal_width() if width is None else max(MIN_WIDTH, width)
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        out += textwrap.wrap(
            line, width, subsequent_indent="  ", break_long_words=True, break_on_hyphens=False
        )
    return out


# -- the run summary ----------------------------------------------------------------------


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4f}"


def _signed_usd(value: float | None, base: float | None) -> str:
    if value is None or base is None:
        return "-"
    diff = value - base
    return f"{'+' if diff >= 0 else '-'}{abs(diff):,.4f}"


def _signed_share(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{100 * (value - base) / base:+.1f}%"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


#: The note under a table whose dollars, marked *, leave calls out (`ctxsim run`, `sweep`).
UNPRICED_NOTE = "* dollars leave out calls whose model has no price"

#: The mark of a policy that overflowed (a request larger than the model's window), in
#: every table that shows policies (`ctxsim run`, `ctxsim compare`).
OVERFLOW_MARK = "!"


def render_run_summary(outputs: Any, width: int | None = None) -> str:
    """Per policy spec: recorded and simulated dollars and their difference, compactions,
    overflows (marked), breaker trips, cache hit ratio and the loss proxies
    (reports/METRICS.md); a policy that overflowed is marked and named under the table.

    Where some sessions logged no usage (or use an unpriced model), recorded $, simulated $
    and diff are all taken over the sessions that did, so each row adds up, and the
    policy's dollars over every session get a column of their own."""
    from simulator.frames import policy_summary, versus_recorded

    summary = policy_summary(outputs.requests)
    recorded = outputs.recorded_cost
    versus = {
        (r["policy"], r["params_hash"]): r
        for r in versus_recorded(outputs.sessions).iter_rows(named=True)
    }
    partial = any(0 < v["compared_sessions"] < v["sessions"] for v in versus.values())
    columns = [
        Column("policy", wrap=True),
        Column("params", drop=1),
        Column("recorded $", right=True, drop=2),
        Column("simulated $", right=True),
        Column("diff $", right=True),
        Column("diff %", right=True, drop=4),
        *([Column("all sessions $", right=True, drop=2)] if partial else []),
        Column("compact", right=True),
        Column("overflow", right=True),
        Column("trips", right=True, drop=3),
        Column("cache hit", right=True, drop=5),
        Column("human kept", right=True, drop=7),
        Column("summary", right=True, drop=6),
        Column("stale refs", right=True, drop=6),
    ]
    rows = []
    overflowed = []
    unpriced = False
    for r in summary.iter_rows(named=True):
        cost = _usd(r["cost_total"])
        if r["unpriced_calls"]:
            cost += "*"
            unpriced = True
        overflows = _count(r["overflows"])
        if r["overflows"]:
            overflows += " " + OVERFLOW_MARK
            overflowed.append(f"{r['policy']} ({r['overflows']:,})")
        v = versus.get((r["policy"], r["params_hash"]))
        compared = v["compared_cost"] if v and v["compared_sessions"] else None
        base = v["recorded_cost"] if v and v["compared_sessions"] else None
        rows.append(
            [
                r["policy"],
                r["params_hash"],
                _usd(base),
                _usd(compared) if partial else cost,
                _signed_usd(compared, base),
                _signed_share(compared, base),
                *([cost] if partial else []),
                _count(r["compactions"]),
                overflows,
                _count(r["breaker_trips"]),
                _percent(r["cache_hit_ratio"]),
                _percent(r["human_verbatim_share"]),
                _percent(r["summary_share"]),
                _count(r["stale_file_refs"]),
            ]
        )
    notes = []
    if overflowed:
        notes.append(
            f"{OVERFLOW_MARK} overflowed: {', '.join(overflowed)} request(s) larger than the "
            "model's context window, which the API refuses; compare such a policy with care"
        )
    if unpriced:
        notes.append(UNPRICED_NOTE)
    if partial:
        counts = next(v for v in versus.values() if v["compared_sessions"])
        notes.append(
            f"recorded $ (${counts['recorded_cost']:,.4f}), simulated $ and diff cover the "
            f"{counts['compared_sessions']:,} of {counts['sessions']:,} replayed sessions "
            "(a subagent's its own) that logged usage of priced models; all sessions $: the "
            "policy's dollars over every session"
        )
    if recorded is not None:
        whole = " (every priced call)" if partial else ""
        notes.append(
            f"recorded: ${recorded:,.4f}{whole}, the usage the traces logged, priced the same "
            "way; diff: simulated - recorded"
        )
    notes.append(
        "compact: compaction calls; overflow: requests over the window; human kept: the "
        "human's words still verbatim; summary: compaction-written share of the context; "
        "stale refs: files used again after their read was dropped (reports/METRICS.md)"
    )
    return render(columns, rows, notes=notes, width=width)
