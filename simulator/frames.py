"""The files of a run: requests.parquet, sessions.parquet and manifest.json (DESIGN.md 8).

Everything here turns replay frames into bytes and does no I/O, so the CLI can compute every
output before it writes the first one (a failed run leaves the directory as it was). The
bytes are reproducible: rows are sorted by a total key, Parquet is written with fixed
compression and no statistics, and the manifest holds sorted keys and no timestamps or
machine paths, so two runs on the same inputs give identical files that CI can diff.

sessions.parquet is derived from the request rows by one polars group_by, never by a second
bookkeeping in the engine: a session metric can only disagree with its requests by a bug
in one expression. Column definitions: reports/METRICS.md.
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import polars as pl

from simulator.loss import LOSS_SCHEMA
from simulator.model import Session, Trace
from simulator.policy import PolicySpec
from simulator.pricing import PriceBook
from simulator.replay import COST_COLUMNS, default_prices

REQUESTS_FILE = "requests.parquet"
SESSIONS_FILE = "sessions.parquet"
MANIFEST_FILE = "manifest.json"
EDITS_FILE = "edits.parquet"
#: Every file name a run's data may have; an earlier run's are all replaced by the next.
RUN_FILES = (REQUESTS_FILE, SESSIONS_FILE, EDITS_FILE, MANIFEST_FILE)
#: The report a run or `ctxsim report` draws beside the data (reports/html.py).
REPORT_FILE = "report.html"
CHARTS_DIR = "charts"
#: The charts a report wrote, one name per line (relative to the run directory): the only
#: files under charts/ a later run or report may replace. Anything else there is the user's.
CHARTS_INDEX = f"{CHARTS_DIR}/index.txt"

#: Total order of request rows: one row per (trace, session, request, call, policy spec).
REQUEST_ORDER = ("trace", "session_index", "request", "call", "policy", "params_hash")
#: Keys of a session row, in the order rows are sorted.
SESSION_KEYS = ("trace", "session_index", "session", "policy", "params_hash")
TOKEN_COLUMNS = ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "output")

#: Loss proxies of a request row (simulator/loss.py LOSS_SCHEMA, emitted by the engine on
#: the same rows: what the view no longer holds, reports/METRICS.md). A frame without them
#: gives null loss summaries.
#: The loss figures of a session or run summary, each derived from the columns above.
LOSS_SUMMARY = (
    "human_verbatim_share",
    "summary_share",
    "stale_file_refs",
    "post_compaction_requests",
    "resent_tokens",
)

#: Parquet writer settings, all spelled out so a library default cannot change the bytes.
PARQUET_COMPRESSION_LEVEL = 3
PARQUET_ROW_GROUP_SIZE = 1 << 20


def ctxsim_version() -> str:
    """The installed ctxsim version (recorded in the manifest)."""
    try:
        return package_version("ctxsim")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


@functools.cache
def rules_versions() -> dict[str, str]:
    """Digests of what decides a row beside the policy's spec: the prompt-cache rules
    (simulator/prompt_cache.py and the prefix inference, simulator/prefix.py) and the model
    facts (simulator/models.py with the genai-prices release whose data it reads). A change
    of either gives other rows for the same spec, so the manifest records them and a sweep or
    a tuning study refuses to resume across a change."""
    from simulator import models, prefix, prompt_cache

    def digest(*modules: ModuleType, extra: str = "") -> str:
        h = hashlib.sha256(extra.encode())
        for module in modules:
            h.update(Path(str(module.__file__)).read_bytes())
        return h.hexdigest()[:12]

    try:
        prices_release = package_version("genai-prices")
    except PackageNotFoundError:
        prices_release = "unknown"
    return {
        "cache_rules": digest(prompt_cache, prefix),
        "model_facts": digest(models, extra=f"genai-prices {prices_release}"),
        "replay_code": code_digest(),
    }


@functools.cache
def code_digest() -> str:
    """Digest of the code and data that decide a row beyond the cache rules and model facts:
    every module of the core (the engine, the view, the loss proxies, the re-fetch loop...)
    and every source and data file of the packages the registered policies come from (their
    stages, presets and calibration data). A sweep or a tuning study records it and refuses
    to resume across any change of it, so cells computed by other code are never mixed."""
    import importlib.util

    from simulator import policy as registry

    core = Path(__file__).resolve().parent
    files = sorted(core.glob("*.py"))
    packages = sorted({registry.module_of(name).split(".")[0] for name in registry.names()})
    for package in packages:
        spec = importlib.util.find_spec(package)
        for place in sorted(spec.submodule_search_locations or []) if spec else []:
            root = Path(place).resolve()
            if root == core:
                continue
            files += sorted(
                f for f in root.rglob("*") if f.suffix in (".py", ".json", ".toml") and f.is_file()
            )
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def prices_date(book: PriceBook) -> str | None:
    """The day the run's price table dates from: the newest start date of a dated price
    (genai-prices `StartDateConstraint`) in force at the book's pricing instant, ISO format.

    genai-prices records no snapshot date; its prices carry the day each change takes
    effect, so the newest one in force is the first day every rate used holds (a
    PriceBook's default instant takes the newest prices, so for genai-prices 0.2.3 this is
    2027-01-01, a scheduled Gemini change). The manifest's `prices` field, "as of
    9999-12-31", names that instant, which no reader takes for a date (issue 15). None when
    no price is dated."""
    return _newest_dated_price(book.as_of.date())


@functools.cache
def _newest_dated_price(as_of: date) -> str | None:
    from genai_prices.data import providers
    from genai_prices.types import StartDateConstraint

    dated = [
        conditional.constraint.start_date
        for provider in providers
        for model in provider.models
        for conditional in (model.prices if isinstance(model.prices, list) else [])
        if isinstance(conditional.constraint, StartDateConstraint)
    ]
    in_force = [d for d in dated if d <= as_of]
    return max(in_force).isoformat() if in_force else None


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    """The frame as Parquet bytes; equal frames give equal bytes."""
    buf = io.BytesIO()
    frame.rechunk().write_parquet(
        buf,
        compression="zstd",
        compression_level=PARQUET_COMPRESSION_LEVEL,
        statistics=False,
        row_group_size=PARQUET_ROW_GROUP_SIZE,
    )
    return buf.getvalue()


def json_bytes(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, two-space indent, final newline."""
    data: bytes = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    return data + b"\n"


