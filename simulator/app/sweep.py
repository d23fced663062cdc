"""Batch sweeps: the product of policies and parameter values, replayed over a trace set.

A *cell* is one policy spec (a policy with every parameter fixed) replayed over every
session of every trace: one task, one Parquet file. Per (spec, trace) tasks would balance
load more finely, but a cell over the whole trace set already takes tens of milliseconds
to seconds, a sweep has many more cells than workers, and one file per cell keeps the
dataset small and resume simple.

Layout of a sweep directory:

    DIR/sweep.json                                   the manifest
    DIR/data/policy=<label>/<params_hash>.parquet    one cell's rows
    DIR/cells.parquet                                one row per cell: grid values, figures

Readable by any Parquet tool with no option beyond hive partitioning (issue 15):
`pyarrow.dataset.dataset(DIR/data, partitioning="hive")`, `pyarrow.parquet.read_table`,
`polars.scan_parquet(..., hive_partitioning=True)`, DuckDB's `read_parquet(...,
hive_partitioning = true)`. So: the one partition column (`policy`) is only in the path,
never also inside the files (pyarrow refuses to merge the two: "large_string vs string");
the hash is the file's name and a column inside it, not a second partition level, because
readers guess a partition's type from its values and a 12-digit hash of digits only (one
cell in 280) is read as an integer, one with a lone "e" as a float; a policy label that a
reader would take for a number, a date or a truth value is refused for the same reason.
No column name holds a dot (`autocompact.buffer_tokens` is the column
`autocompact__buffer_tokens`, `column_name`), and times are timestamp[ms, UTC] (`ts`).

The rows are those of `simulator.run.rows` with the loss proxies (a sweep answers what a
setting costs *and* what it loses: issue 14), sorted.

Resume: a cell's file is written to a temporary name and renamed, so it exists only
complete; a rerun skips every cell whose file is there (and ends with the same bytes as
an uninterrupted run: files depend only on the spec, the traces and the run settings,
never on the executor, the worker count or the order cells finish in). The manifest,
cells.parquet and every chart are each written the same way, so a sweep killed at any
point leaves each file either as it was or whole and new. The manifest records the
settings, and a directory holding a sweep over other traces or settings is refused
rather than mixed.

Executors: a local process pool (the default) or Ray. Like any process pool, a script that
calls `run_sweep` must do so under `if __name__ == "__main__":` (workers import the main
module). Both load the traces once per
worker: the pool passes them to each worker's initializer (`ctxsim sweep` starts its pool
before it loads the traces and feeds each trace to the waiting workers as it is decoded:
`StartedPool`), Ray puts them in the object store once and hands the reference to one
actor per worker. A local worker writes each
cell's file itself and hands back its digest and figures (the manifest's and
cells.parquet's), so the driver reads no file back; a Ray worker returns the bytes as
well, which the driver writes, so Ray workers on other machines need no shared disk.
"""

from __future__ import annotations

import decimal
import hashlib
import io
import itertools
import multiprocessing
import os
import pickle
import re
import sys
import threading
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from simulator import policy as registry
from simulator import run as service
from simulator.app.files import atomic_write
from simulator.app.preload import fork_server_modules
from simulator.frames import (
    CELL_FIGURES,
    REFETCH_FIGURES,
    REQUEST_ORDER,
    _edit_aggs,
    _summary_aggs,
    as_written,
    ctxsim_version,
    has_loss,
    json_bytes,
    parquet_bytes,
    policy_entry,
    rules_versions,
    trace_entry,
)
from simulator.model import Trace
from simulator.policy import Policy, PolicyError, PolicySpec
from simulator.replay import default_prices
from simulator.variants import Variant, build_variant, load_variant
from simulator.workers import start_fork_server, worker_start

MANIFEST_FILE = "sweep.json"
CELLS_FILE = "cells.parquet"
DATA_DIR = "data"
#: The layout of sweep.json and data/ (2: the hash is the file name, not a partition).
FORMAT = "ctxsim-sweep 2"
EXECUTORS = ("process", "ray", "serial")
#: A range longer than this is a typo (0:1e9:1), not a grid.
MAX_VALUES = 100_000

NamedTraces = Sequence[tuple[str, Trace]]
#: ([POLICY:]KEY, value or values) as given: scope None applies to every selected policy.
Scoped = tuple[str | None, str, Any]


class SweepError(ValueError):
    """A bad grid, sweep file or sweep directory: one line for the user."""


# -- grid values ----------------------------------------------------------------------------

#: A number as people type it in a range: 8000, 13_000, 0.5, 1e3, or a size "8k" (x 1,000).
_NUMBER = r"[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?[kK]?"
_RANGE = re.compile(rf"\s*({_NUMBER})\s*:\s*({_NUMBER})\s*:\s*({_NUMBER})\s*")


