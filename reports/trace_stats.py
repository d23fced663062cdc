"""Per-session statistics of recorded traces: what was recorded, and what it cost.

This is the first thing a user looks at before simulating anything (`ctxsim traces stats`):
how big each session is, how it used the prompt cache, what the recording agent paid as
recorded, and whether the reader had to skip anything. One row per session (subagents and
compaction calls are their own sessions, linked to their parent by id).

Only requests with recorded usage count towards the token sums and dollars: a request without
usage has zero input-side columns. `output_recorded` is the output the recording logged;
`output` is what every price uses: the logged figure, or the tokenizer's count of the response
where the logged one is implausibly small (2.1.x logs a streaming snapshot; see
traces/builder.py). The sums also hold the session's recorded compaction calls
(`compaction_calls`: an acompact file's call, attached to its compaction event by
traces/claude_code.py), so that every recorded API call is counted once.

A session whose recorded requests use a model the price table cannot price gets
null dollars and names the model in `unpriced_models` (or raises, with ``strict=True``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl

from simulator.model import Session, Trace
from simulator.pricing import (
    COMPONENTS,
    SYNTHETIC,
    PriceBook,
    UnknownModelError,
    UnsupportedPricingError,
)

TOKEN_COLUMNS: tuple[str, ...] = (
    "input",
    "cache_read",
    "cache_write_5m",
    "cache_write_1h",
    "output",
    "output_recorded",
)
COST_COLUMNS: tuple[str, ...] = (*(f"cost_{c}" for c in COMPONENTS), "cost_total")

SCHEMA: dict[str, Any] = {
    "trace": pl.String,
    "session": pl.String,
    "kind": pl.String,
    "parent": pl.String,
    "client": pl.String,
    "format": pl.String,
    "models": pl.String,
    "start": pl.Datetime("ms", "UTC"),
    "requests": pl.Int64,
    "requests_with_usage": pl.Int64,
    "duration_s": pl.Float64,
    **{c: pl.Int64 for c in TOKEN_COLUMNS},
    **{c: pl.Float64 for c in COST_COLUMNS},
    "unpriced_models": pl.String,
    "compactions": pl.Int64,
    "compaction_calls": pl.Int64,
    "skipped": pl.Int64,
}


def session_stats(
    traces: Sequence[tuple[str, Trace]], prices: PriceBook, *, strict: bool = False
) -> pl.DataFrame:
    """One row per session of every (label, trace), in trace then session order.

    ``start`` is the session's first request (trace time, UTC) and ``duration_s`` the span
    of its request timestamps (both null without requests); ``skipped`` is the trace's count
    of skipped problems, repeated on each of its sessions (the JSON states it once).
    `label` is written as given: the CLI gives the compiled name (file stem and digest), so
    that no path, which holds the user's home and project names (R20), reaches a file.
    With ``strict`` an unpriceable model raises instead of giving null dollars.
    """
    rows: list[dict[str, Any]] = []
    for label, trace in traces:
        skipped = sum(trace.skipped.values())
        for session in trace.sessions:
            parent = trace.sessions[session.parent].id if session.parent >= 0 else None
            row: dict[str, Any] = {
                "trace": label,
                "session": session.id,
                "kind": session.kind,
                "parent": parent,
                "client": session.client,
                "format": trace.format,
                "models": ",".join(session.models),
                "compactions": len(session.events),
                "compaction_calls": sum(e.call_usage is not None for e in session.events),
                "skipped": skipped,
            }
            row.update(_request_stats(session, prices, strict=strict))
            rows.append(row)
    return pl.DataFrame({name: [row[name] for row in rows] for name in SCHEMA}, schema=SCHEMA)


def _request_stats(session: Session, prices: PriceBook, *, strict: bool) -> dict[str, Any]:
    r = session.requests
    n = len(r)
    used = np.flatnonzero(r["has_usage"])
    ts = r["ts"]
    out: dict[str, Any] = {
        "requests": n,
        "requests_with_usage": len(used),
        "start": datetime.fromtimestamp(int(ts.min()) / 1000, UTC) if n else None,
        "duration_s": (int(ts.max()) - int(ts.min())) / 1000.0 if n else None,
    }
    model_index = r["model"][used]
    counts = {c: r[c][used].astype(np.int64) for c in TOKEN_COLUMNS}
    calls = [e for e in session.events if e.call_usage is not None]
    if calls and session.models:
        model_index = np.concatenate(
            [model_index, [_call_model(session, e.request) for e in calls]]
        )
        for j, c in enumerate(("input", "cache_read", "cache_write_5m", "cache_write_1h")):
            counts[c] = np.concatenate(
                [counts[c], [e.call_usage[j] for e in calls if e.call_usage]]
            )
        logged = [e.call_usage[4] for e in calls if e.call_usage]
        counts["output"] = np.concatenate([counts["output"], logged])
        counts["output_recorded"] = np.concatenate([counts["output_recorded"], logged])
    for c in TOKEN_COLUMNS:
        out[c] = int(counts[c].sum())

    unpriced: list[str] = []
    for m in np.unique(model_index):
        name = session.models[int(m)]
        try:
            prices.rates(name)
        except (UnknownModelError, UnsupportedPricingError):
            if strict:
                raise
            unpriced.append(name)
    out["unpriced_models"] = ",".join(unpriced) if unpriced else None
    if unpriced:
        out.update(dict.fromkeys(COST_COLUMNS))
        return out
    dollars = prices.price_columns(
        session.models,
        model_index,
        counts["input"],
        counts["cache_read"],
        counts["cache_write_5m"],
        counts["cache_write_1h"],
        counts["output"],
    )
    for c in COMPONENTS:
        out[f"cost_{c}"] = float(dollars[c].sum())
    out["cost_total"] = float(dollars["total"].sum())
    return out


def _call_model(session: Session, request: int) -> int:
    """The model a compaction call before `request` ran on: the previous request's (the
    session's first model when the compaction came first)."""
    r = session.requests
    if len(r) == 0:
        return 0
    return int(r["model"][min(max(request - 1, 0), len(r) - 1)])


