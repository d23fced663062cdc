"""`ctxsim sweep` and `ctxsim tune`: batch sweeps and threshold tuning (simulator/app/sweep.py,
simulator/app/tune.py), wired to the trace loading of simulator/app/cli.py and the charts of
reports/sweep_charts.py.

Like every ctxsim command: bad input is one line and exit status 2, outputs are written
atomically, and heavy modules are imported only when a command runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from simulator.app.cli_options import CACHE_CHOICES
from simulator.app.cli_options import fail as _fail
from simulator.app.cli_options import jobs as _jobs
from simulator.app.cli_options import lenient as _lenient
from simulator.app.cli_options import no_cache as _no_cache
from simulator.app.cli_options import paths as _paths
from simulator.app.files import atomic_write

if TYPE_CHECKING:
    from simulator.app.sweep import Progress, SweepResult
    from simulator.app.tune import TuneResult


def _traces(
    src: tuple[Path, ...],
    lenient: bool,
    no_cache: bool,
    jobs: int,
    each: Callable[[Any], None] | None = None,
) -> Any:
    from simulator.app.cli import _named_traces

    return _named_traces(src, lenient, no_cache, jobs, each=each)


def _fixed(params: tuple[str, ...]) -> list[tuple[str | None, str, Any]]:
    from simulator.app.cli import parse_param

    parsed = []
    for text in params:
        try:
            parsed.append(parse_param(text))
        except click.BadParameter as exc:
            _fail(f"-P {exc.message}")
    return parsed


# -- progress -------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def progress_line(p: Progress, width: int = 24) -> str:
    """`sweeping [#####-----]  37/120 cells  4.2 cells/s  0:00:19 left` (cells finished
    by an earlier run count as done; the rate is this run's)."""
    finished = p.skipped + p.done
    filled = round(width * finished / p.total) if p.total else width
    bar = "#" * filled + "-" * (width - filled)
    rate = p.done / p.elapsed if p.elapsed > 0 else 0.0
    left = _clock(p.remaining / rate) if rate > 0 else "-:--:--"
    return f"sweeping [{bar}] {finished}/{p.total} cells  {rate:.1f} cells/s  {left} left"


class ProgressBar:
    """Redraws one line on a terminal, at most ten times a second (and at the end)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.last = 0.0
        self.shown = False

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if p.remaining and now - self.last < 0.1:
            return
        self.last = now
        self.stream.write("\r" + progress_line(p) + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


# -- sweep ----------------------------------------------------------------------------------

_refetch = click.option(
    "--refetch/--no-refetch",
    default=False,
    show_default=True,
    help="Replay with the re-fetch model (content a policy dropped is fetched again when "
    "the recording uses it) or open loop (as recorded).",
)


def _fork_server_now(executor: str, out: Path) -> None:
    """Start a fresh sweep's fork server before this process imports the engine.

    Issue 16: the fork server imports the engine and every policy (0.6-0.7 s of CPU, 2 s
    of wall time at load 4); started after this process' own imports it was ready only
    as the traces finished loading (seen at load 4.7: ready at 3.42 s, loaded at 3.50 s),
    started here its imports run beside this process' imports and loading. Only for a
    directory that does not exist yet, where every cell is work; a resumed sweep starts it
    later, and only when a cell is left to compute (`sweep`)."""
    if executor != "process" or out.exists():
        return
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    from simulator.app.preload import fork_server_modules
    from simulator.workers import start_fork_server

    # The list of simulator/app/sweep.py `_preload`, which the pool sets again, and the CLI:
    # each worker imports the main module again (`ctxsim` imports simulator/app/cli.py).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(fork_server_modules("simulator.app.cli"))
    start_fork_server(context)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _summary_lines(result: SweepResult, workers: str) -> list[str]:
    line = f"sweep: {result.cells} cell(s), {result.skipped} finished before"
    if result.removed_leftovers:
        line += f" ({result.removed_leftovers} partial file(s) removed)"
    line += f", {result.computed} computed"
    if result.computed:
        line += (
            f" in {result.seconds:.1f} s: {result.cells_per_s:.1f} cells/s, "
            f"{result.requests_per_s:,.0f} requests/s on {workers}"
        )
        peaks = sorted(result.peak_rss.values())
        if peaks:
            line += f"; peak memory per worker {_mib(peaks[-1])}"
            if len(peaks) > 1:
                line += f" (lowest {_mib(peaks[0])})"
    return [line]


#: Loss columns of the printed table, by cells-table column.
LOSS_HEADS = {"stale_file_refs": "stale refs", "resent_tokens": "re-sent tokens"}
#: Cells listed in the printed table at most (all of them are in cells.parquet).
TABLE_LIMIT = 40


def _table(cells: Any, names: dict[str, str]) -> str:
    """Per cell: policy, grid values, cost, compactions, overflows, breaker trips, and the
    loss proxies a reader weighs cost against (stale file references, re-sent tokens), to
    the terminal's width (reports/tables.py; matplotlib stays unimported)."""
    from reports.tables import UNPRICED_NOTE, Column, render
    from simulator.frames import grid_keys

    keys = grid_keys(cells)
    frame = cells
    notes = []
    if frame.height > TABLE_LIMIT:
        frame = frame.sort("cost_total", nulls_last=True).head(TABLE_LIMIT)
        notes.append(f"({TABLE_LIMIT} cheapest of {cells.height} cells; all in cells.parquet)")
    loss = [c for c in ("stale_file_refs", "resent_tokens") if c in cells.columns]
    columns = [
        Column("policy", wrap=True),
        Column("params", drop=1),
        *(Column(names.get(k, k), wrap=True) for k in keys),
        Column("cost $", right=True),
        Column("compactions", right=True),
        Column("overflows", right=True),
        Column("trips", right=True, drop=2),
        *(Column(LOSS_HEADS[c], right=True, drop=3) for c in loss),
    ]
    rows = []
    unpriced = False
    for r in frame.iter_rows(named=True):
        cost = r["cost_total"]
        shown = "-" if cost is None else f"{cost:,.4f}"
        if cost is not None and r.get("unpriced_calls"):
            shown += "*"
            unpriced = True
        rows.append(
            [
                r["policy"],
                r["params_hash"],
                *(_shown(r[k]) for k in keys),
                shown,
                *(
                    "-" if r[c] is None else f"{r[c]:,}"
                    for c in ("compactions", "overflows", "breaker_trips", *loss)
                ),
            ]
        )
    if unpriced:
        notes.append(UNPRICED_NOTE)
    return render(columns, rows, notes=notes)


def _shown(value: Any) -> str:
    """A grid value as it would be typed: JSON, except plain strings."""
    import orjson

    if value is None:
        return "-"
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _grid_names(manifest: dict[str, Any]) -> dict[str, str]:
    """Column of cells.parquet -> the grid parameter it holds."""
    from simulator.app.sweep import column_name

    keys = dict.fromkeys(k for entry in manifest["cells"] for k in entry["grid"])
    return {column_name(k): k for k in keys}


def _write_charts(out: Path, cells: Any, manifest: dict[str, Any]) -> int:
    """charts/ of the sweep (stale ones from an earlier grid removed); returns how many."""
    from reports.sweep_charts import sweep_charts
    from simulator.app.sweep import column_name

    defaults: dict[str, dict[str, Any]] = {}
    for entry in manifest["cells"]:
        own = {column_name(k): v for k, v in entry.get("defaults", {}).items()}
        defaults.setdefault(entry["policy"], {}).update(own)
    mode = "re-fetch model" if manifest["settings"].get("refetch") else "open loop"
    files = sweep_charts(cells, defaults, _grid_names(manifest), mode)
    charts = out / "charts"
    if charts.is_dir():
        for old in charts.glob("*.png"):
            stale = f"charts/{old.name}" not in files
            if stale and old.name.startswith(("param-", "heatmap-", "loss-")):
                old.unlink()
    for name, data in sorted(files.items()):
        atomic_write(out / name, data)
    return len(files)


@click.command()
@_paths
@click.option(
    "--config",
    "sweep_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A TOML sweep file (policies, params, grid, seed, cache); options add to it.",
)
@click.option(
    "--policy",
    "policy_names",
    multiple=True,
    help="Policy: a registered name or a variant .toml file (repeatable; default claude-code).",
)
@click.option(
    "-P",
    "--param",
    "params",
    multiple=True,
    metavar="[POLICY:]KEY=VALUE",
    help="A fixed parameter of every cell; VALUE is JSON when it parses (repeatable).",
)
@click.option(
    "--grid",
    "-G",
    "grids",
    multiple=True,
    metavar="[POLICY:]KEY=VALUES",
    help="Swept parameter: v1,v2,... (JSON values), a JSON array, or START:STOP:STEP "
    "(STOP included when on the grid). Repeatable: the cells are the product.",
)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory."
)
@click.option(
    "--executor",
    type=click.Choice(["process", "ray"]),
    default="process",
    show_default=True,
    help="A local process pool, or Ray (a local instance, or the cluster at --address).",
)
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=0,
    help="Workers (0: every core; with Ray, every CPU of the cluster).",
)
@click.option("--address", help="Ray cluster address (with --executor ray), e.g. auto.")
@click.option(
    "--cache",
    type=click.Choice(CACHE_CHOICES),
    default=None,
    help="Prompt-cache model (default: the sweep file's, else auto).",
)
@click.option("--seed", type=int, default=None, help="Seed for policies (default 0).")
@_refetch
@click.option("--no-charts", is_flag=True, help="Write the dataset and manifest only.")
@_lenient
@_no_cache
@_jobs
def sweep(
    src: tuple[Path, ...],
    sweep_file: Path | None,
    policy_names: tuple[str, ...],
    params: tuple[str, ...],
    grids: tuple[str, ...],
    out: Path,
    executor: str,
    workers: int,
    address: str | None,
    cache: str | None,
    seed: int | None,
    refetch: bool,
    no_charts: bool,
    lenient: bool,
    no_cache: bool,
    jobs: int,
) -> None:
    """Replay traces under every combination of policies and parameter values.

    One cell per policy spec, over every session; each cell's rows, with the loss proxies,
    go to OUT/data/policy=<name>/<params_hash>.parquet (a hive-partitioned dataset), with
    OUT/sweep.json (the manifest), OUT/cells.parquet (one row per cell) and charts/ (cost
    and events, and cost against loss, along each grid parameter).
    Rerunning skips finished cells, so a sweep that was stopped resumes where it was.
    """
    if address is not None and executor != "ray":
        _fail("--address needs --executor ray")
    _fork_server_now(executor, out)
    from simulator.app import sweep as sw

    try:
        config = sw.load_sweep_file(sweep_file) if sweep_file else sw.SweepConfig()
        command = sw.SweepConfig(
            policies=policy_names,
            params=tuple(_fixed(params)),
            grid=tuple(sw.parse_grid(g) for g in grids),
            seed=seed,
            cache=cache,
        )
        config = config.merged(command)
        if config.cache is not None and config.cache not in CACHE_CHOICES:
            _fail(f"cache {config.cache!r}: one of {', '.join(CACHE_CHOICES)}")
        cells = sw.build_cells(config)
    except sw.SweepError as exc:
        _fail(str(exc))
    seed, cache_model = config.seed or 0, config.cache or "auto"
    todo = [c.spec for c in cells if not sw.is_complete(out / c.path)]
    started = None
    if executor == "process" and todo:  # none to start for a done sweep
        # Its workers are forked and wait while the traces load (simulator/app/sweep.py
        # `StartedPool`).
        options = sw.run_settings(seed, cache_model, refetch)
        started = sw.start_pool(todo, options, workers, out)
    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        # Each trace goes to the started workers as soon as it is decoded.
        named = _traces(src, lenient, no_cache, jobs, started.feed if started else None)
        settings = sw.SweepSettings(
            named, seed=seed, cache=cache_model, lenient=lenient, refetch=refetch
        )
        result = sw.run_sweep(
            out,
            cells,
            config,
            settings,
            executor_name=executor,
            workers=workers,
            address=address,
            progress=bar,
            started=started,
        )
    except sw.SweepError as exc:
        if bar is not None:
            bar.close()
        _fail(str(exc))
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        click.echo(f"interrupted: finished cells are kept in {out}; rerun to resume", err=True)
        sys.exit(130)
    finally:
        if started is not None:
            started.close()  # a no-op after a sweep that ran
    if bar is not None:
        bar.close()
    import polars as pl

    table = pl.read_parquet(out / sw.CELLS_FILE)
    if executor == "ray":
        where = "Ray" + (f" at {address}" if address else " (local)")
    else:
        where = f"{workers or sw.default_workers()} process(es)"
    for line in _summary_lines(result, where):
        click.echo(line)
    if table.height:
        from simulator.frames import inert_grid_keys

        names = _grid_names(result.manifest)
        click.echo(_table(table, names), nl=False)
        for key in inert_grid_keys(table):
            name = names.get(key, key)
            click.echo(
                f"note: {name} changed nothing: cells that differ in it alone have the same"
                " cost, calls and events (`ctxsim policies show POLICY` says what each"
                " preset reads)"
            )
    written = [f"{sw.DATA_DIR}/ ({table.height} file(s))", sw.MANIFEST_FILE, sw.CELLS_FILE]
    if not no_charts and table.height:
        written.append(f"{_write_charts(out, table, result.manifest)} chart(s)")
    click.echo(f"wrote {', '.join(written)} to {out}")


