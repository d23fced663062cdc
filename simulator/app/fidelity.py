"""Fidelity: the cost model checked against what the recording agent was really billed.

Replaying a trace under `as-recorded` sends exactly what the recording agent sent, so every
difference between a simulated request's cache split and the recorded usage is an error of
the prompt-cache model (TTL expiry, lookback, prefix breaks, minimum length) or of the
prefix inference, never of a policy (DESIGN.md section 7). Both sides are priced with the
same PriceBook, so dollar errors are cache-model errors too; output tokens are the same
number on both sides (the trace's `output` column) and cancel out.

`compare` gives one row per recorded request that has usage and per compaction call the
recording logged (Claude Code's `agent-acompact-*` files, which `as-recorded` replays);
`summarize` rolls them up per session and for the whole corpus. Column definitions:
reports/METRICS.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from simulator.frames import float_sum, recorded, recorded_calls
from simulator.model import RECORDED_CALL_STAGE, Trace
from simulator.pricing import PriceBook
from simulator.replay import add_costs

#: A request matches when its cache read and its cache writes are each within this share of
#: its recorded context.
MATCH_TOLERANCE = 0.01
#: Input-side components compared, as named in the replay rows (and, prefixed, here).
COMPONENTS = ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h")
KEYS = ("trace", "session_index", "request", "kind")


def compare(
    frame: pl.DataFrame, traces: Sequence[tuple[str, Trace]], prices: PriceBook | None = None
) -> pl.DataFrame:
    """Per recorded request with usage, and per compaction call the recording logged:
    simulated vs recorded tokens and dollars.

    `frame` is the replay of `traces` under one policy (normally `as-recorded`); its rows
    of kind "request" are compared, and its compaction calls of stage RECORDED_CALL_STAGE
    (the recording's own, replayed) with the logged ones: a policy's own compaction
    calls were not recorded. A compaction call sorts before the request it precedes.
    """
    specs = frame.select("policy", "params_hash").unique()
    if specs.height > 1:
        raise ValueError("compare: the frame holds rows of more than one policy spec")
    book = prices or PriceBook()
    logged = pl.concat(
        [
            recorded(traces).with_columns(pl.lit("request").alias("kind")),
            recorded_calls(traces).with_columns(pl.lit("compaction").alias("kind")),
        ]
    )
    rec = add_costs(logged, book).select(
        *KEYS,
        pl.col("model").alias("rec_model"),
        *(pl.col(c).alias(f"rec_{c}") for c in COMPONENTS),
        pl.col("output").alias("rec_output"),
        pl.col("cost_total").alias("rec_cost"),
    )
    replayed = (pl.col("kind") == "compaction") & (pl.col("stage") == RECORDED_CALL_STAGE)
    sim = frame.filter((pl.col("kind") == "request") | replayed).select(
        *KEYS,
        "session",
        "ts_ms",
        "model",
        pl.col("context_tokens").alias("sim_context"),
        *(pl.col(c).alias(f"sim_{c}") for c in COMPONENTS),
        pl.col("output").alias("sim_output"),
        pl.col("cost_total").alias("sim_cost"),
    )
    joined = sim.join(rec, on=list(KEYS), how="inner")
    context = pl.sum_horizontal(*(pl.col(f"rec_{c}") for c in COMPONENTS))
    joined = joined.with_columns(context.alias("recorded_context"))
    ctx = pl.col("recorded_context")
    errors: list[pl.Expr] = []
    for c in (*COMPONENTS, "cache_write"):
        if c == "cache_write":
            err = (pl.col("sim_cache_write_5m") + pl.col("sim_cache_write_1h")) - (
                pl.col("rec_cache_write_5m") + pl.col("rec_cache_write_1h")
            )
        else:
            err = pl.col(f"sim_{c}") - pl.col(f"rec_{c}")
        errors.append(err.alias(f"err_{c}"))
        errors.append(pl.when(ctx > 0).then(err / ctx).otherwise(None).alias(f"err_{c}_share"))
    joined = joined.with_columns(*errors)
    limit = MATCH_TOLERANCE * ctx
    joined = joined.with_columns(
        (pl.col("sim_cost") - pl.col("rec_cost")).alias("err_cost"),
        (
            (pl.col("err_cache_read").abs() <= limit) & (pl.col("err_cache_write").abs() <= limit)
        ).alias("matched"),
    )
    columns = [
        "trace",
        "session",
        "session_index",
        "request",
        "kind",
        "ts_ms",
        "model",
        "recorded_context",
        "sim_context",
    ]
    for c in COMPONENTS:
        columns += [f"rec_{c}", f"sim_{c}", f"err_{c}", f"err_{c}_share"]
    columns += ["err_cache_write", "err_cache_write_share", "sim_output", "rec_output"]
    columns += ["rec_cost", "sim_cost", "err_cost", "matched"]
    return joined.select(columns).sort(list(KEYS))


def summarize(per_request: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Per-session rows and corpus-wide figures from `compare`'s output.

    Session dollars sum the priced requests only (`unpriced` counts the others; they are
    null on both sides alike). The per-session error is relative to the recorded dollars,
    which is what the 1% goal of DESIGN.md section 7 is about.
    """
    sessions = (
        per_request.group_by(["trace", "session_index", "session"])
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("matched").sum().cast(pl.Int64).alias("matched"),
            pl.col("rec_cache_read").sum().alias("rec_cache_read"),
            pl.col("sim_cache_read").sum().alias("sim_cache_read"),
            (pl.col("rec_cache_write_5m") + pl.col("rec_cache_write_1h"))
            .sum()
            .alias("rec_cache_write"),
            (pl.col("sim_cache_write_5m") + pl.col("sim_cache_write_1h"))
            .sum()
            .alias("sim_cache_write"),
            float_sum(pl.col("rec_cost")).alias("rec_cost"),
            float_sum(pl.col("sim_cost")).alias("sim_cost"),
            pl.col("rec_cost").null_count().cast(pl.Int64).alias("unpriced"),
        )
        .with_columns(
            (pl.col("matched") / pl.col("requests")).alias("matched_share"),
            (pl.col("sim_cost") - pl.col("rec_cost")).alias("err_cost"),
        )
        .with_columns(
            pl.when(pl.col("rec_cost") > 0)
            .then(pl.col("err_cost") / pl.col("rec_cost"))
            .otherwise(None)
            .alias("err_cost_share")
        )
        .select(
            "trace",
            "session",
            "session_index",
            "requests",
            "matched",
            "matched_share",
            "rec_cache_read",
            "sim_cache_read",
            "rec_cache_write",
            "sim_cache_write",
            "rec_cost",
            "sim_cost",
            "err_cost",
            "err_cost_share",
            "unpriced",
        )
        .sort(["trace", "session_index"])
    )
    requests = per_request.height
    matched = int(per_request["matched"].sum()) if requests else 0
    rec_cost = float(sessions["rec_cost"].sum()) if sessions.height else 0.0
    sim_cost = float(sessions["sim_cost"].sum()) if sessions.height else 0.0
    shares = sessions["err_cost_share"].drop_nulls().abs().to_numpy()
    median = float(np.median(shares)) if len(shares) else None
    calls = int((per_request["kind"] == "compaction").sum()) if requests else 0
    overall: dict[str, Any] = {
        "sessions": sessions.height,
        "requests": requests,
        "compaction_calls": calls,
        "matched": matched,
        "matched_share": matched / requests if requests else None,
        "rec_cost": rec_cost,
        "sim_cost": sim_cost,
        "corpus_cost_error": (sim_cost - rec_cost) / rec_cost if rec_cost > 0 else None,
        "median_abs_session_cost_error": median,
        "sessions_within_tolerance": int((shares <= MATCH_TOLERANCE).sum()),
        "unpriced": int(sessions["unpriced"].sum()) if sessions.height else 0,
    }
    return sessions, overall