# -- rendering ----------------------------------------------------------------------------

#: (column, header, drop rank: None = always shown, else lower ranks go first when the
#: terminal is narrow) of the terminal table; the JSON and Parquet have every column.
TABLE_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("project", "project", None),
    ("start", "start", None),
    ("session", "session", None),
    ("trace", "trace", 2),
    ("kind", "kind", 7),
    ("models", "models", 17),
    ("requests", "reqs", None),
    ("requests_with_usage", "w/usage", 6),
    ("duration_s", "duration", 16),
    ("input", "input", 13),
    ("cache_read", "cache read", 15),
    ("cache_write_5m", "write 5m", 11),
    ("cache_write_1h", "write 1h", 9),
    ("output_recorded", "out logged", 5),
    ("output", "out priced", 12),
    ("cost_uncached_input", "$ input", 20),
    ("cost_cache_read", "$ read", 14),
    ("cost_cache_write_5m", "$ w5m", 10),
    ("cost_cache_write_1h", "$ w1h", 8),
    ("cost_output", "$ output", 19),
    ("cost_total", "$ total", None),
    ("compactions", "compact", 18),
    ("compaction_calls", "c.calls", 4),
    ("skipped", "skipped", 3),
)

_DATE_SUFFIX = re.compile(r"-\d{8}$")
_LEFT = frozenset(
    {"project", "start", "trace", "session", "kind", "parent", "client", "format", "models"}
)
#: Characters of a session id shown: enough to tell sessions apart and to pass to
#: `--session` (which takes a prefix).
SESSION_CHARS = 13