# -- tune -----------------------------------------------------------------------------------


def _tune_report(result: TuneResult, spec: Any) -> list[str]:
    from reports.tables import UNPRICED_NOTE
    from simulator.app.tune import METRICS

    shown_always = ("cost", "compactions", "overflows", "breaker_trips", "stale_file_refs")
    metrics = [o.metric for o in spec.objectives]
    unpriced = False

    def shown(figures: dict[str, Any]) -> str:
        nonlocal unpriced
        parts = []
        for name in dict.fromkeys((*shown_always, *metrics)):
            value = figures.get(name)
            label = name.replace("_", " ")
            if value is None:
                parts.append(f"{label} -")
            elif name == "cost":
                mark = "*" if figures.get("unpriced_calls") else ""
                unpriced = unpriced or bool(mark)
                parts.append(f"cost ${value:,.4f}{mark}")
            elif isinstance(value, float):
                parts.append(f"{label} {value:.4f}")
            else:
                parts.append(f"{label} {value:,}")
        return "  ".join(parts)

    columns = spec.columns

    def values(params: dict[str, Any]) -> str:
        return "  ".join(f"{k}={v}" for k, v in params.items())

    total = result.trials.height
    lines = [f"study {result.study}: {total} trial(s), {result.new_trials} new"]
    if result.stale_failed:
        lines[0] += f" ({result.stale_failed} left running by a stopped run marked failed)"
    best = result.best
    if best is None:
        lines.append("no trial meets the constraints")
    else:
        params = {k: best[columns[k]] for k in result.shipped}
        which = f" by {metrics[0]}" if spec.multi else ""
        lines.append(f"best{which} (trial {best['trial']}): {values(params)}")
        lines.append("  " + shown({name: best[name] for name in METRICS}))
    lines.append(f"shipped: {values(result.shipped)}")
    lines.append("  " + shown(result.baseline))
    if spec.multi and result.front.height:
        lines.append(f"Pareto front ({result.front.height} trial(s), by {metrics[0]}):")
        for r in result.front.head(FRONT_LIMIT).iter_rows(named=True):
            tuned = values({k: r[columns[k]] for k in result.shipped})
            scores = "  ".join(f"{m} {_score(r[m], m)}" for m in metrics)
            lines.append(f"  trial {r['trial']}: {tuned}  {scores}")
        if result.front.height > FRONT_LIMIT:
            lines.append(f"  ... all {result.front.height} in pareto.parquet")
    if unpriced:
        lines.append(UNPRICED_NOTE)
    return lines