def _json_or_text(text: str) -> Any:
    """A JSON value when the text is one (8000, true, null, "x"), else the text itself."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _decimal(text: str) -> decimal.Decimal:
    clean = text.strip().replace("_", "")
    if clean[-1:] in ("k", "K"):
        return decimal.Decimal(clean[:-1]) * 1000
    return decimal.Decimal(clean)


def _integral(text: str) -> bool:
    """Written as a whole number: 8000, 13_000, or a size in k that is whole (1.5k)."""
    clean = text.strip()
    if re.fullmatch(r"[-+]?[\d_]+", clean):
        return True
    if clean[-1:] not in ("k", "K"):
        return False
    value = _decimal(clean)
    return value == value.to_integral_value()


def range_values(start: str, stop: str, step: str) -> list[Any]:
    """START..STOP by STEP, STOP included when it lands on the grid.

    Exact decimal arithmetic, so 0.1:0.5:0.1 gives 0.1, 0.2, 0.3, 0.4, 0.5 and not
    0.30000000000000004; integers stay integers when all three are written as integers.
    """
    try:
        a, b, s = _decimal(start), _decimal(stop), _decimal(step)
    except decimal.InvalidOperation:
        raise SweepError(f"{start}:{stop}:{step}: not numbers") from None
    if not (a.is_finite() and b.is_finite() and s.is_finite()) or s <= 0:
        raise SweepError(f"{start}:{stop}:{step}: the step must be a positive number")
    if b < a:
        raise SweepError(f"{start}:{stop}:{step}: the range is empty (stop below start)")
    count = int((b - a) // s) + 1
    if count > MAX_VALUES:
        raise SweepError(f"{start}:{stop}:{step}: {count:,} values (at most {MAX_VALUES:,})")
    integral = all(_integral(t) for t in (start, stop, step))
    values = [a + i * s for i in range(count)]
    return [int(v) for v in values] if integral else [float(v) for v in values]


def parse_values(text: str) -> list[Any]:
    """`START:STOP:STEP`, a JSON array (`[1, [2, 3]]`), or `v1,v2,...` (each a JSON value
    or plain text). Repeated values are kept once, in order of first appearance."""
    raw = text.strip()
    if not raw:
        raise SweepError("no values")
    match = _RANGE.fullmatch(raw)
    if match:
        values = range_values(*match.groups())
    elif raw.startswith("["):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise SweepError(f"{raw}: not a JSON array") from None
        if not isinstance(parsed, list) or not parsed:
            raise SweepError(f"{raw}: expected a non-empty JSON array")
        values = parsed
    else:
        items = [item.strip() for item in raw.split(",")]
        if any(not item for item in items):
            raise SweepError(f"{raw}: an empty value in the list")
        values = [_json_or_text(item) for item in items]
    return _unique(values)


def _unique(values: Iterable[Any]) -> list[Any]:
    seen: set[bytes] = set()
    out = []
    for value in values:
        key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def split_key(text: str, what: str) -> tuple[str | None, str, str]:
    """`[POLICY:]KEY=REST` into (policy or None, key, rest)."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SweepError(f"{what} {text!r}: expected [POLICY:]KEY=VALUES")
    scope: str | None = None
    if ":" in key:
        scope, key = (part.strip() for part in key.split(":", 1))
        if not scope or not key:
            raise SweepError(f"{what} {text!r}: expected POLICY:KEY=VALUES")
    return scope, key, rest


def parse_grid(text: str) -> Scoped:
    """One `--grid [POLICY:]KEY=VALUES` option: (policy or None, key, list of values)."""
    scope, key, rest = split_key(text, "--grid")
    try:
        return scope, key, parse_values(rest)
    except SweepError as exc:
        raise SweepError(f"--grid {key}: {exc}") from None


# -- the sweep definition -------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep: policies (names or variant files), fixed parameters and the grid."""

    policies: tuple[str, ...] = ()
    params: tuple[Scoped, ...] = ()
    grid: tuple[Scoped, ...] = ()
    seed: int | None = None
    cache: str | None = None

    def merged(self, other: SweepConfig) -> SweepConfig:
        """`other` (the command line) over self (a sweep file): policies are added, a
        parameter or grid key given again is replaced, seed and cache override."""

        def over(base: tuple[Scoped, ...], top: tuple[Scoped, ...]) -> tuple[Scoped, ...]:
            keys = {(s, k) for s, k, _ in top}
            return (*(e for e in base if (e[0], e[1]) not in keys), *top)

        return SweepConfig(
            policies=tuple(dict.fromkeys((*self.policies, *other.policies))),
            params=over(self.params, other.params),
            grid=over(self.grid, other.grid),
            seed=other.seed if other.seed is not None else self.seed,
            cache=other.cache if other.cache is not None else self.cache,
        )

    def as_dict(self) -> dict[str, Any]:
        """The definition for the manifest (grid values in full, in order)."""

        def named(entries: tuple[Scoped, ...]) -> dict[str, Any]:
            return {(f"{s}:{k}" if s else k): v for s, k, v in entries}

        return {
            "policies": list(self.policies),
            "params": named(self.params),
            "grid": named(self.grid),
        }


def _file_values(name: str, value: Any) -> list[Any]:
    """A grid entry of a sweep file: an array, "START:STOP:STEP" or "a,b", a table
    {start, stop, step}, or one value."""
    if isinstance(value, list):
        if not value:
            raise SweepError(f"grid {name!r}: an empty list")
        return _unique(value)
    if isinstance(value, str):
        return parse_values(value)
    if isinstance(value, dict):
        if set(value) != {"start", "stop", "step"}:
            raise SweepError(f"grid {name!r}: a table needs exactly start, stop and step")
        return range_values(*(str(value[k]) for k in ("start", "stop", "step")))
    return [value]


def _scoped(name: str) -> tuple[str | None, str]:
    scope, sep, key = name.partition(":")
    return (scope, key) if sep else (None, name)