#: Request times as written: a UTC timestamp in milliseconds (Parquet TIMESTAMP(MILLIS,
#: UTC)), which pyarrow, polars, DuckDB and pandas all read as a time (issue 15: int64
#: milliseconds read as a number everywhere).
TIMESTAMP = pl.Datetime("ms", "UTC")


def as_written(frame: pl.DataFrame) -> pl.DataFrame:
    """Replay rows with their time as a timestamp: `ts_ms` (int64 ms since the epoch, the
    engine's) becomes `ts` in its place; a frame that has `ts` already is returned as is."""
    if "ts_ms" not in frame.columns:
        return frame
    ts = pl.col("ts_ms").cast(pl.Int64).cast(TIMESTAMP).alias("ts")
    return frame.select(ts if c == "ts_ms" else pl.col(c) for c in frame.columns)


#: Columns a failed call does not bill: the provider refuses a prompt above the model's
#: window before it processes a token (see `bill_failed`).
BILLED_COLUMNS = (*TOKEN_COLUMNS, *COST_COLUMNS, "resent_tokens")


def bill_failed(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows of a policy's replay with `failed` set and failed calls billed nothing.

    A call is failed when its view exceeds the model's window (`overflow`): Anthropic's API
    answers such a prompt with a 400 "prompt is too long" and OpenAI's with
    "context_length_exceeded", and neither bills the rejected request; Claude Code blocks a
    request above its blocking limit before sending it (policies/claude_code/policy.py).
    So a failed row keeps `context_tokens` (what the policy tried to send) and its loss
    proxies (what that view held), but its billed tokens, its dollars and its re-sent
    tokens are 0. The work is not done for free: the harness would have to retry or
    compact, which the replay does not model, so a policy with overflows is flagged in
    every summary (reports/METRICS.md, Failed calls) instead of scoring cheap."""
    if "failed" in frame.columns or "overflow" not in frame.columns:
        return frame
    overflow = frame.get_column("overflow")
    if not overflow.any():  # nothing failed (nearly every part): only the flag is added
        out = frame.clone()  # insert_column changes the frame it is called on
        return out.insert_column(
            frame.columns.index("overflow") + 1, overflow.fill_null(False).alias("failed")
        )
    failed = pl.col("overflow").fill_null(False)
    billed = [c for c in BILLED_COLUMNS if c in frame.columns]
    zeroed = [
        pl.when(failed).then(pl.lit(0, frame.schema[c])).otherwise(pl.col(c)).alias(c)
        for c in billed
    ]
    out = frame.with_columns(*zeroed, failed.alias("failed"))
    order = list(frame.columns)
    order.insert(order.index("overflow") + 1, "failed")
    return out.select(order)


class RowParts:
    """A run's replay rows as they are made (one frame per policy spec and trace), held
    compact and handed over to `build_run`, which takes them out as it builds the run's
    frame.

    Issue 16: a run held its rows three times at the end (the per-policy frames, their
    concatenation and its sorted copy) and the recorded usage priced in full beside them:
    1,168 bytes of peak memory per request at 1M synthetic requests under claude-code
    (tests/bench/test_bench_memory.py). Here each part is kept compact while the replay
    goes on (text columns as Categorical, integer columns whose values fit as Int32: 410
    -> 222 bytes a row on that corpus), and `build_run` moves them out into the run's
    frame without a sort (`in_order`): 622 bytes per request, measured in the same tree.
    Memory polars frees is kept by its allocator for reuse rather than returned, so a
    part freed late still counts: holding it small is what lowers the peak. Compacting
    changes no value: `take` and `in_order` cast every column back to its dtype.
    """

    def __init__(self) -> None:
        self._parts: list[tuple[pl.Schema, pl.DataFrame]] = []

    def add(self, frame: pl.DataFrame) -> None:
        """Keep a policy's replay rows (failed calls billed nothing: `bill_failed`)."""
        billed = bill_failed(frame)
        self._parts.append((billed.schema, compact(billed)))

    def take(self) -> list[pl.DataFrame]:
        """The frames added so far, as they were added, forgotten here."""
        return [restored(frame, schema) for schema, frame in self.take_compact()]

    def take_compact(self) -> list[tuple[pl.Schema, pl.DataFrame]]:
        """(schema as added, compact frame) of every frame added so far, forgotten here."""
        parts, self._parts = self._parts, []
        return parts

    def __len__(self) -> int:
        return len(self._parts)


_INT32 = (-(2**31), 2**31 - 1)


def compact(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame in fewer bytes and the same values: text columns as Categorical (a row's
    16-byte view becomes a 4-byte code), Int64 columns whose values all fit as Int32."""
    ints = [c for c, t in frame.schema.items() if t == pl.Int64]
    narrow = set()
    if ints and frame.height:
        bounds = frame.select(
            *(pl.col(c).min().alias(f"{c}\0min") for c in ints),
            *(pl.col(c).max().alias(f"{c}\0max") for c in ints),
        ).row(0, named=True)
        for c in ints:
            low, high = bounds[f"{c}\0min"], bounds[f"{c}\0max"]
            if low is None or (_INT32[0] <= low and high <= _INT32[1]):
                narrow.add(c)
    return frame.with_columns(
        *(pl.col(c).cast(pl.Int32) for c in narrow),
        pl.col(pl.String).cast(pl.Categorical),
    )


def restored(frame: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """A `compact` frame with every column back in the dtype of `schema`."""
    return frame.with_columns(
        pl.col(c).cast(schema[c]) for c, t in frame.schema.items() if schema[c] != t
    )


def request_rows(frames: Sequence[pl.DataFrame] | RowParts) -> pl.DataFrame:
    """All policies' replay frames as one frame, in the canonical row order, as written.

    The same frame as concatenating them and sorting by REQUEST_ORDER (`in_order`), built
    with no sort where the rows are in order already."""
    if isinstance(frames, RowParts):
        return as_written(_take_in_order(frames))
    if not frames:
        raise ValueError("no replay frames")
    return as_written(in_order([(f.schema, f) for f in frames]))


def _take_in_order(parts: RowParts) -> pl.DataFrame:
    taken = parts.take_compact()
    if not taken:
        raise ValueError("no replay frames")
    return in_order(taken)


def in_order(parts: list[tuple[pl.Schema, pl.DataFrame]]) -> pl.DataFrame:
    """`pl.concat(frames).sort(REQUEST_ORDER)` of (schema, frame or its `compact` form)
    pairs, as one contiguous frame of the schemas' dtypes; empties `parts`.

    The engine writes a trace's rows in (session_index, request, call) order, one trace
    and one policy spec at a time (simulator/replay.py), so the total order is almost
    always the parts' traces put in name order: each part is cut into its traces' runs
    (zero-copy slices), a trace met in one slice whose rows are strictly ordered is taken
    as it is (a check, not a sort), and a trace met in several slices (several policy
    specs, whose rows interleave call by call) gets the permutation that sorts its keys.
    The frame is then built one column at a time, each column dropped from the slices
    once copied, so no second whole copy of the rows is made. It is contiguous, as the
    sort's was: polars sums a Float64 column split in chunks chunk by chunk, and the
    session dollars would differ in the last bits. Parts of unequal schemas, or rows with
    a null key, take the plain concat and sort (the same result, the same errors)."""
    schema = parts[0][0]
    if not _joinable(parts):
        frames = [restored(f, s) for s, f in parts]
        parts.clear()
        return pl.concat(frames, how="vertical").sort(list(REQUEST_ORDER))
    by_trace: dict[str, list[pl.DataFrame]] = {}
    while parts:
        _, part = parts.pop(0)
        runs = part.select(pl.col("trace").cast(pl.String).rle()).to_series().struct.unnest()
        offset = 0
        for length, name in zip(runs["len"].to_list(), runs["value"].to_list(), strict=True):
            by_trace.setdefault(name, []).append(part.slice(offset, length))
            offset += length
        del part
    keys = list(REQUEST_ORDER[1:])
    groups: list[tuple[list[pl.DataFrame], pl.Series | None]] = []
    for name in sorted(by_trace):
        slices = by_trace.pop(name)
        key_rows = pl.concat([restored(s.select(keys), schema) for s in slices], how="vertical")
        order = None
        if not _strictly_ordered(key_rows, keys):
            order = key_rows.select(pl.arg_sort_by(keys, maintain_order=True)).to_series()
        groups.append((slices, order))
    # Each slice as its columns, each popped once copied: a column's buffers are freed as
    # soon as every slice has given it up (a `drop` per slice and column did the same at
    # a polars call each: 6,000 on the shared Claude Code corpus, a quarter of `run`).
    held: list[tuple[list[dict[str, pl.Series]], pl.Series | None]] = [
        ([dict(zip(s.columns, s.get_columns(), strict=True)) for s in group], order)
        for group, order in groups
    ]
    del groups
    columns = []
    for column, dtype in schema.items():
        pieces = []
        for parts_of, order in held:
            cast = [_as(d.pop(column), dtype) for d in parts_of]
            piece = cast[0] if len(cast) == 1 else pl.concat(cast)
            pieces.append(piece if order is None else piece.gather(order))
        columns.append(pl.concat(pieces).rechunk().alias(column))
        del pieces
    return pl.DataFrame(columns)


def _as(series: pl.Series, dtype: pl.DataType) -> pl.Series:
    """`series` in `dtype` (a `compact` column back in its schema's), cast only if needed."""
    return series if series.dtype == dtype else series.cast(dtype)


def _joinable(parts: list[tuple[pl.Schema, pl.DataFrame]]) -> bool:
    """Whether `in_order` may cut and join the parts: equal schemas, at least one row, no
    null key (the plain sort's place for nulls is not worth copying)."""
    schema = parts[0][0]
    if any(s != schema for s, _ in parts) or not all(k in schema for k in REQUEST_ORDER):
        return False
    if sum(f.height for _, f in parts) == 0:
        return False
    nulls = pl.any_horizontal(pl.col(list(REQUEST_ORDER)).is_null().any())
    return not any(f.select(nulls).item() for _, f in parts)


def _strictly_ordered(frame: pl.DataFrame, keys: Sequence[str]) -> bool:
    """Whether every row's key is strictly above the previous row's (lexicographically,
    as polars sorts: numbers by value, strings by their UTF-8 bytes)."""
    if frame.height < 2:
        return True
    above: pl.Expr | None = None
    for key in reversed(keys):
        col, prev = pl.col(key), pl.col(key).shift(1)
        above = col > prev if above is None else (col > prev) | ((col == prev) & above)
    assert above is not None
    return bool(frame.select(above.slice(1).all()).item())


def edit_rows(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """All policies' edit tables (simulator/replay.py EDIT_SCHEMA) as one frame, in the
    order of the rows they precede; the order of a call's own edits is kept."""
    frame = pl.concat(list(frames), how="vertical")
    return frame.sort(
        ["policy", "params_hash", "trace", "session_index", "request", "call"],
        maintain_order=True,
    )


#: The whole prompt of a call: uncached plus cached (read and written) tokens.
_INPUT = (
    pl.col("uncached_input")
    + pl.col("cache_read")
    + pl.col("cache_write_5m")
    + pl.col("cache_write_1h")
)


def float_sum(expr: pl.Expr) -> pl.Expr:
    """The sum of a float expression, in a group_by or over a frame, added in value order.

    polars adds a group's floats in partial sums whose order follows its threads and the
    frame's chunks, so two runs over the same rows could differ in the last bits (a
    10,000-row group gave 2 results in 40 runs, 100 groups over 1M rows 15 in 40, polars
    2.1), and the files of a run must be identical on rerun. Sorted first, the order is
    the values' own."""
    return expr.sort().sum()


def _sum_or_null(column: str) -> pl.Expr:
    """A dollar sum that is null when any row is unpriced: a partial sum would look real."""
    col = pl.col(column)
    return pl.when(col.null_count() == 0).then(float_sum(col)).otherwise(None).alias(column)


def has_loss(frame: pl.DataFrame) -> bool:
    """Whether the request rows carry the loss proxies."""
    return all(c in frame.columns for c in LOSS_SCHEMA)


def _share(numerator: pl.Expr, denominator: pl.Expr) -> pl.Expr:
    """A ratio that is null, not NaN or infinite, when there is nothing to divide by."""
    return pl.when(denominator > 0).then(numerator / denominator).otherwise(None)


def _loss_aggs(present: bool) -> list[pl.Expr]:
    """Loss figures over a group's rows of kind `request` (the views the model answers from);
    all null when the rows carry no loss proxies, so the schema is the same either way."""
    if not present:
        return [
            *(pl.lit(None, pl.Float64).alias(c) for c in LOSS_SUMMARY[:2]),
            *(pl.lit(None, pl.Int64).alias(c) for c in LOSS_SUMMARY[2:]),
        ]
    req = pl.col("kind") == "request"

    def total(column: str) -> pl.Expr:
        return pl.col(column).filter(req).sum().cast(pl.Int64)

    return [
        _share(total("human_verbatim_tokens"), total("human_tokens")).alias("human_verbatim_share"),
        _share(total("summary_tokens"), total("context_tokens")).alias("summary_share"),
        total("stale_file_refs").alias("stale_file_refs"),
        total("after_compaction").alias("post_compaction_requests"),
        total("resent_tokens").alias("resent_tokens"),
    ]


def _edit_aggs(requests: pl.DataFrame) -> list[pl.Expr]:
    """Edits without a call and the tokens they removed (null for rows that predate the
    columns)."""
    if "edits" in requests.columns:
        return [
            pl.col("edits").sum().cast(pl.Int64).alias("edits"),
            pl.col("edit_tokens").sum().cast(pl.Int64).alias("edit_tokens"),
        ]
    return [pl.lit(None, pl.Int64).alias("edits"), pl.lit(None, pl.Int64).alias("edit_tokens")]


def session_rows(requests: pl.DataFrame) -> pl.DataFrame:
    """One row per trace x session x policy spec, aggregated from the request rows."""
    requests = as_written(requests)
    frame = requests.group_by(list(SESSION_KEYS)).agg(
        pl.col("model").unique().sort().str.join(",").alias("models"),
        (pl.col("kind") == "request").sum().cast(pl.Int64).alias("requests"),
        pl.len().cast(pl.Int64).alias("calls"),
        (pl.col("kind") == "compaction").sum().cast(pl.Int64).alias("compactions"),
        pl.col("overflow").sum().cast(pl.Int64).alias("overflows"),
        pl.col("breaker_trip").sum().cast(pl.Int64).alias("breaker_trips"),
        *_edit_aggs(requests),
        _INPUT.sum().cast(pl.Int64).alias("input_tokens"),
        *(pl.col(c).sum().cast(pl.Int64) for c in TOKEN_COLUMNS),
        pl.col("context_tokens").max().cast(pl.Int64).alias("context_max"),
        pl.col("ts").min().alias("start"),
        ((pl.col("ts").max() - pl.col("ts").min()).dt.total_milliseconds() / 1000.0).alias(
            "duration_s"
        ),
        *(_sum_or_null(c) for c in COST_COLUMNS),
        pl.col("cost_total").null_count().cast(pl.Int64).alias("unpriced_calls"),
        *_loss_aggs(has_loss(requests)),
    )
    frame = frame.with_columns(
        _share(pl.col("cache_read"), pl.col("input_tokens")).alias("cache_hit_ratio")
    )
    ordered = [
        *SESSION_KEYS,
        "models",
        "requests",
        "calls",
        "compactions",
        "overflows",
        "breaker_trips",
        "edits",
        "edit_tokens",
        "input_tokens",
        *TOKEN_COLUMNS,
        "context_max",
        "cache_hit_ratio",
        "start",
        "duration_s",
        *COST_COLUMNS,
        "unpriced_calls",
        *LOSS_SUMMARY,
    ]
    return frame.select(ordered).sort(["trace", "session_index", "policy", "params_hash"])


#: Figures of a run summary, in order (the `ctxsim run` printout, the report, compare).
SUMMARY_COLUMNS = (
    "requests",
    "calls",
    "compactions",
    "overflows",
    "breaker_trips",
    "edits",
    "edit_tokens",
    "input_tokens",
    "cost_total",
    "unpriced_calls",
    "cache_hit_ratio",
    *LOSS_SUMMARY,
)


def _summary_aggs(present: bool, edits: list[pl.Expr]) -> list[pl.Expr]:
    inputs = _INPUT.sum()
    return [
        (pl.col("kind") == "request").sum().cast(pl.Int64).alias("requests"),
        pl.len().cast(pl.Int64).alias("calls"),
        (pl.col("kind") == "compaction").sum().cast(pl.Int64).alias("compactions"),
        pl.col("overflow").sum().cast(pl.Int64).alias("overflows"),
        pl.col("breaker_trip").sum().cast(pl.Int64).alias("breaker_trips"),
        *edits,
        inputs.cast(pl.Int64).alias("input_tokens"),
        float_sum(pl.col("cost_total")).alias("cost_total"),
        pl.col("cost_total").null_count().cast(pl.Int64).alias("unpriced_calls"),
        _share(pl.col("cache_read").sum(), inputs).alias("cache_hit_ratio"),
        *_loss_aggs(present),
    ]


def policy_summary(requests: pl.DataFrame) -> pl.DataFrame:
    """Per policy spec: the figures of SUMMARY_COLUMNS over all its rows (priced rows only
    for `cost_total`; `unpriced_calls` says how many were left out)."""
    return (
        requests.group_by(["policy", "params_hash"])
        .agg(_summary_aggs(has_loss(requests), _edit_aggs(requests)))
        .select(["policy", "params_hash", *SUMMARY_COLUMNS])
        .sort(["policy", "params_hash"])
    )


def overall_summary(requests: pl.DataFrame) -> dict[str, Any]:
    """SUMMARY_COLUMNS over every row of the frame (all its policy specs together)."""
    return requests.select(_summary_aggs(has_loss(requests), _edit_aggs(requests))).row(
        0, named=True
    )


def trace_entry(name: str, trace: Trace) -> dict[str, Any]:
    """What the manifest says about one input trace: enough to find the same input again."""
    return {
        "name": name,
        "format": trace.format,
        "source_digest": trace.source_digest,
        "sessions": len(trace.sessions),
        "requests": sum(s.n_requests for s in trace.sessions),
        "skipped": dict(sorted(trace.skipped.items())),
    }


def policy_entry(spec: PolicySpec) -> dict[str, Any]:
    """A policy spec with every parameter (defaults included) and its hash."""
    return {**spec.as_dict(), "params_hash": spec.param_hash}


@dataclass(frozen=True)
class RunOutputs:
    """A run's three outputs, computed and serialised, not yet written."""

    requests: pl.DataFrame
    sessions: pl.DataFrame
    manifest: dict[str, Any]
    files: dict[str, bytes]
    #: Dollars of the recorded usage of the run's traces (requests that have usage), for
    #: the summary to show beside each policy's; None when no request has usage.
    recorded_cost: float | None = None


def build_run(
    frames: Sequence[pl.DataFrame] | RowParts,
    specs: Sequence[PolicySpec],
    traces: Sequence[tuple[str, Trace]],
    *,
    seed: int,
    cache: str,
    prices_version: str,
    lenient: bool,
    edits: Sequence[pl.DataFrame] = (),
    prices: PriceBook | None = None,
    refetch: bool = False,
) -> RunOutputs:
    """Every output of a run, as frames and as the exact bytes to write (edits.parquet
    when `edits` holds the policies' edit tables). `frames`: the replay frames, any
    number per policy spec; RowParts are taken out (see there)."""
    # The recordings' dollars first, while the run holds only its compact parts.
    logged = recorded_priced(traces, prices)
    by_session, recorded = recorded_by_session(logged), _total(logged)
    del logged
    if isinstance(frames, RowParts):
        requests = as_written(_take_in_order(frames))
    else:
        requests = request_rows([bill_failed(f) for f in frames])
    sessions = with_recorded(session_rows(requests), by_session)
    files = {REQUESTS_FILE: parquet_bytes(requests), SESSIONS_FILE: parquet_bytes(sessions)}
    edit_table = edit_rows(edits) if edits else None
    if edit_table is not None:
        files[EDITS_FILE] = parquet_bytes(edit_table)
    manifest: dict[str, Any] = {
        "ctxsim_version": ctxsim_version(),
        "prices": prices_version,
        "prices_date": prices_date(prices or default_prices()),
        **rules_versions(),
        "seed": seed,
        "cache": cache,
        "lenient": lenient,
        "refetch": refetch,
        #: The recorded usage of the run's traces, priced the same way (null: none logged).
        "recorded_cost": None if recorded is None else round(recorded, 6),
        "policies": [policy_entry(s) for s in specs],
        "traces": [trace_entry(name, trace) for name, trace in traces],
        "rows": {"requests": requests.height, "sessions": sessions.height}
        | ({"edits": edit_table.height} if edit_table is not None else {}),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    files[MANIFEST_FILE] = json_bytes(manifest)
    return RunOutputs(requests, sessions, manifest, files, recorded)


def recorded_priced(
    traces: Sequence[tuple[str, Trace]], prices: PriceBook | None = None
) -> pl.DataFrame | None:
    """The dollars of every recorded request that logged usage (trace, session_index,
    cost_total), priced with the run's price book (None when none did): what the run
    summary and the session rows read the policies against. The recording's compaction
    calls are in it where it logged them (`CompactionEvent.call_usage`): the recording paid
    for them, as a policy pays for its own.

    Priced one session at a time and only the dollars kept: pricing is per row
    (simulator/pricing.py `price_columns`), so the values are those of pricing all rows
    at once, without holding every recorded row and its six price columns (issue 16: 420
    bytes per request at the peak at 1M requests). The frame is laid out as before (keys
    in one chunk per session, `cost_total` contiguous), so its sums are the same bits."""
    from simulator.replay import add_costs

    book = prices or default_prices()
    keys: list[pl.DataFrame] = []
    costs: list[pl.Series] = []
    for part in _recorded_parts(traces, calls=True):
        keys.append(part.select("trace", "session_index"))
        costs.append(add_costs(part, book).get_column("cost_total"))
    if not keys:
        return None
    cost = pl.concat(costs, rechunk=True)
    return pl.concat(keys, how="vertical").with_columns(cost.alias("cost_total"))


def recorded_by_session(priced: pl.DataFrame | None) -> pl.DataFrame:
    """The recorded dollars of every session that logged usage (trace, session_index,
    recorded_cost) from `recorded_priced`'s rows: what a policy's dollars for that session
    are read against."""
    schema = {"trace": pl.String, "session_index": pl.Int32, "recorded_cost": pl.Float64}
    if priced is None:
        return pl.DataFrame(schema=schema)
    return (
        priced.group_by(["trace", "session_index"])
        .agg(_sum_or_null("cost_total").alias("recorded_cost"))
        .select(pl.col("trace"), pl.col("session_index").cast(pl.Int32), "recorded_cost")
    )


def with_recorded(sessions: pl.DataFrame, recorded: pl.DataFrame) -> pl.DataFrame:
    """Session rows with `recorded_cost` after `cost_total` (null where the session logged
    no usage, e.g. SWE-agent trajectories), in their own order."""
    keyed = recorded.with_columns(pl.col("session_index").cast(sessions["session_index"].dtype))
    joined = sessions.join(keyed, on=["trace", "session_index"], how="left", maintain_order="left")
    order = list(sessions.columns)
    order.insert(order.index("cost_total") + 1, "recorded_cost")
    return joined.select(order)


def versus_recorded(sessions: pl.DataFrame) -> pl.DataFrame:
    """Per policy spec, its dollars and the recording's over the same sessions (those that
    logged usage): `compared_cost`, `recorded_cost`, `compared_sessions`, `sessions`. A
    difference taken over all sessions would count the unlogged ones as pure extra cost."""
    logged = pl.col("recorded_cost").is_not_null()
    return (
        sessions.group_by(["policy", "params_hash"])
        .agg(
            pl.when((logged & pl.col("cost_total").is_null()).any())
            .then(None)
            .otherwise(float_sum(pl.col("cost_total").filter(logged)))
            .alias("compared_cost"),
            float_sum(pl.col("recorded_cost").filter(logged)).alias("recorded_cost"),
            logged.sum().cast(pl.Int64).alias("compared_sessions"),
            pl.len().cast(pl.Int64).alias("sessions"),
        )
        .sort(["policy", "params_hash"])
    )


def recorded_cost(
    traces: Sequence[tuple[str, Trace]], prices: PriceBook | None = None
) -> float | None:
    """What the recorded requests cost (their logged usage, priced with the run's price
    book), so a policy's dollars are read against the recording's, not on their own."""
    return _total(recorded_priced(traces, prices))


def _total(priced: pl.DataFrame | None) -> float | None:
    return None if priced is None else float(priced.select(float_sum(pl.col("cost_total"))).item())


#: Figures of the re-fetch model (simulator/refetch.py, reports/METRICS.md "Re-fetch"), each
#: the sum of its row column: the inserted rounds, their tokens, the recorded re-reads left
#: out, theirs, and the inserted rounds' dollars. Null in the open loop (not modelled).
REFETCH_FIGURES: dict[str, Any] = {
    "refetch_calls": pl.Int64,
    "refetch_tokens": pl.Int64,
    "skipped_rereads": pl.Int64,
    "skipped_tokens": pl.Int64,
    "refetch_cost": pl.Float64,
}
#: Figures of a cell in cells.parquet, and what tuning can aim at or bound: every figure of
#: a run summary (simulator/frames.py SUMMARY_COLUMNS: cost, calls, compactions,
#: overflows, edits, the loss proxies, ...), then the re-fetch figures.
CELL_FIGURES = tuple(dict.fromkeys((*SUMMARY_COLUMNS, *REFETCH_FIGURES)))


def grid_keys(cells: pl.DataFrame) -> list[str]:
    """The grid parameters of a cells table (every column between the keys and figures)."""
    return [c for c in cells.columns if c not in ("policy", "params_hash", *CELL_FIGURES)]


def inert_grid_keys(cells: pl.DataFrame) -> list[str]:
    """The grid parameters that changed nothing: wherever two cells differ in that
    parameter alone (same policy, same other grid values), every figure of theirs is the
    same. A sweep of one is a question the replay never asked: the policy (or the preset a
    session takes) does not read it, as claude-code@1.0's threshold, a share of the window,
    ignores `autocompact.buffer_tokens`."""
    keys = grid_keys(cells)
    figures = [c for c in CELL_FIGURES if c in cells.columns]
    out = []
    for key in keys:
        others = ["policy", *(k for k in keys if k != key)]
        spread = (
            cells.group_by(others)
            .agg(
                pl.col(key).n_unique().alias("_values"),
                pl.struct(figures).n_unique().alias("_figures"),
            )
            .filter(pl.col("_values") > 1)  # cells that differ in this parameter alone
        )
        if spread.height and (spread["_figures"] == 1).all():
            out.append(key)
    return out


#: The recorded usage of a request, in replay-row vocabulary (`recorded`).
_RECORDED_SCHEMA: dict[str, Any] = {
    "trace": pl.String,
    "session_index": pl.Int32,
    "request": pl.Int32,
    "model": pl.String,
    **{c: pl.Int64 for c in (*TOKEN_COLUMNS[:4], "output")},
}


def recorded_calls(traces: Sequence[tuple[str, Trace]]) -> pl.DataFrame:
    """The recording's logged compaction calls, in `recorded`'s vocabulary (`request`: the
    first request after the compaction, before which the call went out)."""
    parts = [
        part
        for name, trace in traces
        for i, session in enumerate(trace.sessions)
        if (part := _compaction_calls(name, i, session)) is not None
    ]
    if not parts:
        return pl.DataFrame(schema=_RECORDED_SCHEMA)
    return pl.concat(parts, how="vertical")


def recorded(traces: Sequence[tuple[str, Trace]]) -> pl.DataFrame:
    """The recorded usage of every request that has some, in replay-row vocabulary."""
    parts = list(_recorded_parts(traces))
    if not parts:
        return pl.DataFrame(schema=_RECORDED_SCHEMA)
    return pl.concat(parts, how="vertical")


def _recorded_parts(
    traces: Sequence[tuple[str, Trace]], *, calls: bool = False
) -> Iterator[pl.DataFrame]:
    """`recorded`'s rows, one frame per session that logged usage; with `calls`, each
    followed by the rows of the session's logged compaction calls (`_compaction_calls`)."""
    for name, trace in traces:
        for i, session in enumerate(trace.sessions):
            r = session.requests
            used = np.flatnonzero(r["has_usage"])
            logged = _compaction_calls(name, i, session) if calls else None
            if not len(used):
                if logged is not None:
                    yield logged
                continue
            models = np.asarray(session.models, dtype=object)[r["model"][used]]
            part = pl.DataFrame(
                {
                    "trace": [name] * len(used),
                    "session_index": np.full(len(used), i, dtype=np.int32),
                    "request": used.astype(np.int32),
                    "model": models.tolist(),
                    "uncached_input": r["input"][used],
                    "cache_read": r["cache_read"][used],
                    "cache_write_5m": r["cache_write_5m"][used],
                    "cache_write_1h": r["cache_write_1h"][used],
                    "output": r["output"][used],
                },
                schema=_RECORDED_SCHEMA,
            )
            yield part if logged is None else pl.concat([part, logged])


def _compaction_calls(name: str, index: int, session: Session) -> pl.DataFrame | None:
    """The session's logged compaction calls (`Session.logged_calls`) as recorded rows (None
    without any): at the request of their compaction, on that request's model, as the
    replay prices a call made before a request (the compiled event does not keep the
    call's own model; the client sends it on the main loop's, which changes there only
    where the user switched model and compacted at once)."""
    calls = session.logged_calls()
    if not calls:
        return None
    model_of = session.requests["model"]
    rows: dict[str, list[Any]] = {c: [] for c in _RECORDED_SCHEMA}
    for k, (usage, _) in calls.items():
        rows["trace"].append(name)
        rows["session_index"].append(index)
        rows["request"].append(k)
        rows["model"].append(session.models[int(model_of[k])])
        for column, value in zip(TOKEN_COLUMNS, usage, strict=True):
            rows[column].append(value)
    return pl.DataFrame(rows, schema=_RECORDED_SCHEMA)