#: Pareto-front trials listed at most (all of them are in pareto.parquet).
FRONT_LIMIT = 12


def _score(value: Any, metric: str) -> str:
    if value is None:
        return "-"
    if metric == "cost":
        return f"${value:,.4f}"
    return f"{value:.4f}" if isinstance(value, float) else f"{value:,}"


@click.command()
@_paths
@click.option(
    "--policy",
    "policy_name",
    default="claude-code",
    show_default=True,
    help="Policy to tune: a registered name or a variant .toml file.",
)
@click.option(
    "--param",
    "dimensions",
    multiple=True,
    required=True,
    metavar="KEY=LOW:HIGH[:STEP]",
    help="A tuned parameter: a range (integers when both ends are) or a list a,b,c.",
)
@click.option(
    "-P",
    "--fixed",
    "fixed",
    multiple=True,
    metavar="KEY=VALUE",
    help="A fixed parameter of every trial; VALUE is JSON when it parses (repeatable).",
)
@click.option(
    "--objective",
    "objectives",
    multiple=True,
    metavar="[min:|max:]METRIC",
    help="A figure to minimise (max: to maximise): cost (the default), a loss proxy "
    "(stale_file_refs, resent_tokens, summary_share, human_verbatim_share, "
    "post_compaction_requests), compactions, overflows, edits, ... any run-summary figure. "
    "Repeat for a multi-objective study (NSGA-II) and its Pareto front.",
)
@click.option("--maximize", is_flag=True, help="Maximise the one objective instead.")
@click.option(
    "--constraint",
    "constraints",
    multiple=True,
    metavar="METRIC(=|<=|>=)VALUE",
    help="A bound every candidate must meet, e.g. overflows=0 (repeatable).",
)
@click.option(
    "--trials",
    type=click.IntRange(0),
    default=30,
    show_default=True,
    help="Trials to add to the study.",
)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory."
)
@click.option("--study", "study_name", help="Study name (default: derived from the settings).")
@click.option(
    "--population",
    type=click.IntRange(2),
    default=16,
    show_default=True,
    help="NSGA-II generation size (several objectives).",
)
@_refetch
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (sampler, policies).")
@click.option(
    "--cache",
    type=click.Choice(CACHE_CHOICES),
    default="auto",
    show_default=True,
    help="Prompt-cache model.",
)
@_lenient
@_no_cache
@_jobs
def tune(
    src: tuple[Path, ...],
    policy_name: str,
    dimensions: tuple[str, ...],
    fixed: tuple[str, ...],
    objectives: tuple[str, ...],
    maximize: bool,
    constraints: tuple[str, ...],
    trials: int,
    out: Path,
    study_name: str | None,
    population: int,
    refetch: bool,
    seed: int,
    cache: str,
    lenient: bool,
    no_cache: bool,
    jobs: int,
) -> None:
    """Tune a policy's parameters with Optuna: minimise the objectives under constraints.

    The study is kept in OUT/study.db (rerunning adds trials to it); prints the best
    feasible parameters beside the shipped ones, and writes OUT/trials.parquet and
    OUT/trials.png; with several objectives also the Pareto front, OUT/pareto.parquet
    and OUT/pareto.png.
    """
    from reports.sweep_charts import pareto_chart, trials_chart
    from simulator.app import tune as tn
    from simulator.app.sweep import SweepError
    from simulator.frames import parquet_bytes

    parsed = _fixed(fixed)
    if any(scope is not None for scope, _, _ in parsed):
        _fail("-P: a tuned policy's fixed parameters take no POLICY: prefix")
    if maximize and len(objectives) > 1:
        _fail("--maximize: with several objectives, write max:METRIC")
    try:
        spec = tn.TuneSpec(
            policy=policy_name,
            dimensions=tuple(tn.parse_dimension(d) for d in dimensions),
            objectives=tuple(tn.parse_objective(o, maximize) for o in objectives or ("cost",)),
            constraints=tuple(tn.parse_constraint(c) for c in constraints),
            params=tuple((k, v) for _, k, v in parsed),
            seed=seed,
            cache=cache,
            refetch=refetch,
            population=population,
        )
    except (tn.TuneError, SweepError) as exc:
        _fail(str(exc))
    named = _traces(src, lenient, no_cache, jobs)
    bar: Any = None
    if sys.stderr.isatty() and trials > 1:
        bar = click.progressbar(length=trials, label="tuning", file=sys.stderr, show_pos=True)
        bar.__enter__()

    def step(_done: int, _total: int) -> None:
        if bar is not None:
            bar.update(1)

    try:
        result = tn.tune(named, spec, out, trials, study_name=study_name, on_trial=step)
    except tn.TuneError as exc:
        _fail(str(exc))
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    columns = spec.columns
    names = {c: k for k, c in columns.items()}
    tuned = list(columns.values())
    first = spec.objectives[0].metric
    atomic_write(out / tn.TRIALS_FILE, parquet_bytes(result.trials))
    chart = trials_chart(
        result.trials,
        first,
        tuned,
        baseline=_float(result.baseline.get(first)),
        shipped={columns[k]: v for k, v in result.shipped.items()},
        names=names,
    )
    atomic_write(out / tn.CHART_FILE, chart)
    written = [tn.STUDY_FILE, tn.TRIALS_FILE, tn.CHART_FILE]
    if spec.multi:
        atomic_write(out / tn.PARETO_FILE, parquet_bytes(result.front))
        objectives_shown = [(o.metric, o.maximize) for o in spec.objectives]
        front = pareto_chart(result.trials, objectives_shown, tuned, result.baseline, names)
        atomic_write(out / tn.PARETO_CHART, front)
        written += [tn.PARETO_FILE, tn.PARETO_CHART]
    for line in _tune_report(result, spec):
        click.echo(line)
    click.echo(f"wrote {', '.join(written)} to {out}")
    if result.best is None and result.trials.height:
        sys.exit(1)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
