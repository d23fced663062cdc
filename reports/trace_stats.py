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
from collections.abc import Sequence
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

    ``duration_s`` is the span of the session's request timestamps (null without requests);
    ``skipped`` is the trace's count of skipped problems, repeated on each of its sessions.
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

#: (column, header, max width for text) of the default terminal table; the JSON has them all.
TABLE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("trace", "trace", 28),
    ("session", "session", 14),
    ("kind", "kind", 10),
    ("models", "models", 26),
    ("requests", "reqs", 0),
    ("requests_with_usage", "w/usage", 0),
    ("duration_s", "duration", 0),
    ("input", "input", 0),
    ("cache_read", "cache read", 0),
    ("cache_write_5m", "write 5m", 0),
    ("cache_write_1h", "write 1h", 0),
    ("output_recorded", "out logged", 0),
    ("output", "out priced", 0),
    ("cost_cache_read", "$ read", 0),
    ("cost_cache_write_5m", "$ w5m", 0),
    ("cost_cache_write_1h", "$ w1h", 0),
    ("cost_total", "$ total", 0),
    ("compactions", "compact", 0),
    ("compaction_calls", "c.calls", 0),
    ("skipped", "skipped", 0),
)

_DATE_SUFFIX = re.compile(r"-\d{8}$")
_LEFT = frozenset({"trace", "session", "kind", "parent", "client", "format", "models"})


def render_table(df: pl.DataFrame, columns: Sequence[tuple[str, str, int]] = TABLE_COLUMNS) -> str:
    """A fixed-width table for the terminal, with a TOTAL row.

    Numbers are right-aligned with thousands separators; dollars get 2 to 4 decimals (fewer
    for larger amounts, the same for a whole column so the points line up); long text is cut
    with an ellipsis (trace labels keep their end, where the file name is). A trace's label is
    shown on its first session only, and model names are shortened (display only).
    """
    cols = [c for c in columns if c[0] in df.columns]
    total = _total_row(df)
    body: list[list[str]] = []
    previous_trace = None
    for row in df.iter_rows(named=True):
        shown = dict(row)
        if shown.get("trace") == previous_trace:
            shown["trace"] = ""  # one label per trace: its sessions follow as a group
        previous_trace = row.get("trace")
        if shown.get("models") is not None:
            shown["models"] = _short_models(str(shown["models"]))
        body.append([_cell(name, shown[name], width, df) for name, _, width in cols])
    foot = [_cell(name, total[name], width, df) if name in total else "" for name, _, width in cols]
    header = [h for _, h, _ in cols]
    widths = [max(len(x) for x in column) for column in zip(header, *body, foot, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(w) if name in _LEFT else cell.rjust(w)
            for (name, _, _), cell, w in zip(cols, cells, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(header), rule, *(line(r) for r in body), rule, line(foot)]
    unpriced = df.filter(pl.col("unpriced_models").is_not_null()) if len(df) else df
    if len(unpriced):
        names = sorted({m for v in unpriced["unpriced_models"] for m in str(v).split(",")})
        out.append(
            f"* dollars exclude {len(unpriced)} session(s) with unpriced models: "
            + ", ".join(names)
        )
    return "\n".join(out) + "\n"


def _total_row(df: pl.DataFrame) -> dict[str, Any]:
    total: dict[str, Any] = {"trace": "TOTAL", "session": f"{len(df)} sessions"}
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


def _cell(name: str, value: Any, width: int, df: pl.DataFrame) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return _clip(value, width, keep_end=name == "trace") if width else value
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


def to_json(df: pl.DataFrame) -> str:
    """The table as a JSON array of row objects (every column, nulls as null)."""
    return json.dumps(df.to_dicts(), indent=2, ensure_ascii=False) + "\n"