def load_sweep_file(path: Path) -> SweepConfig:
    """Read a TOML sweep file: `policies`, `seed`, `cache`, `[params]` and `[grid]`.

    Variant files named in `policies` are relative to the sweep file. Errors name the
    file and what is wrong.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepError(f"{path.name}: cannot read sweep file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path.name}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"policies", "params", "grid", "seed", "cache"})
    if unknown:
        raise SweepError(f"{path.name}: unknown key {unknown[0]!r} in sweep file")
    policies = data.get("policies", [])
    if isinstance(policies, str):
        policies = [policies]
    if not isinstance(policies, list) or not all(isinstance(p, str) for p in policies):
        raise SweepError(f"{path.name}: `policies` must be a list of names")
    resolved = [str(path.parent / p) if p.endswith(".toml") else p for p in policies]
    params, grid = data.get("params", {}), data.get("grid", {})
    if not isinstance(params, dict) or not isinstance(grid, dict):
        raise SweepError(f"{path.name}: [params] and [grid] must be tables")
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise SweepError(f"{path.name}: `seed` must be an integer")
    cache = data.get("cache")
    if cache is not None and not isinstance(cache, str):
        raise SweepError(f"{path.name}: `cache` must be a string")
    try:
        grid_entries = tuple((*_scoped(k), _file_values(k, v)) for k, v in grid.items())
    except SweepError as exc:
        raise SweepError(f"{path.name}: {exc}") from None
    return SweepConfig(
        policies=tuple(resolved),
        params=tuple((*_scoped(k), v) for k, v in params.items()),
        grid=grid_entries,
        seed=seed,
        cache=cache,
    )


# -- cells ----------------------------------------------------------------------------------


def _partition(value: str) -> str:
    """A hive partition value: percent-encoded where a path or a reader would trip."""
    return urllib.parse.quote(value, safe="@.+-_~")


#: Words a hive reader takes for a value of another type than text (polars reads "inf" and
#: "NaN" as floats, "true" as a boolean; DuckDB and pyarrow have their own lists).
_TYPED_WORDS = frozenset({"true", "false", "inf", "infinity", "nan", "null"})


def check_label(label: str) -> None:
    """Refuse a policy label a hive reader would not read back as text.

    Readers infer a partition column's type from its values: with every label of a sweep
    numeric-looking (a variant file `2024-01-01.toml`, `123.toml`), polars reads a date or
    an integer and pyarrow an int32 (it also reads 0x1f as 31). A label that starts with a
    letter and is none of the words above is text to all of them."""
    if not label[:1].isascii() or not label[:1].isalpha() or label.lower() in _TYPED_WORDS:
        raise SweepError(
            f"policy label {label!r}: a sweep's policy labels must start with a letter and not"
            " read as a number, a date or true/false (name the variant file or set its `name`)"
        )


def column_name(key: str) -> str:
    """A parameter's column in cells.parquet and trials.parquet: dots become `__`
    (`autocompact.buffer_tokens` -> `autocompact__buffer_tokens`), so SQL needs no
    quoting (issue 15)."""
    return key.replace(".", "__")


def column_names(keys: Iterable[str]) -> dict[str, str]:
    """Parameter -> column, refusing two parameters that would share a column."""
    names: dict[str, str] = {}
    taken: dict[str, str] = {}
    for key in keys:
        column = column_name(key)
        if column in taken and taken[column] != key:
            raise SweepError(f"parameters {taken[column]!r} and {key!r} share a column name")
        taken[column] = key
        names[key] = column
    return names


def cell_path(label: str, params_hash: str) -> str:
    """The file of the cell (label, params_hash), relative to the sweep directory."""
    return f"{DATA_DIR}/policy={_partition(label)}/{params_hash}.parquet"


@dataclass(frozen=True)
class Cell:
    """One policy spec of the sweep, with the grid values that made it."""

    spec: PolicySpec
    #: (key, value) of every grid parameter of this cell, in grid order.
    values: tuple[tuple[str, Any], ...]
    #: (key, value) the policy would have without the grid (its shipped value), per key.
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.spec.label, self.spec.param_hash)

    @property
    def path(self) -> str:
        """The cell's file, relative to the sweep directory."""
        return cell_path(*self.key)

    def entry(self) -> dict[str, Any]:
        """What the manifest says about the cell."""
        return {
            "policy": self.spec.label,
            "params_hash": self.spec.param_hash,
            "grid": dict(self.values),
            "defaults": dict(self.defaults),
            "spec": policy_entry(self.spec),
            "path": self.path,
        }


def _base(name: str, variants: dict[str, Variant]) -> type[Policy]:
    return registry.get(variants[name].extends if name in variants else name)


def _applies(scope: str | None, key: str, name: str, cls: type[Policy], alone: bool) -> bool:
    """Whether a parameter goes to this policy: scoped to it, or unscoped and either the
    only policy (so a typo fails there with a hint) or one that has the parameter."""
    return scope == name or (scope is None and (alone or key in cls.defaults))


