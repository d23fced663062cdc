"""The replay engine: a compiled trace, a policy and a cache model in; one row per call out.

Open-loop replay (DESIGN.md section 3): the agent's recorded actions are replayed as they
were whatever the policy does. For each session, in trace time: the policy emits the calls
it makes before recorded request k (its own compactions, then the request), each priced at
once against the session's prompt cache; the request's response then joins the history
(it is in the history from k+1 on by construction of the trace).

With `ReplayOptions.refetch` the loop is semi-closed (simulator/refetch.py): each session
replays a copy with room for fetched-back reads, whose logical schedule the loop edits, and
the engine prices the rounds it inserts after the request that needed them (rows of kind
`refetch`, REFETCH_SCHEMA columns on every row).

With `loss` the same rows carry the loss proxies (simulator/loss.py, LOSS_SCHEMA), computed
as each call is priced from running totals over the view: one row type, one replay.

Rows are plain tuples while replaying (cheap) and become one polars frame at the end,
where dollars are computed for whole columns at once.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from simulator.history import History
from simulator.loss import LOSS_FACTS, LOSS_SCHEMA, SessionLoss
from simulator.model import Session, Trace
from simulator.models import facts, session_facts
from simulator.policy import Call, Edit, Emitter, Policy, SessionContext
from simulator.pricing import PriceBook, UnknownModelError, UnsupportedPricingError
from simulator.prompt_cache import (
    FIVE_MINUTES,
    ONE_HOUR,
    PromptCache,
    Response,
    Usage,
    for_provider,
)
from simulator.refetch import NO_CHANGE, RefetchParams, SessionLoop, params_for
from simulator.view import Breakpoint, View

#: Columns of requests.parquet, in order (definitions: reports/METRICS.md).
ROW_SCHEMA: dict[str, Any] = {
    "trace": pl.String,
    "session": pl.String,
    "session_index": pl.Int32,
    "request": pl.Int32,
    "call": pl.Int32,
    "kind": pl.String,
    "stage": pl.String,
    "ts_ms": pl.Int64,
    "model": pl.String,
    "context_tokens": pl.Int64,
    "uncached_input": pl.Int64,
    "cache_read": pl.Int64,
    "cache_write_5m": pl.Int64,
    "cache_write_1h": pl.Int64,
    "output": pl.Int64,
    "overflow": pl.Boolean,
    "breaker_trip": pl.Boolean,
    "threshold_tokens": pl.Int64,
    "blocking_tokens": pl.Int64,
    "edits": pl.Int32,
    "edit_tokens": pl.Int64,
}
#: Columns the semi-closed loop adds to every row (`--refetch`; absent in the open loop, so
#: its files stay as they were; definitions: reports/METRICS.md, "Re-fetch"), then
#: `refetch_cost`, the dollars of the inserted rounds.
REFETCH_SCHEMA: dict[str, Any] = {
    "refetch_calls": pl.Int32,
    "refetch_tokens": pl.Int64,
    "skipped_rereads": pl.Int32,
    "skipped_tokens": pl.Int64,
}
#: Columns of edits.parquet: one row per edit a policy made without a call (policy.Edit),
#: with the call it preceded (definitions: reports/METRICS.md).
EDIT_SCHEMA: dict[str, Any] = {
    "trace": pl.String,
    "session": pl.String,
    "session_index": pl.Int32,
    "request": pl.Int32,
    "call": pl.Int32,
    "stage": pl.String,
    "kind": pl.String,
    "tokens_removed": pl.Int64,
    "breaks_prefix": pl.Boolean,
}
COST_COLUMNS = (
    "cost_uncached_input",
    "cost_cache_read",
    "cost_cache_write_5m",
    "cost_cache_write_1h",
    "cost_output",
    "cost_total",
)


@dataclass(frozen=True)
class ReplayOptions:
    """Run-wide settings: the cache model ("auto": by each model's provider), the seed, and
    whether the semi-closed re-fetch loop runs (simulator/refetch.py; off: open loop)."""

    cache: str = "auto"
    seed: int = 0
    refetch: bool = False
    #: The loop's parameters for every session; None: each trace format's fit
    #: (simulator/refetch.py FITTED).
    refetch_params: RefetchParams | None = None


def session_root(session: Session, model: str) -> int:
    """Identity of the system + tools prefix: per session and model (caches are per model)."""
    digest = hashlib.blake2b(f"{session.id}\0{model}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def recorded_ttl(session: Session) -> list[int]:
    """The TTL each recorded request wrote with: 1 hour where it wrote 1-hour entries."""
    r = session.requests
    one_hour = (r["cache_write_1h"] > 0) & (r["cache_write_5m"] == 0)
    ttl: list[int] = np.where(one_hour, ONE_HOUR, FIVE_MINUTES).astype(np.int64).tolist()
    return ttl


def _seed_for(seed: int, trace: str, session: str) -> int:
    data = f"{seed}\0{trace}\0{session}".encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


class _SessionEngine(Emitter):
    """Prices a session's calls against its cache and collects their rows."""

    def __init__(
        self, trace: str, index: int, session: Session, cache: str, rows: list[Any]
    ) -> None:
        self.trace = trace
        self.index = index
        self.session = session
        self.session_id = session.id
        self.cache_option = cache
        self.observe: Observer | None = None
        #: One cache per model: a provider never serves one model's cache to another.
        self.caches: dict[int, PromptCache] = {}
        #: Prefixes cached before the session began, seeded into each model's cache.
        self.warmed: list[tuple[list[int], int, int, int]] = []
        self.rows = rows
        self.ts: list[int] = session.requests["ts"].tolist()
        self.ts_end: list[int] = session.requests["ts_end"].tolist()
        self.model_names = [session.models[m] for m in session.requests["model"].tolist()]
        self.model_index: list[int] = session.requests["model"].tolist()
        self.k = 0
        self.seq = 0
        #: Edits the policy made since its last call, and every edit's row (EDIT_SCHEMA).
        self.pending: list[Edit] = []
        self.edit_rows: list[tuple[Any, ...]] | None = None
        #: The policy's stated limits for the current request (SessionPolicy.limits).
        self.threshold: int | None = None
        self.blocking: int | None = None
        #: The semi-closed loop (simulator/refetch.py), None in the open loop.
        self.loop: SessionLoop | None = None
        self.windows: dict[str, int] = {}
        #: The loss proxies of every call (simulator/loss.py), None without them.
        self.loss: SessionLoss | None = None
        #: First and end history block of each request's output (`_response`), on demand.
        self.output_blocks: tuple[list[int], list[int]] | None = None

    @property
    def cache(self) -> PromptCache:
        m = self.model_index[self.k]
        cache = self.caches.get(m)
        if cache is None:
            cache = self._new_cache(m)
        return cache

    def _new_cache(self, m: int) -> PromptCache:
        """The first call with model m: its own cache, with the warm shared prefixes."""
        model_facts = facts(self.session.models[m])
        provider = model_facts.provider if self.cache_option == "auto" else self.cache_option
        cache = self.caches[m] = for_provider(
            provider, model_facts.min_cache_tokens, self.session.models[m], self.ts[self.k]
        )
        for chains, tokens, since, ttl in self.warmed:
            cache.warm_entry(chains, tokens, since, ttl)
        return cache

    def warm(self, view: View, position: int, ttl_ms: int) -> None:
        """Shared prefixes are warm for every model the session uses (other sessions with
        the same system prompt use the same models)."""
        spec = (view.chains[: position + 1], view.cum[position], self.ts[self.k], ttl_ms)
        self.warmed.append(spec)
        for cache in self.caches.values():
            cache.warm_entry(*spec)

    def written(
        self, view: View, position: int, at_ms: int, ttl_ms: int, done_ms: int | None = None
    ) -> None:
        """An unlogged request of the client wrote this model's cache (not priced)."""
        self.cache.warm(view, position, at_ms, ttl_ms, done_ms)

    def edit(self, edit: Edit) -> None:
        self.pending.append(edit)

    def call(self, view: View, call: Call) -> None:
        loop = self.loop
        if loop is None:
            self._price(view, call, self.ts[self.k], call.output_tokens, None)
            return
        k = self.k
        decision = loop.decide(k, view) if call.kind == "request" else NO_CHANGE
        output = max(0, call.output_tokens - decision.skipped_output)
        self._price(
            view, call, self.ts[k], output, (0, 0, decision.skipped, decision.skipped_tokens)
        )
        if decision.ids:
            fetched = view.copy()
            fetched.extend_items(decision.ids, decision.hashes, decision.tokens)
            marks = call.breakpoints
            if marks:
                end = Breakpoint(len(fetched.ids) - 1, marks[-1].ttl_ms)
                marks = [*(marks[:3] if len(marks) >= 4 else marks), end]
            inserted = Call("refetch", "refetch", marks, decision.round_output, cached=call.cached)
            if fetched.total > self._window(k):  # the read made it too large to send
                inserted.flags = {"overflow": True}
            self._price(
                fetched,
                inserted,
                self.ts_end[k],
                decision.round_output,
                (1, decision.fetched, 0, 0),
            )

    def _response(self, k: int, output: int) -> Response:
        """What request k generates, for a cache that holds responses: its output tokens
        and the history blocks holding that output (those whose origin is k)."""
        if self.output_blocks is None:
            origin = np.asarray(self.session.blocks["origin"], dtype=np.int64)
            n = self.session.n_requests
            ids = np.flatnonzero((origin >= 0) & (origin < n))
            starts = np.full(n, len(origin), dtype=np.int64)
            ends = np.zeros(n, dtype=np.int64)  # start >= end: no output blocks
            np.minimum.at(starts, origin[ids], ids)
            np.maximum.at(ends, origin[ids], ids + 1)
            self.output_blocks = (starts.tolist(), ends.tolist())
        first, end = self.output_blocks
        return Response(output, first[k], end[k])

    def _window(self, k: int) -> int:
        """The context window of request k's model, as the policies are told it."""
        name = self.model_names[k]
        window = self.windows.get(name)
        if window is None:
            window = self.windows[name] = session_facts(self.session, name).window
        return window

    def _price(
        self,
        view: View,
        call: Call,
        now: int,
        output: int,
        extra: tuple[int, int, int, int] | None,
    ) -> None:
        """Price one call sent at `now` and append its row (with the re-fetch columns,
        REFETCH_SCHEMA, when the loop runs, then the loss proxies when asked).

        The per-call path of every replay: one tuple per row, attributes read once. A call
        the recording timed itself (`Call.at_ms`) is sent and done at its own times."""
        k = self.k
        done = self.ts_end[k]
        if call.at_ms is not None:
            now, done = call.at_ms
        if call.cached:
            m = self.model_index[k]
            cache = self.caches.get(m)
            if cache is None:
                cache = self._new_cache(m)
            response = None
            if cache.holds_responses and call.kind == "request":
                response = self._response(k, output)
            usage = cache.request(view, call.breakpoints, now, done, response)
        else:
            usage = Usage(view.total, 0, 0, 0)
        if self.observe is not None:
            self.observe(self.index, k, view, call, usage)
        loss = self.loss
        if loss is not None:  # resent_tokens is computed for whole columns, in `replay`
            facts = loss.facts(k, view, call)
            tail: tuple[Any, ...] = facts if extra is None else (*extra, *facts)
        else:
            tail = () if extra is None else extra
        flags = call.flags
        pending = self.pending
        cum = view.cum
        row: tuple[Any, ...] = (
            self.trace,
            self.session_id,
            self.index,
            k,
            self.seq,
            call.kind,
            call.stage,
            now,
            self.model_names[k],
            cum[-1] if cum else 0,
            *usage,
            output,
            flags.get("overflow", False) if flags else False,
            flags.get("breaker_trip", False) if flags else False,
            self.threshold,
            self.blocking,
            len(pending),
            sum(e.tokens_removed for e in pending) if pending else 0,
            *tail,
        )
        self.rows.append(row)
        if pending:
            if self.edit_rows is not None:
                trace, session, index, seq = self.trace, self.session_id, self.index, self.seq
                self.edit_rows.extend(
                    (
                        trace,
                        session,
                        index,
                        k,
                        seq,
                        e.stage,
                        e.kind,
                        e.tokens_removed,
                        e.breaks_prefix,
                    )
                    for e in pending
                )
            self.pending = []
        self.seq += 1


#: Sees every call as it is priced: (session index, request, the view sent, the call, its
#: usage). For tests and metrics that need the views themselves (rows hold only numbers).
Observer = Callable[[int, int, View, Call, Usage], None]


def session_context(trace_name: str, session: Session, options: ReplayOptions) -> SessionContext:
    """What a policy replaying `session` (at least one request) may know about it."""
    model = session.models[int(session.requests["model"][0])]
    return SessionContext(
        session=session,
        history=History(session),
        facts=session_facts(session, model),
        rng=random.Random(_seed_for(options.seed, trace_name, session.id)),
        ts=session.requests["ts"].tolist(),
        ts_end=session.requests["ts_end"].tolist(),
        models=[session.models[m] for m in session.requests["model"].tolist()],
        recorded_ttl=recorded_ttl(session),
        output=session.requests["output"].tolist(),
        root=session_root(session, model),
    )


def replay_session(
    trace_name: str,
    index: int,
    session: Session,
    policy: Policy,
    options: ReplayOptions,
    rows: list[Any],
    observe: Observer | None = None,
    edits: list[Any] | None = None,
    fmt: str = "",
    loss: bool = False,
) -> None:
    """Replay one session of a trace of format `fmt`, appending its rows (with the loss
    proxies when `loss`; its edits' rows to `edits`)."""
    n = session.n_requests
    if n == 0:
        return
    loop = None
    if options.refetch:
        params = options.refetch_params or params_for(fmt)
        loop = SessionLoop(trace_name, session, options.seed, params)
    replayed = loop.session if loop is not None else session
    ctx = session_context(trace_name, replayed, options)
    if loop is not None:
        loop.attach(ctx.history)
        begin = getattr(observe, "begin", None)
        if begin is not None:  # an observer that looks blocks up (simulator/loss.py)
            begin(index, loop)
    state = policy.session(ctx)
    engine = _SessionEngine(trace_name, index, replayed, options.cache, rows)
    engine.observe = observe
    engine.loop = loop
    engine.edit_rows = edits
    if loss:
        history = ctx.history
        engine.loss = SessionLoss(replayed, history.hashes, history.tokens, loop)
    step, limits_of = state.step, state.limits
    for k in range(n):
        engine.k = k
        engine.seq = 0
        limits = limits_of()
        if limits is None:
            engine.threshold = engine.blocking = None
        else:
            engine.threshold, engine.blocking = limits.threshold, limits.blocking
        step(k, engine)


def replay(
    traces: list[tuple[str, Trace]],
    policy: Policy,
    options: ReplayOptions | None = None,
    prices: PriceBook | None = None,
    observe: Observer | None = None,
    edits: list[Any] | None = None,
    loss: bool = False,
) -> pl.DataFrame:
    """Every session of every trace under `policy`: one row per call, priced, with the
    loss proxies (simulator/loss.py LOSS_SCHEMA, the last columns) when `loss`. Given a
    list `edits`, the policy's edits (EDIT_SCHEMA tuples) are appended to it."""
    opts = options or ReplayOptions()
    rows: list[Any] = []
    # Replay allocates many short-lived objects and no cycles: the cyclic collector would
    # only rescan them (about a third of the time); reference counting frees them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name, trace in traces:
            for i, session in enumerate(trace.sessions):
                replay_session(
                    name, i, session, policy, opts, rows, observe, edits, trace.format, loss
                )
    finally:
        if collecting:
            gc.enable()
    schema = {**ROW_SCHEMA, **REFETCH_SCHEMA} if opts.refetch else ROW_SCHEMA
    row_schema = {**schema, **LOSS_FACTS} if loss else schema
    columns, data = _columns(rows, row_schema, policy)
    # The loss proxies go last, after the dollars (requests.parquet's column order).
    lost = {c: data.pop(c) for c in LOSS_FACTS} if loss else {}
    n = len(rows)
    names = list(schema)
    counts = {
        c: np.fromiter(columns[names.index(c)], dtype=np.int64, count=n)
        for c in ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
    }
    data.update(
        _cost_series(list(columns[names.index("model")]), counts, prices or default_prices())
    )
    if opts.refetch:
        inserted = np.fromiter(
            (kind == "refetch" for kind in columns[names.index("kind")]), dtype=np.bool_, count=n
        )
        # A failed (overflowing) round is billed nothing (outputs.bill_failed), so it costs 0.
        inserted &= ~np.fromiter(columns[names.index("overflow")], dtype=np.bool_, count=n)
        total = data["cost_total"].to_numpy()  # NaN where unpriced
        data["refetch_cost"] = pl.Series(
            "refetch_cost", np.where(inserted, total, 0.0), pl.Float64, nan_to_null=True
        )
    if loss:  # on rows after a compaction, the prompt tokens not read from the cache
        after = lost["after_compaction"].to_numpy()
        fresh = counts["uncached_input"] + counts["cache_write_5m"] + counts["cache_write_1h"]
        lost["resent_tokens"] = pl.Series("resent_tokens", np.where(after, fresh, 0), pl.Int64)
        data.update((c, lost[c]) for c in LOSS_SCHEMA)
    return pl.DataFrame(data)


@functools.cache
def default_prices() -> PriceBook:
    """One price book per process: building one reads and checks the whole price table."""
    return PriceBook()


def add_costs(frame: pl.DataFrame, prices: PriceBook) -> pl.DataFrame:
    """Dollar columns for every row of a frame with the token columns and `model`."""
    counts = {
        c: frame[c].to_numpy().astype(np.int64)
        for c in ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
    }
    series = _cost_series(frame["model"].to_list(), counts, prices)
    return frame.with_columns(list(series.values()))


def _cost_series(
    models: list[str], counts: dict[str, Any], prices: PriceBook
) -> dict[str, pl.Series]:
    """Per-row dollars per component (null where the model has no known price)."""
    n = len(models)
    priced: list[str] = []
    for m in dict.fromkeys(models):
        try:
            prices.rates(m)
        except (UnknownModelError, UnsupportedPricingError):
            continue
        priced.append(m)
    if not priced:
        return {c: pl.Series(c, [None] * n, pl.Float64) for c in COST_COLUMNS}
    index = {m: i for i, m in enumerate(priced)}
    model_index = np.fromiter((index.get(m, -1) for m in models), dtype=np.int64, count=n)
    known = model_index >= 0
    safe_index = np.where(known, model_index, 0)

    def col(name: str) -> Any:
        return np.where(known, counts[name], 0)

    costs = prices.price_columns(
        priced,
        safe_index,
        col("uncached_input"),
        col("cache_read"),
        col("cache_write_5m"),
        col("cache_write_1h"),
        col("output"),
    )
    parts = ["uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "output"]
    out = {}
    all_known = bool(known.all())
    for part, name in zip([*parts, "total"], COST_COLUMNS, strict=True):
        values = costs[part]
        if all_known:
            out[name] = pl.Series(name, values, pl.Float64)
        else:
            out[name] = pl.Series(name, np.where(known, values, np.nan)).fill_nan(None)
    return out


def edit_frame(edits: list[Any], policy: Policy) -> pl.DataFrame:
    """The edits table of one policy's replay (EDIT_SCHEMA, then policy and params_hash)."""
    return pl.DataFrame(_columns(edits, EDIT_SCHEMA, policy)[1])


def _columns(
    rows: list[Any], schema: dict[str, Any], policy: Policy
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """Row tuples as typed columns of `schema`, then the policy's label and params hash on
    every row; also the raw columns (for the dollars, computed from them)."""
    columns: list[tuple[Any, ...]] = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    data: dict[str, Any] = {
        name: pl.Series(name, col, dtype)
        for (name, dtype), col in zip(schema.items(), columns, strict=True)
    }
    spec = policy.spec()
    data["policy"] = pl.Series("policy", [spec.label] * len(rows), pl.String)
    data["params_hash"] = pl.Series("params_hash", [spec.param_hash] * len(rows), pl.String)
    return columns, data
