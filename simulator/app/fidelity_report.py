"""The fidelity report in the terminal: every session, the corpus figures, the worst ones.

Presentation of simulator/app/fidelity.py's figures (the core computes them; this module only
lays them out, with the shared table renderer of reports/tables.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from reports.tables import Column
from reports.tables import render as render_columns
from simulator.app.fidelity import INFERRED, MATCH_TOLERANCE, worst


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:+.{digits}f}%"


def _share(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4f}"


def _clip(name: str, width: int = 40) -> str:
    """Long names cut in the middle: the head tells sessions apart, the tail holds the
    trace's digest (the Parquet files keep the whole name)."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[-(width - 1 - head) :]


def _table(
    sessions: pl.DataFrame, labels: Mapping[str, tuple[str, str]] | None = None
) -> list[str]:
    """Sessions as a terminal table (reports/tables.py); `labels` (trace name -> project,
    start: simulator/app/cli.py) adds the columns a user finds a session by."""
    named = labels is not None
    columns = [
        *([Column("project"), Column("start")] if named else []),
        Column("trace", drop=None if not named else 1, wrap=True),
        Column("session", wrap=True),
        Column("reqs", right=True, drop=3),
        Column("matched", right=True),
        Column("read err tok", right=True, drop=2),
        Column("write err tok", right=True, drop=2),
        Column("recorded $", right=True),
        Column("simulated $", right=True),
        Column("error", right=True),
    ]
    rows = [
        [
            *(list(labels.get(str(r["trace"]), ("-", "-"))) if labels is not None else []),
            _clip(str(r["trace"])),
            _clip(str(r["session"])),
            f"{r['requests']:,}",
            _share(r["matched_share"]),
            f"{r['sim_cache_read'] - r['rec_cache_read']:+,}",
            f"{r['sim_cache_write'] - r['rec_cache_write']:+,}",
            _usd(r["rec_cost"]),
            _usd(r["sim_cost"]),
            _pct(r["err_cost_share"]),
        ]
        for r in sessions.iter_rows(named=True)
    ]
    return render_columns(columns, rows).splitlines()


_TOKEN_TOTALS = ("sim_cache_read", "rec_cache_read", "sim_cache_write", "rec_cache_write")


def render(
    sessions: pl.DataFrame,
    overall: dict[str, Any],
    n_worst: int = 5,
    labels: Mapping[str, tuple[str, str]] | None = None,
) -> str:
    """The terminal report: every session, the corpus figures, then the worst sessions."""
    out = [*_table(sessions, labels), ""] if sessions.height else []
    out.append(
        f"requests compared: {overall['requests']:,} in {overall['sessions']:,} session(s)"
        + _calls(overall["compaction_calls"])
        + "; "
        f"matched (read and writes within {MATCH_TOLERANCE:.0%} of context): "
        f"{_share(overall['matched_share'])}"
    )
    out.append(
        f"median |session cost error|: {_share(overall['median_abs_session_cost_error'], 2)}"
        f"; sessions within {MATCH_TOLERANCE:.0%}: {overall['sessions_within_tolerance']:,}"
    )
    out.append(
        f"whole-corpus cost error: {_pct(overall['corpus_cost_error'])} "
        f"(recorded ${overall['rec_cost']:,.4f}, simulated ${overall['sim_cost']:,.4f})"
    )
    if sessions.height:
        totals = {c: int(sessions[c].sum()) for c in _TOKEN_TOTALS}
        read = totals["sim_cache_read"] - totals["rec_cache_read"]
        write = totals["sim_cache_write"] - totals["rec_cache_write"]
        rec_read, rec_write = totals["rec_cache_read"], totals["rec_cache_write"]
        out.append(
            f"whole-corpus token error: cache read {read:+,} ({read / max(rec_read, 1):+.2%}), "
            f"cache write {write:+,} ({write / max(rec_write, 1):+.2%})"
        )
    if overall.get("inferred"):
        counts = overall["inferred"]
        out.append(
            "inferred context: "
            + "; ".join(f"{label} {counts.get(key, 0):,}" for key, label in INFERRED)
        )
    if overall.get("sessions_without_usage"):
        out.append(
            f"not compared: {overall['sessions_without_usage']:,} session(s) without recorded usage"
        )
    if overall["unpriced"]:
        out.append(f"* {overall['unpriced']:,} request(s) with unpriced models left out of dollars")
    if sessions.height:
        out.append("")
        out.append(
            f"worst {min(n_worst, sessions.height)} session(s) by |simulated $ - recorded $|:"
        )
        out.extend(_table(worst(sessions, n_worst), labels))
    return "\n".join(out) + "\n"


def _calls(n: int) -> str:
    """What of the requests compared were the recording's logged compaction calls."""
    return f" ({n:,} of them the recording's compaction calls)" if n else ""