def build_cells(config: SweepConfig) -> list[Cell]:
    """Every cell of the sweep: per policy, the product of the grid values that apply to
    it; each built once, so a bad parameter fails here with a did-you-mean hint."""
    names = list(config.policies) or ["claude-code"]
    variants: dict[str, Variant] = {}
    labels = []
    try:
        for name in names:
            if name.endswith(".toml"):
                variant = load_variant(Path(name))
                variants[variant.name] = variant
                labels.append(variant.name)
            else:
                labels.append(name)
        labels = list(dict.fromkeys(labels))
        for label in labels:
            check_label(label)
        classes = {name: _base(name, variants) for name in labels}
        alone = len(labels) == 1
        for scope, key, value in (*config.params, *config.grid):
            if scope is not None and scope not in classes:
                raise SweepError(f"{scope}:{key}: policy {scope!r} is not selected")
            if scope is None and not any(key in c.defaults for c in classes.values()):
                if alone:
                    continue  # building it below fails with the hint
                cls = next(iter(classes.values()))
                cls(**{key: value if not isinstance(value, list) else value[0]})
        cells: dict[tuple[str, str], Cell] = {}
        for name in labels:
            cls = classes[name]
            fixed = {k: v for s, k, v in config.params if _applies(s, k, name, cls, alone)}
            axes = [(k, v) for s, k, v in config.grid if _applies(s, k, name, cls, alone)]
            # The policy as it is without the grid, its values parsed ("8k" is 8000).
            if name in variants:
                shipped = build_variant(variants[name], fixed).params
            else:
                shipped = registry.build(name, fixed).params
            defaults = tuple((k, shipped.get(k)) for k, _ in axes)
            for combo in itertools.product(*(values for _, values in axes)):
                values = tuple(zip((k for k, _ in axes), combo, strict=True))
                params = {**fixed, **dict(values)}
                if name in variants:
                    built = build_variant(variants[name], params)
                else:
                    built = registry.build(name, params)
                # The grid values as the policy parsed them ("8k" is 8000 in the manifest).
                typed = tuple((k, built.params[k]) for k, _ in values)
                cell = Cell(built.spec(), typed, defaults)
                cells.setdefault(cell.key, cell)
    except PolicyError as exc:
        raise SweepError(str(exc)) from None
    return list(cells.values())


# -- workers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellOutput:
    """What a worker hands back for one cell: the file's bytes (none where the worker wrote
    the file itself), what the manifest and cells.parquet say of it, and a few figures."""

    key: tuple[str, str]
    data: bytes
    rows: int
    requests: int
    seconds: float
    pid: int
    #: The worker's peak resident memory so far, in bytes.
    peak_rss: int
    #: The file's SHA-256 (hex), as the manifest records it.
    sha256: str = ""
    #: The cell's row of cells.parquet after its grid values: `row_figures` of the file.
    figures: pl.DataFrame | None = None
    #: The worker wrote the file into the sweep directory (`data` is then empty).
    written: bool = False


def peak_rss_bytes() -> int:
    """This process's peak resident set size (ru_maxrss: KiB on Linux, bytes on macOS;
    0 where there is no `resource` module)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Worker:
    """Replays cells over traces it holds: made once per worker process or Ray actor.

    With `out` (a sweep directory on this machine) the worker writes each cell's file
    there itself, and with every executor it digests the file and sums its figures
    (`row_figures`): work each worker does beside the others, where the driver did it
    after the last cell, one file after another (issue 16: 0.2-0.3 s of a 20-cell sweep's
    serial part). A Ray worker, maybe on another machine, returns the bytes instead."""

    def __init__(
        self, traces: NamedTraces, settings: service.RunSettings, out: Path | None = None
    ) -> None:
        self.traces = list(traces)
        self.settings = settings
        self.out = out
        registry.names()  # discover the registered names now (the modules load as they build)

    def run(self, spec: PolicySpec) -> CellOutput:
        start = time.perf_counter()
        built = registry.from_spec(spec)
        frame = service.rows(self.traces, built, self.settings, default_prices())
        data = parquet_bytes(cell_file_frame(frame))
        requests = int((frame["kind"] == "request").sum())
        # The figures of the file as written, read back as `cells_frame` reads a file of
        # an earlier run: the same bits either way.
        figures = row_figures(pl.read_parquet(io.BytesIO(data)))
        digest = hashlib.sha256(data).hexdigest()
        if self.out is not None:
            atomic_write(self.out / cell_path(spec.label, spec.param_hash), data)
        return CellOutput(
            key=(spec.label, spec.param_hash),
            data=b"" if self.out is not None else data,
            rows=frame.height,
            requests=requests,
            seconds=time.perf_counter() - start,
            pid=os.getpid(),
            peak_rss=peak_rss_bytes(),
            sha256=digest,
            figures=figures,
            written=self.out is not None,
        )


def cell_file_frame(rows: pl.DataFrame) -> pl.DataFrame:
    """A cell's rows as its file holds them: sorted, without the partition column
    (`policy` is in the path), and `ts_ms` as `ts`, a timestamp[ms, UTC] (issue 15)."""
    return as_written(rows.sort(list(REQUEST_ORDER)).drop("policy"))


_WORKER: Worker | None = None


def _init_worker(traces: bytes | Any, options: service.RunSettings, out: Path | None) -> None:
    """Process-pool initializer: the traces arrive once per worker, never per cell, pickled
    once by the parent for all workers: as an argument (`_process_pool`), or, for a pool
    started before they were loaded, trace by trace from a feed (`StartedPool`)."""
    global _WORKER
    worker_start()  # Ctrl-C as usual, and never outlive the sweep (simulator/workers.py)
    data = pickle.loads(traces) if isinstance(traces, bytes) else _received(*traces)
    # Stopped before the traces came: no worker, and every cell handed to this process
    # fails at once (an initializer that raised would print its traceback).
    _WORKER = None if data is None else Worker(data, options, out)


def _received(claims: Any, feeds: Sequence[Any]) -> list[tuple[str, Trace]] | None:
    """This worker's feed (one per worker: `StartedPool`), read to its end: each trace is
    unpickled as it comes (in batches: `FEED_BATCH`), while the parent loads the next; the
    last message names the sweep's traces, in order, by the number each was fed under."""
    got: dict[int, Trace] = {}
    try:
        feed = feeds[claims.get()]
        while True:
            message = feed.get()
            if message is None:  # the sweep stopped first (`StartedPool.close`)
                return None
            kind, payload = message
            if kind == "go":
                return [(name, got[number]) for name, number in payload]
            got.update((number, pickle.loads(data)) for number, data in payload)
    except KeyboardInterrupt:  # Ctrl-C reaches the waiting workers too: stop quietly
        return None