def sessions_without_usage(traces: Sequence[tuple[str, Trace]]) -> int:
    """Sessions `compare` cannot check: none of their requests has recorded usage."""
    return sum(
        1
        for _, t in traces
        for s in t.sessions
        if not s.n_requests or not s.requests["has_usage"].any()
    )


#: Reader counters that say what the compiled context was inferred from (traces/builder.py,
#: `_Anchoring`), in the order the report names them.
INFERRED = (
    ("prefix_models", "prefix of a newly seen model"),
    ("prefix_reinferred", "prefix re-inferred at a compaction"),
    ("edits_idle", "unlogged edits after an idle gap"),
    ("edits_unlogged", "other unlogged edits"),
    ("edited_blocks", "blocks they removed"),
    ("edited_tokens", "tokens they removed"),
    ("server_passes_split", "server-tool passes split into requests"),
    ("injected_blocks", "INJECTED blocks"),
    ("unexplained_shrinks", "unexplained shrinks"),
    ("forks_of_a_cached_context", "forks sent with their parent's cached context"),
)


def inferred(traces: Sequence[tuple[str, Trace]]) -> dict[str, int]:
    """What the compiled contexts of `traces` were inferred from, summed over traces."""
    out = {key: 0 for key, _ in INFERRED}
    for _, t in traces:
        for key in out:
            out[key] += int(t.stats.get(key, 0))
    return out


def worst(sessions: pl.DataFrame, n: int = 5) -> pl.DataFrame:
    """The n sessions whose simulated dollars miss the recorded ones by the most dollars."""
    return (
        sessions.with_columns(pl.col("err_cost").abs().alias("_abs"))
        .sort(["_abs", "trace", "session_index"], descending=[True, False, False])
        .drop("_abs")
        .head(n)
    )