def render_table(
    df: pl.DataFrame,
    columns: Sequence[tuple[str, str, int | None]] = TABLE_COLUMNS,
    *,
    projects: Mapping[str, str] | None = None,
    width: int | None = None,
) -> str:
    """The terminal table (reports/tables.py: it fits the terminal), with a TOTAL row.

    Numbers are right-aligned with thousands separators; dollars get 2 to 4 decimals (fewer
    for larger amounts, the same for a whole column so the points line up). `projects`
    (trace name -> project name: terminal output only, never a file) fills the project
    column; without it the column is left out. A trace's project, start and name are shown
    on its first session only; model names are shortened (display only).
    """
    from reports.tables import Column, render

    present = set(df.columns) | ({"project"} if projects is not None else set())
    cols = [c for c in columns if c[0] in present]
    total = _total_row(df)
    body: list[list[str]] = []
    previous_trace = None
    for row in df.iter_rows(named=True):
        shown = dict(row)
        shown["project"] = (projects or {}).get(str(row.get("trace")), "-")
        if shown.get("session") is not None:
            shown["session"] = _clip(str(shown["session"]), SESSION_CHARS, keep_end=False)
        if shown.get("trace") == previous_trace:
            for name in ("trace", "project", "start"):  # its sessions follow as a group
                shown[name] = ""
        previous_trace = row.get("trace")
        if shown.get("models") is not None:
            shown["models"] = _short_models(str(shown["models"]))
        body.append([_cell(name, shown.get(name), df) for name, _, _ in cols])
    foot = [_cell(name, total[name], df) if name in total else "" for name, _, _ in cols]
    if cols and cols[0][0] != "session":
        foot[0] = "TOTAL"  # in the first column, whichever is shown
    table = [
        Column(
            header,
            right=name not in _LEFT,
            wrap=name in ("trace", "models"),
            drop=drop,
        )
        for name, header, drop in cols
    ]
    notes = []
    unpriced = df.filter(pl.col("unpriced_models").is_not_null()) if len(df) else df
    if len(unpriced):
        names = sorted({m for v in unpriced["unpriced_models"] for m in str(v).split(",")})
        notes.append(
            f"* dollars exclude {len(unpriced)} session(s) with unpriced models: "
            + ", ".join(names)
        )
    return render(table, [*body, foot], notes=notes, width=width)


def _total_row(df: pl.DataFrame) -> dict[str, Any]:
    total: dict[str, Any] = {"session": f"{len(df)} sessions"}
    for name in (
        "requests",
        "requests_with_usage",
        *TOKEN_COLUMNS,
        "compactions",
        "compaction_calls",
    ):
        total[name] = int(df[name].sum()) if len(df) else 0
    for name in COST_COLUMNS:
        total[name] = float(df[name].sum()) if len(df) else 0.0
    # skipped problems belong to a trace, not to its sessions: count each trace once
    per_trace = df.group_by("trace").agg(pl.col("skipped").first()) if len(df) else None
    total["skipped"] = int(per_trace["skipped"].sum()) if per_trace is not None else 0
    if len(df) and df["unpriced_models"].null_count() < len(df):
        total["cost_total"] = f"{_dollars(total['cost_total'], _decimals(df, 'cost_total'))}*"
    return total


def _cell(name: str, value: Any, df: pl.DataFrame) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if name == "duration_s":
        return _duration(float(value))
    if name.startswith("cost_"):
        return _dollars(float(value), _decimals(df, name))
    return f"{int(value):,}"


def _decimals(df: pl.DataFrame, name: str) -> int:
    """Decimals for a whole dollar column (TOTAL included): 4 below $1, 3 below $100, else 2."""
    if not len(df) or df[name].null_count() == len(df):
        return 4
    values = df[name].drop_nulls().to_numpy()
    biggest = max(float(np.abs(values).max()), abs(float(values.sum())))
    if biggest >= 100:
        return 2
    return 3 if biggest >= 1 else 4


def _dollars(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def _duration(seconds: float) -> str:
    whole = round(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _short_models(models: str) -> str:
    """Model names as a reader scans them: "claude-sonnet-4-5-20250929" -> "sonnet-4-5".

    Display only (the JSON keeps the exact names); `<synthetic>` error lines are left out.
    """
    names = [m for m in models.split(",") if m and m != SYNTHETIC]
    return ",".join(_DATE_SUFFIX.sub("", m.removeprefix("claude-")) for m in names)


def _clip(text: str, width: int, *, keep_end: bool) -> str:
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :] if keep_end else text[: width - 1] + "…"


def to_json(df: pl.DataFrame, skipped: int | None = None) -> str:
    """{"sessions": one object per row (every column but the per-trace `skipped`, nulls as
    null, `start` as ISO-8601 UTC), "skipped_lines": damaged lines skipped, stated once}.

    `skipped` is the command's count of damaged lines; without it, the rows' per-trace
    counts summed once per trace."""
    if skipped is None:
        per_trace = df.group_by("trace").agg(pl.col("skipped").first()) if len(df) else None
        skipped = int(per_trace["skipped"].sum()) if per_trace is not None else 0
    rows = df.drop("skipped").with_columns(pl.col("start").dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
    document = {"sessions": rows.to_dicts(), "skipped_lines": skipped}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