def _run_in_worker(spec: PolicySpec) -> CellOutput:
    if _WORKER is None:
        raise SweepError("the sweep stopped before its traces were loaded")
    return _WORKER.run(spec)


def start_method() -> str:
    """forkserver where there is one, else spawn; never plain fork.

    A process forked from a parent that has used polars inherits polars' thread pool in
    a state whose threads do not exist and can hang on its first parallel operation
    (tests and the CLI use polars before they sweep). The fork server is a fresh
    interpreter, so its children start clean, yet fast: they are forked from it with the
    engine and the registered policies already imported.
    """
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _preload() -> list[str]:
    """Modules the fork server imports once for all workers (simulator/app/preload.py)."""
    return fork_server_modules()


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context(start_method())
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(_preload())
    return context


def default_workers() -> int:
    """Every core this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


Execute = Callable[[list[PolicySpec]], Iterator[CellOutput]]


def _serial(traces: NamedTraces, options: service.RunSettings, out: Path | None) -> Execute:
    def run(specs: list[PolicySpec]) -> Iterator[CellOutput]:
        worker = Worker(traces, options, out)
        for spec in specs:
            yield worker.run(spec)

    return run


def _pickled(traces: NamedTraces) -> bytes:
    """The traces as every worker receives them: pickled once here, for all workers (a
    pool would pickle its initializer's arguments again for each worker it starts, one
    after the other: 0.1 s each for the shared Claude Code corpus)."""
    return pickle.dumps(list(traces), protocol=pickle.HIGHEST_PROTOCOL)


def _results(
    pool: ProcessPoolExecutor, futures: dict[Future[CellOutput], PolicySpec]
) -> Iterator[CellOutput]:
    """Each cell's output as it finishes (those finished together in cell order); a cell
    that failed stops the sweep with its error."""
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=lambda f: _order(futures[f])):
            try:
                yield future.result()
            except Exception as exc:
                raise SweepError(_cell_failure(futures[future], exc)) from exc


def _process_pool(
    traces: NamedTraces, options: service.RunSettings, workers: int, out: Path | None
) -> Execute:
    def run(specs: list[PolicySpec]) -> Iterator[CellOutput]:
        if not specs:
            return
        context = _context()
        start_fork_server(context)  # deaf to Ctrl-C while it imports (simulator/workers.py)
        pool = ProcessPoolExecutor(
            max_workers=min(workers, len(specs)),
            mp_context=context,
            initializer=_init_worker,
            initargs=(_pickled(traces), options, out),
        )
        try:
            yield from _results(pool, {pool.submit(_run_in_worker, s): s for s in specs})
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return run


#: Pickled bytes of traces sent to the started workers at a time (`StartedPool.feed`). Sent
#: one by one (178 messages per worker for the shared Claude Code corpus, 4 MB pickled),
#: the queues' threads took the interpreter lock from the loading 356 times: loading the
#: corpus from a warm cache while feeding a 2-worker pool took 0.15-0.3 s more CPU than
#: without (3 rounds each, interleaved); in batches of 1 MiB, 0.0-0.05 s more. The workers
#: still unpickle all but the last batch while the rest loads (the last, a few ms, after
#: `give`).
FEED_BATCH = 1 << 20


class StartedPool:
    """A process pool started before the sweep's traces are loaded, for the cells `specs`.

    Issue 16: handing the workers the traces after they were all loaded, the pool then
    forking each worker from the fork server and each unpickling the whole list, took
    0.07-0.11 s from the manifest to the first cell and 0.09-0.17 s to the second
    worker's (`ctxsim sweep` of the shared Claude Code corpus, 2 workers, timestamps
    around the phases; load 0.3-1; medians of 4 rounds at load 2.4: 0.10 and 0.17 s);
    started here, 0.02 and 0.025 s (the same 4 rounds, interleaved). Here a
    thread hands the cells to the pool, which forks the workers as soon as the fork server
    is ready, while the caller loads the traces; each trace is fed to every worker as it
    is loaded (`feed`, pickled once) and unpickled there while the next loads; `give`
    names the sweep's traces once the manifest is written (`run_sweep`), so no cell is
    computed before that, and the workers start at once. `close` ends the pool whether or
    not the traces were given."""

    def __init__(
        self,
        specs: Sequence[PolicySpec],
        options: service.RunSettings,
        workers: int,
        out: Path | None,
    ) -> None:
        self.specs = list(specs)
        self.options = options
        self._count = max(1, min(workers or default_workers(), len(self.specs)))
        context = _context()
        start_fork_server(context)  # deaf to Ctrl-C while it imports (simulator/workers.py)
        # One feed per worker (each must read every trace), claimed by number.
        self._claims: Any = context.Queue()
        self._feeds: list[Any] = [context.Queue() for _ in range(self._count)]
        for number in range(self._count):
            self._claims.put(number)
        for queue in (self._claims, *self._feeds):
            # A worker that died never reads its feed: the interpreter's exit must not
            # wait for the queue's thread to write it.
            queue.cancel_join_thread()
        self._pool = ProcessPoolExecutor(
            max_workers=self._count,
            mp_context=context,
            initializer=_init_worker,
            initargs=((self._claims, self._feeds), options, out),
        )
        self._fed: dict[int, tuple[int, Trace]] = {}  # id(trace) -> (number, trace)
        self._batch: list[tuple[int, bytes]] = []
        self._batch_bytes = 0
        self._futures: dict[Future[CellOutput], PolicySpec] = {}
        self._failed: BaseException | None = None
        self._given = False
        self._closed = False
        # Submitting forks the workers, and a fork waits for the fork server's imports.
        self._submitter = threading.Thread(target=self._submit, daemon=True)
        self._submitter.start()

    def _submit(self) -> None:
        try:
            for spec in self.specs:
                self._futures[self._pool.submit(_run_in_worker, spec)] = spec
        except BaseException as exc:  # handed to the caller by `results`
            self._failed = exc

    def feed(self, trace: Trace) -> None:
        """Send every worker one loaded trace now (each trace once)."""
        if id(trace) in self._fed or self._given:
            return
        number = len(self._fed)
        self._fed[id(trace)] = (number, trace)  # held, so that its id stays its own
        data = pickle.dumps(trace, protocol=pickle.HIGHEST_PROTOCOL)
        self._batch.append((number, data))
        self._batch_bytes += len(data)
        if self._batch_bytes >= FEED_BATCH:
            self._send_batch()

    def _send_batch(self) -> None:
        if self._batch:
            for queue in self._feeds:
                queue.put(("traces", self._batch))
        self._batch, self._batch_bytes = [], 0

    def give(self, traces: NamedTraces) -> None:
        """The sweep's traces, in order: those not fed yet are sent now, then the list."""
        if self._given:
            return
        for _, trace in traces:
            self.feed(trace)
        self._send_batch()
        names = [(name, self._fed[id(trace)][0]) for name, trace in traces]
        for queue in self._feeds:
            queue.put(("go", names))
        self._given = True

    def results(self) -> Iterator[CellOutput]:
        """Each cell's output as it finishes; the pool is closed at the end."""
        try:
            self._submitter.join()
            if self._failed is not None:
                raise SweepError(f"the worker pool failed to start: {self._failed}")
            yield from _results(self._pool, self._futures)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the pool: workers still waiting for traces are told to stop."""
        if self._closed:
            return
        self._closed = True
        self._submitter.join()
        if not self._given:
            for queue in self._feeds:
                queue.put(None)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for queue in (self._claims, *self._feeds):
            queue.close()
        self._fed.clear()


def start_pool(
    specs: Sequence[PolicySpec],
    options: service.RunSettings,
    workers: int = 0,
    out: Path | None = None,
) -> StartedPool:
    """A local process pool for `specs`, started now (see `StartedPool`)."""
    return StartedPool(specs, options, workers, out)


def _order(spec: PolicySpec) -> tuple[str, str]:
    return (spec.label, spec.param_hash)


def _cell_failure(spec: PolicySpec, exc: BaseException) -> str:
    return f"cell {spec.label} {spec.param_hash} failed: {type(exc).__name__}: {exc}"


class RayWorker(Worker):
    """A Worker as a Ray actor (made remote when Ray is used, so Ray stays optional)."""


def _ray(
    traces: NamedTraces, options: service.RunSettings, workers: int, address: str | None
) -> Execute:
    def run(specs: list[PolicySpec]) -> Iterator[CellOutput]:
        if not specs:
            return
        try:
            import ray  # type: ignore[import-not-found,unused-ignore]
            from ray.util import ActorPool  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise SweepError("--executor ray needs Ray: pip install 'ctxsim[ray]'") from None
        started = not ray.is_initialized()
        if started:
            kwargs: dict[str, Any] = {
                "address": address,
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": "error",
            }
            if address is None and workers:
                kwargs["num_cpus"] = workers
            ray.init(**kwargs)
        actors: list[Any] = []
        try:
            resources = ray.cluster_resources()  # type: ignore[no-untyped-call,unused-ignore]
            cpus = max(1, int(resources.get("CPU", 1)))
            count = min(workers, cpus) if workers else cpus  # an actor per CPU, at most
            shared = ray.put(list(traces))  # once, in the object store
            actor = ray.remote(num_cpus=1)(RayWorker)
            # Ray hands each actor the stored traces (a top-level reference is resolved).
            actors = [actor.remote(shared, options) for _ in range(min(count, len(specs)))]
            pool = ActorPool(actors)
            for spec in specs:
                pool.submit(lambda a, s: a.run.remote(s), spec)
            while pool.has_next():  # type: ignore[no-untyped-call,unused-ignore]
                try:
                    out: CellOutput = pool.get_next_unordered()
                except Exception as exc:
                    raise SweepError(f"a cell failed on Ray: {exc}") from exc
                yield out
        finally:
            for a in actors:
                ray.kill(a)
            if started:
                ray.shutdown()

    return run


def executor(
    name: str,
    traces: NamedTraces,
    options: service.RunSettings,
    *,
    workers: int = 0,
    address: str | None = None,
    out: Path | None = None,
) -> Execute:
    """The function that runs cells: `process` (default), `ray`, or `serial` (here). With
    `out`, a local executor's workers write each cell's file into that sweep directory;
    Ray's return the bytes (its workers may have no access to the driver's disk)."""
    if name == "serial":
        return _serial(traces, options, out)
    if name == "process":
        return _process_pool(traces, options, workers or default_workers(), out)
    if name == "ray":
        return _ray(traces, options, workers, address)
    raise SweepError(f"unknown executor {name!r} (one of {', '.join(EXECUTORS)})")


# -- the sweep directory --------------------------------------------------------------------


def is_complete(path: Path) -> bool:
    """A finished cell file: Parquet magic at both ends (renamed into place only whole;
    this also catches a file truncated by something other than ctxsim)."""
    try:
        size = path.stat().st_size
        if size < 12:
            return False
        with path.open("rb") as fh:
            head = fh.read(4)
            fh.seek(-4, os.SEEK_END)
            tail = fh.read(4)
    except OSError:
        return False
    return head == tail == b"PAR1"


def remove_leftovers(out: Path) -> int:
    """Temporary files of a sweep that was killed mid-write; returns how many."""
    removed = 0
    data = out / DATA_DIR
    if data.is_dir():
        for tmp in data.rglob(".*.tmp"):
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


@dataclass(frozen=True)
class SweepSettings:
    """What, beside a cell's spec, its rows depend on: equal settings, equal files."""

    traces: NamedTraces
    seed: int = 0
    cache: str = "auto"
    lenient: bool = False
    #: Replay with the re-fetch model (simulator/run.py RunSettings.refetch) or open loop.
    refetch: bool = False

    @property
    def run_settings(self) -> service.RunSettings:
        return run_settings(self.seed, self.cache, self.refetch)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ctxsim_version": ctxsim_version(),
            "prices": default_prices().version,
            **rules_versions(),
            "seed": self.seed,
            "cache": self.cache,
            "refetch": self.refetch,
            "lenient": self.lenient,
            "traces": [trace_entry(name, trace) for name, trace in self.traces],
        }


def run_settings(seed: int, cache: str, refetch: bool) -> service.RunSettings:
    """The run service's settings for a sweep or a study: open loop, or the re-fetch model
    (simulator/refetch.py) when `refetch`."""
    return service.RunSettings(seed=seed, cache=cache, refetch=refetch)


def _read_manifest(out: Path) -> dict[str, Any] | None:
    path = out / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SweepError(f"{path}: not a sweep manifest ({exc})") from None
    if not isinstance(data, dict) or "settings" not in data:
        raise SweepError(f"{path}: not a sweep manifest")
    return data


def _settings_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    for key in new:
        if old.get(key) != new[key]:
            return key
    return None


def plan_manifest(
    out: Path, cells: Sequence[Cell], config: SweepConfig, settings: SweepSettings
) -> dict[str, Any]:
    """The manifest for `out`: a new one, or the existing one extended by this sweep's
    cells and grid. A directory swept with other settings is refused."""
    wanted = settings.as_dict()
    old = _read_manifest(out)
    grids: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    if old is not None:
        if old.get("format") != FORMAT:
            raise SweepError(
                f"{out} holds a sweep of an older layout ({old.get('format')}); "
                "sweep into another directory"
            )
        differs = _settings_difference(old["settings"], wanted)
        if differs is not None:
            raise SweepError(
                f"{out} holds a sweep with other {differs.replace('_', ' ')}; "
                "sweep into another directory"
            )
        grids = list(old.get("grids", []))
        entries = list(old.get("cells", []))
    grid = config.as_dict()
    if grid not in grids:
        grids.append(grid)
    known = {(e["policy"], e["params_hash"]) for e in entries}
    entries += [c.entry() for c in cells if c.key not in known]
    return {
        "format": FORMAT,
        "settings": wanted,
        "grids": grids,
        "dataset": {
            "path": DATA_DIR,
            "partitioning": ["policy", "params_hash"],
            "files": f"{DATA_DIR}/policy=*/*.parquet",
        },
        "cells": entries,
    }


def final_manifest(
    out: Path,
    manifest: dict[str, Any],
    computed: Mapping[tuple[str, str], CellOutput] | None = None,
) -> dict[str, Any]:
    """The manifest with every finished cell's row count and file digest: as the workers
    reported them for the cells `computed` now, read from disk for the others (so a
    resumed sweep ends with the same manifest as an uninterrupted one)."""
    computed = computed or {}
    cells = []
    for entry in manifest["cells"]:
        path = out / entry["path"]
        done = computed.get((entry["policy"], entry["params_hash"]))
        entry = {k: v for k, v in entry.items() if k not in ("rows", "sha256")}
        if done is not None:
            entry["sha256"] = done.sha256
            entry["rows"] = done.rows
        elif is_complete(path):
            data = path.read_bytes()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            entry["rows"] = _rows(path)
        cells.append(entry)
    return {**manifest, "cells": cells}


def _rows(path: Path) -> int:
    return int(pl.scan_parquet(path).select(pl.len()).collect().item())


@dataclass(frozen=True)
class Progress:
    """Where a running sweep is: for a progress bar."""

    total: int  # cells in the sweep
    skipped: int  # finished by an earlier run
    done: int  # finished by this run
    elapsed: float  # seconds since this run started computing

    @property
    def remaining(self) -> int:
        return self.total - self.skipped - self.done


@dataclass
class SweepResult:
    """What a sweep did: cells, rows, time, and each worker's peak memory."""

    cells: int
    skipped: int
    computed: int = 0
    rows: int = 0
    requests: int = 0
    seconds: float = 0.0
    removed_leftovers: int = 0
    #: Peak resident memory per worker process (pid -> bytes).
    peak_rss: dict[int, int] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def cells_per_s(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def run_sweep(
    out: Path,
    cells: Sequence[Cell],
    config: SweepConfig,
    settings: SweepSettings,
    *,
    executor_name: str = "process",
    workers: int = 0,
    address: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    started: StartedPool | None = None,
) -> SweepResult:
    """Replay every cell not finished yet into `out`; resumable at any point.

    The manifest is written first (a killed sweep still says what it was), each cell's
    file as soon as it is computed, and the manifest again at the end with the files'
    digests. `started`: a pool started for the cells left to compute (`start_pool`),
    handed the traces once the manifest is written; closed here in any case.
    """
    try:
        manifest = plan_manifest(out, cells, config, settings)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / MANIFEST_FILE, json_bytes(manifest))
        result = SweepResult(cells=len(cells), skipped=0, removed_leftovers=remove_leftovers(out))
        todo = [c for c in cells if not is_complete(out / c.path)]
        result.skipped = len(cells) - len(todo)
        by_key = {c.key: c for c in todo}
        if started is not None and (
            started.specs != [c.spec for c in todo] or started.options != settings.run_settings
        ):
            raise SweepError("the started pool was started for other cells or settings")
    except BaseException:
        if started is not None:
            started.close()
        raise
    if started is not None:
        started.give(settings.traces)
        outputs = started.results()
    else:
        run = executor(
            executor_name,
            settings.traces,
            settings.run_settings,
            workers=workers,
            address=address,
            out=out,
        )
        outputs = run([c.spec for c in todo])
    start = time.perf_counter()
    if progress is not None:
        progress(Progress(len(cells), result.skipped, 0, 0.0))
    computed: dict[tuple[str, str], CellOutput] = {}
    for output in outputs:
        if not output.written:
            atomic_write(out / by_key[output.key].path, output.data)
        computed[output.key] = output
        result.computed += 1
        result.rows += output.rows
        result.requests += output.requests
        result.peak_rss[output.pid] = max(result.peak_rss.get(output.pid, 0), output.peak_rss)
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress(Progress(len(cells), result.skipped, result.computed, elapsed))
    result.seconds = time.perf_counter() - start
    result.manifest = final_manifest(out, manifest, computed)
    atomic_write(out / MANIFEST_FILE, json_bytes(result.manifest))
    figures = {k: o.figures for k, o in computed.items() if o.figures is not None}
    atomic_write(out / CELLS_FILE, parquet_bytes(cells_frame(out, result.manifest, figures)))
    return result


def scan(out: Path) -> pl.LazyFrame:
    """The sweep's dataset, as any polars user would read it."""
    return pl.scan_parquet(out / DATA_DIR / "**" / "*.parquet", hive_partitioning=True)


def _typed(values: list[Any]) -> pl.Series:
    """A grid parameter's values as one typed column: integers, numbers, booleans or
    strings when they are all of a kind, else their JSON text (None stays null)."""
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}
    if kinds <= {int}:
        return pl.Series(values, dtype=pl.Int64)
    if kinds <= {int, float}:
        return pl.Series([None if v is None else float(v) for v in values], dtype=pl.Float64)
    if kinds <= {bool}:
        return pl.Series(values, dtype=pl.Boolean)
    if kinds <= {str}:
        return pl.Series(values, dtype=pl.String)
    texts = [
        None if v is None else orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode() for v in values
    ]
    return pl.Series(texts, dtype=pl.String)


def cells_frame(
    out: Path,
    manifest: dict[str, Any],
    figures: Mapping[tuple[str, str], pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """One row per finished cell, in manifest order: policy, params_hash, a column per grid
    parameter (named by `column_name`; null where a cell's policy has no such axis) and the
    cell's figures over all its rows (simulator/frames.py `overall_summary`): `figures`
    where a worker summed them (`Worker.run`), else from the cell's file."""
    given = figures or {}

    def key(entry: dict[str, Any]) -> tuple[str, str]:
        return (entry["policy"], entry["params_hash"])

    entries = [e for e in manifest["cells"] if key(e) in given or is_complete(out / e["path"])]
    keys = list(dict.fromkeys(k for e in entries for k in e["grid"]))
    names = column_names(keys)
    base = pl.DataFrame(
        {
            "policy": pl.Series([e["policy"] for e in entries], dtype=pl.String),
            "params_hash": pl.Series([e["params_hash"] for e in entries], dtype=pl.String),
            **{names[k]: _typed([e["grid"].get(k) for e in entries]) for k in keys},
        }
    )
    # One file at a time, whole: a float sum over one contiguous column is the same every
    # time, where a scan of many files may split (and so round) it differently.
    parts = [
        given[key(e)] if key(e) in given else row_figures(pl.read_parquet(out / e["path"]))
        for e in entries
    ]
    if parts:
        summed = pl.concat(parts, how="vertical")
    else:
        summed = pl.DataFrame(schema=dict.fromkeys(CELL_FIGURES, pl.Float64))
    return pl.concat([base, summed], how="horizontal")


def row_figures(rows: pl.DataFrame) -> pl.DataFrame:
    """CELL_FIGURES over a replay's rows, as a one-row frame of typed columns (the aggregation
    of simulator/frames.py `overall_summary`, so a null figure keeps its type).

    Over the rows made contiguous first: polars sums a Float64 column chunk by chunk, so
    the dollars of a many-chunk frame differ in the last bits from those of the same rows
    in one chunk (the samples under claude-code@2.1.88 cut in three chunks: 4.099249250000001
    against 4.0992492500000015). A tuning trial (simulator/app/tune.py, rows in a chunk per
    trace) and a sweep cell (read back from its file) of one spec so give the same bits."""
    rows = rows.rechunk()
    summary = rows.select(_summary_aggs(has_loss(rows), _edit_aggs(rows)))
    # Built from Python values, not `rows.select(pl.lit(None))`: a select of literals alone
    # gives one row per chunk of a many-chunk frame in this polars.
    extra = {
        c: pl.Series(c, [rows[c].sum() if c in rows.columns else None], dtype=dtype)
        for c, dtype in REFETCH_FIGURES.items()
        if c not in summary.columns
    }
    if extra:
        summary = pl.concat([summary, pl.DataFrame(list(extra.values()))], how="horizontal")
    return summary.select(CELL_FIGURES)
