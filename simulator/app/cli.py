"""The `ctxsim` command line: the one place that wires readers, policies and reports.

Every command turns bad input into a one-line error naming file and line (exit 2), never a
traceback, and writes its outputs atomically.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from simulator.app.cli_options import CACHE_CHOICES
from simulator.app.cli_options import fail as _fail
from simulator.app.cli_options import jobs as _jobs
from simulator.app.cli_options import lenient as _lenient
from simulator.app.cli_options import no_cache as _no_cache
from simulator.app.cli_options import selection as _selection
from simulator.app.cli_options import sources as _sources
from simulator.app.files import OutputError, atomic_write, check_target
from traces.errors import TraceError

if TYPE_CHECKING:  # the commands import what they use lazily, to start fast
    from simulator.model import Trace
    from simulator.policy import Policy
    from traces.select import Filters, SessionInfo


def _cache(no_cache: bool) -> Any:
    from traces.cache import CompileCache, default_root

    return None if no_cache else CompileCache(default_root())


@dataclass
class Reading:
    """What a command reads: the folders and files (as the user gave them, or the agents'
    own when none was given: traces/home.py), the filters (traces/select.py), and what was
    learnt of each session on the way, for the terminal tables and the line saying what
    was read. Project names live here and in terminal output only, never in a file."""

    filters: Filters
    roots: list[tuple[Path, str]] = field(default_factory=list)
    defaulted: bool = False
    info: dict[str, SessionInfo] = field(default_factory=dict)
    by_name: dict[str, SessionInfo] = field(default_factory=dict)
    left_out: int = 0

    @classmethod
    def of(cls, paths: Sequence[Path], filters: Filters | None = None) -> Reading:
        from traces.home import HomeError, default_places
        from traces.select import Filters

        reading = cls(filters or Filters())
        if paths:
            reading.roots = [(p, str(p)) for p in paths]
            return reading
        try:
            places = default_places(reading.filters.agent)
        except HomeError as exc:
            _fail(str(exc))
        reading.roots = [(place.path, place.shown) for place in places]
        reading.defaulted = True
        return reading

    @property
    def paths(self) -> list[Path]:
        return [p for p, _ in self.roots]

    def where(self, label: str) -> str:
        """A file label (its path from the folder above the root given) as the user
        would write it: the path they gave, joined with the rest of the label."""
        for path, shown in self.roots:
            if path.is_file():
                if label == path.name:
                    return shown
                continue
            if not path.name or label == path.name or label.startswith(path.name + os.sep):
                return str(Path(shown).parent / label)
        return label

    def message(self, text: str) -> str:
        """`text` (a problem: "label:line: ..." or "label: ...") with its label written as
        the user's path."""
        found = _LOCATED.match(text)
        if found is None:
            return text
        return self.where(found["label"]) + text[len(found["label"]) :]

    def error(self, exc: TraceError) -> str:
        where = self.where(exc.file)
        where = f"{where}:{exc.line}" if exc.line > 0 else where
        return f"{where}: {exc.message} [{exc.category}]"

    def noted(self, item: Any) -> None:
        info = self.info.get(item.label)
        if info is not None:
            self.by_name[item.name.removesuffix(".ctxt")] = info

    def line(self) -> str:
        """ "read 412 session(s) in 37 project(s), 2026-05-02 to 2026-11-30 from ..."."""
        from traces.select import read_line

        text = "read " + read_line(self.info.values())
        if self.defaulted:
            text += " from " + ", ".join(shown for _, shown in self.roots)
        if self.filters.active:
            text += f" ({self.filters.describe()}; {self.left_out} other(s) left out)"
        return text


#: A located message: its file label, then `:line` or not, then `: `.
_LOCATED = re.compile(r"^(?P<label>.+?)(?::\d+)?: ")


def _loaded(
    paths: tuple[Path, ...],
    lenient: bool,
    no_cache: bool,
    label: str,
    jobs: int = 0,
    tally: Any = None,
    reading: Reading | None = None,
    each: Callable[[Trace], None] | None = None,
) -> Iterator[Any]:
    """Compile (or fetch from cache) every trace under `paths` that the reading's filters
    keep, with a progress bar; what was read, skipped and passed over is added to `tally`
    (a traces.load.InputTally), and what is known of each session to `reading`; `each`
    is handed every trace as soon as it is decoded (a sweep's workers take it then)."""
    from traces.load import default_jobs, load_all, units_and_others
    from traces.select import select

    if reading is None:
        reading = Reading.of(paths)
        learn = False
    else:
        learn = True
    try:
        found, others = units_and_others(reading.paths)
        if learn:
            chosen = select(found, reading.filters, Path.home())
            found = chosen.units
            reading.info = chosen.info
            reading.left_out = chosen.left_out
    except TraceError as exc:
        _fail(reading.error(exc))
    _note_others([reading.where(o) for o in others])
    if tally is not None:
        tally.passed_over += len(others)
    cache = _cache(no_cache)
    show = len(found) > 1 and sys.stderr.isatty()
    results = load_all(found, lenient=lenient, cache=cache, jobs=jobs or default_jobs())

    def counted(items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            if tally is not None:
                tally.add(item)
            reading.noted(item)
            if each is not None:
                each(item.trace)
            yield item

    try:
        if show:
            with click.progressbar(results, length=len(found), label=label, file=sys.stderr) as bar:
                yield from counted(bar)
        else:
            yield from counted(results)
    except TraceError as exc:
        _fail(reading.error(exc))


def _said(reading: Reading, tally: Any, *, err: bool = False) -> None:
    """The closing lines of a command that read traces, wrapped to the terminal: what was
    read, the pointer to `traces validate` when damaged lines were skipped, and the input
    tally (traces/load.py InputTally), last."""
    from reports.tables import wrap

    lines = [reading.line()]
    if tally.damaged:
        kinds = tally.damaged_kinds()
        lines.append(
            f"{tally.damaged:,} damaged line(s) skipped{f' ({kinds})' if kinds else ''}: "
            "`ctxsim traces validate` lists them; --strict stops at the first"
        )
    lines.append(tally.line(lenient=tally.damaged > 0))
    for line in wrap(lines):
        click.echo(line, err=err)


def _tally() -> Any:
    from traces.load import InputTally

    return InputTally()


T = TypeVar("T")

#: Work shorter than this shows no progress bar (a bar that flashes by is noise).
PROGRESS_AFTER_S = 0.5


def _progress(items: Sequence[T], label: str) -> Iterator[T]:
    """Yield `items`; once the work has taken more than a moment, show a bar on a terminal.

    The bar goes to stderr and only to a terminal, so piped output and CI logs stay clean.
    """
    if len(items) < 2 or not sys.stderr.isatty():
        yield from items
        return
    start = time.monotonic()
    bar: Any = None
    try:
        for done, item in enumerate(items):
            if bar is None and time.monotonic() - start > PROGRESS_AFTER_S:
                bar = click.progressbar(length=len(items), label=label, file=sys.stderr)
                bar.__enter__()
                bar.update(done)
            yield item
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)


def _note_others(others: list[str]) -> None:
    if others:
        click.echo(
            f"note: passed over {len(others)} file(s) holding no trace of a known format "
            f"(first: {others[0]})",
            err=True,
        )


class _Main(click.Group):
    """The command group: an output that cannot be written (simulator/app/files.py
    OutputError, from any command) is one error line and exit 2, never a traceback; Ctrl-C
    in any command is one line and exit 130 (128 + SIGINT, what a shell reports for it),
    wherever it lands: click's own "Aborted!" exits 1, so a sweep interrupted while its
    traces loaded exited 1 and one interrupted in its loop 130. Outputs are written whole
    or not at all (simulator/app/files.py), so nothing half-written is left."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
        except OutputError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        # At the interpreter's exit, before it tears the modules down: the teardown runs the
        # cyclic garbage collector over every object of the engine and the traces, several
        # times (0.1-0.3 s after importing the engine alone, more with the traces loaded;
        # 0.015 s frozen). Objects are still freed; the outputs are all closed. At exit, so a
        # caller that runs a command in its own process (tests) keeps collecting until then.
        atexit.register(gc.freeze)
        return result


@click.group(cls=_Main)
@click.version_option(package_name="ctxsim")
def main() -> None:
    """ctxsim: replay recorded agent sessions through context-compaction policies."""


@main.group()
def traces() -> None:
    """Import, validate and summarise recorded traces."""


_session_charts = click.option(
    "--session-charts",
    type=click.IntRange(0),
    default=12,
    show_default=True,
    help="Sessions that get a context chart (the most eventful first, then the longest).",
)


@traces.command("import")
@_sources
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Directory.")
@_selection
@_lenient
@_no_cache
@_jobs
def import_(
    src: tuple[Path, ...], out: Path, filters: Filters, lenient: bool, no_cache: bool, jobs: int
) -> None:
    """Compile traces into content-free .ctxt files under OUT (no SRC: your sessions)."""
    from traces.load import import_into

    tally = _tally()
    reading = Reading.of(src, filters)
    loaded = _loaded(src, lenient, no_cache, "importing", jobs, tally, reading)
    try:
        summary = import_into(loaded, out)
    except TraceError as exc:  # --out unwritable (traces/load.py import_into)
        _fail(str(exc))
    msg = f"imported {summary.written} trace(s) into {out} ({summary.from_cache} from cache)"
    skipped = summary.skipped_problems
    if skipped:
        msg += f"; skipped {skipped} bad line(s)"
    click.echo(msg)
    _said(reading, tally)


@traces.command()
@_sources
@_selection
@_lenient
def validate(src: tuple[Path, ...], filters: Filters, lenient: bool) -> None:
    """Check traces and list every problem with its file and line (no SRC: your sessions).

    Exits 1 when a problem was found with --strict (problems are otherwise only listed).
    """
    from traces.load import InputTally, load_unit, units_and_others
    from traces.select import select

    reading = Reading.of(src, filters)
    try:
        found, others = units_and_others(reading.paths)
        chosen = select(found, reading.filters, Path.home())
    except TraceError as exc:
        _fail(reading.error(exc))
    reading.info, reading.left_out = chosen.info, chosen.left_out
    for label in others:
        click.echo(f"{reading.where(label)}: not a trace of a known format (passed over)")
    tally = InputTally(passed_over=len(others))
    problems = 0
    for unit in chosen.units:
        try:
            item = load_unit(unit, lenient=True, cache=None)
        except TraceError as exc:
            click.echo(reading.error(exc))
            problems += 1
            continue
        tally.add(item)
        for message in item.problems:
            click.echo(reading.message(message))
        problems += len(item.problems)
        sessions = len(item.trace.sessions)
        requests = sum(s.n_requests for s in item.trace.sessions)
        status = "ok" if not item.problems else f"{len(item.problems)} problem(s)"
        where = reading.where(item.label)
        click.echo(f"{where}: {sessions} session(s), {requests} request(s): {status}")
    summary = f"{len(chosen.units)} trace(s), {problems} problem(s)"
    if others:
        summary += f", {len(others)} file(s) passed over"
    _said(reading, tally)
    click.echo(summary)
    if problems and not lenient:
        sys.exit(1)


@traces.command()
@_sources
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--parquet",
    type=click.Path(path_type=Path),
    help="Also write the rows here (no paths or project names: traces by compiled name).",
)
@_selection
@_lenient
@_no_cache
def stats(
    src: tuple[Path, ...],
    as_json: bool,
    parquet: Path | None,
    filters: Filters,
    lenient: bool,
    no_cache: bool,
) -> None:
    """Per session: project, start, requests, duration, recorded tokens and dollars (input,
    output, cache), recorded compactions (no SRC: your sessions)."""
    from reports.trace_stats import render_table, session_stats, to_json
    from simulator.pricing import PriceBook, UnknownModelError

    tally = _tally()
    reading = Reading.of(src, filters)
    items = list(_loaded(src, lenient, no_cache, "reading", 0, tally, reading))
    loaded = [(item.name.removesuffix(".ctxt"), item.trace) for item in items]
    try:
        df = session_stats(loaded, PriceBook())
    except UnknownModelError as exc:
        _fail(str(exc))
    if parquet is not None:
        import io

        buf = io.BytesIO()
        df.write_parquet(buf, statistics=False)
        atomic_write(parquet, buf.getvalue())
    if as_json:
        click.echo(to_json(df, skipped=tally.damaged), nl=False)
    else:
        projects = {name: info.project or "-" for name, info in reading.by_name.items()}
        click.echo(render_table(df, projects=projects), nl=False)
    _said(reading, tally, err=as_json)  # --json keeps stdout one document


# -- run and fidelity ---------------------------------------------------------------------


@main.command()
@click.option("--sessions", type=click.IntRange(1), default=10, show_default=True)
@click.option("--requests", type=click.IntRange(1), default=200, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory.")
def synth(sessions: int, requests: int, seed: int, out: Path) -> None:
    """Generate synthetic sessions fitted to the real corpus (traces/synthetic_params.json),
    written as compiled traces; the same seed writes the same files."""
    from traces.synthetic import write_corpus

    paths = write_corpus(out, sessions, requests, seed)
    click.echo(f"wrote {len(paths)} synthetic trace(s) of {requests} requests to {out}")


DEFAULT_POLICY = "claude-code"

#: (policy name or None for every selected policy, parameter, value) from one -P option.
Param = tuple[str | None, str, Any]


def parse_param(text: str) -> Param:
    """`[POLICY:]KEY=VALUE`; VALUE is JSON when it parses as JSON (8000, true, [1, 2],
    "x"), else the string as given, so `-P mode=fast` needs no quoting. The policy parses
    it by the parameter's declaration when it is built (simulator/params.py: "8k",
    "13_000", "1h"; true / false only), so a bad value fails there in one line."""
    import orjson

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE", param_hint="-P")
    scope: str | None = None
    if ":" in key:
        scope, key = key.split(":", 1)
        if not scope or not key:
            raise click.BadParameter(f"{text!r}: expected POLICY:KEY=VALUE", param_hint="-P")
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = raw
    return scope, key, value


def _build_policies(names: tuple[str, ...], params: list[Param]) -> list[Policy]:
    """Each selected policy (once, in the order given) with its -P parameters.

    An unscoped parameter goes to every selected policy that has it; with one policy it
    goes to that policy, so a typo fails there with a did-you-mean hint. `POLICY:KEY=VALUE`
    sets KEY on that policy only.
    """
    from simulator import policy as registry
    from simulator.variants import Variant, build_variant, load_variant

    unique = list(dict.fromkeys(names))
    variants: dict[str, Variant] = {}
    try:
        labels = []
        for name in unique:
            if name.endswith(".toml"):  # a variant file: `extends` a registered policy
                variant = load_variant(Path(name))
                variants[variant.name] = variant
                labels.append(variant.name)
            else:
                labels.append(name)
        unique = labels
        classes = {
            name: registry.get(variants[name].extends if name in variants else name)
            for name in unique
        }
        for scope, key, value in params:
            if scope is not None and scope not in classes:
                _fail(f"-P {scope}:{key}: policy {scope!r} is not selected (add --policy {scope})")
            unknown = not any(key in classes[n].defaults for n in unique)
            if scope is None and len(unique) > 1 and unknown:
                _fail(_no_such_param(unique, key, value))
        built = []
        for name in unique:
            mine = {
                key: value
                for scope, key, value in params
                if scope == name
                or (scope is None and (len(unique) == 1 or key in classes[name].defaults))
            }
            if name in variants:
                built.append(build_variant(variants[name], mine))
            else:
                built.append(registry.build(name, mine))
    except registry.PolicyError as exc:
        _fail(str(exc))
    return built


def _no_such_param(names: list[str], key: str, value: Any) -> str:
    """The error for a parameter no selected policy has: the first with a did-you-mean."""
    from simulator import policy as registry

    messages = []
    for name in names:
        try:
            registry.build(name, {key: value})
        except registry.PolicyError as exc:
            messages.append(str(exc))
    hinted = [m for m in messages if "did you mean" in m]
    return (hinted or messages)[0]


def _named_traces(
    paths: tuple[Path, ...],
    lenient: bool,
    no_cache: bool,
    jobs: int,
    tally: Any = None,
    reading: Reading | None = None,
    each: Callable[[Trace], None] | None = None,
) -> list[tuple[str, Trace]]:
    """(name, trace) of every trace under `paths` (or `reading`'s, filtered), named as
    traces/load.py `named_traces` names them (no directory); `each` as in `_loaded`."""
    from traces.load import NameClash, named_traces

    loaded = _loaded(paths, lenient, no_cache, "reading", jobs, tally, reading, each)
    try:
        named = named_traces(loaded)
    except NameClash as exc:
        _fail(str(exc))
    if not named:
        where = ", ".join(shown for _, shown in reading.roots) if reading else ""
        where = where or ", ".join(p.name or str(p) for p in paths)
        if reading is not None and reading.filters.active:
            _fail(f"no session in {where} matches {reading.filters.describe()}")
        _fail("no trace found in " + where)
    return named


@main.group()
def policies() -> None:
    """The registered context policies and their parameters."""


@policies.command("list")
def policies_list() -> None:
    """Every registered policy, with its version and what it is."""
    from reports.tables import Column, render
    from simulator import policy as registry

    rows = []
    for name in registry.names():
        cls = registry.get(name)
        doc = (cls.__doc__ or "").strip().splitlines()
        if not doc or cls.__doc__ == registry.Policy.__doc__:
            module = __import__(cls.__module__, fromlist=["_"])
            doc = (module.__doc__ or "").strip().splitlines()
        rows.append([name, cls.version, doc[0] if doc else ""])
    columns = [Column("policy"), Column("version"), Column("what it is", wrap=True)]
    click.echo(render(columns, rows), nl=False)


@policies.command("show")
@click.argument("name")
def policies_show(name: str) -> None:
    """NAME's parameters: a table of name, type, unit, default, meaning and the source of
    the default (the fact it models, "ours", or the preset or variant file that set it; a
    variant .toml file is shown with its overrides)."""
    from simulator import policy as registry
    from simulator.variants import build_variant, default_sources, load_variant

    try:
        if name.endswith(".toml"):
            variant = load_variant(Path(name))
            cls = registry.get(variant.extends)
            sources = default_sources(variant.extends)
            typed = build_variant(variant).params  # a bad value: one line naming the file
            for key in variant.params:
                sources[key] = (typed[key], f"variant {variant.source}")
            click.echo(f"{variant.name} (extends {variant.extends})")
        else:
            cls = registry.get(name)
            sources = default_sources(name)
            click.echo(f"{name} {cls.version}")
    except registry.PolicyError as exc:
        _fail(str(exc))
    import orjson

    from reports.tables import Column, render

    rows = []
    for key, (value, source) in sorted(sources.items()):
        declared = cls.declared.get(key)
        shown = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        if declared is None:
            rows.append([key, "?", "", shown, "(not declared)", source])
        else:
            rows.append([key, declared.type, declared.unit, shown, declared.meaning, source])
    # A long default (a list of tools) wraps in its cell; the meaning wraps first.
    columns = [
        Column("name"),
        Column("type", drop=2),
        Column("unit", drop=1),
        Column("default", wrap=True),
        Column("meaning", wrap=True),
        Column("source", wrap=True, drop=3),
    ]
    notes = []
    if cls.version == "matched":
        from simulator.model import version_tuple

        presets = sorted(  # oldest first, @latest last
            (n for n in registry.names() if n.startswith(f"{name}@")),
            key=lambda n: (version_tuple(n.split("@")[1]) or (1 << 30,), n),
        )
        notes.append(
            f"each session is replayed under the preset of the version it was recorded with "
            f"({', '.join(presets)}; `ctxsim policies show` one of them for its values): the "
            "defaults above are the rules those presets override, and a parameter given "
            "(-P) applies over the session's preset"
        )
    click.echo(render(columns, rows, notes=notes), nl=False)


@main.command()
@_sources
@click.option(
    "--policy",
    "policy_names",
    multiple=True,
    default=(DEFAULT_POLICY,),
    show_default=True,
    help="Policy to replay: a registered name or a variant .toml file (repeatable).",
)
@click.option(
    "-P",
    "--param",
    "params",
    multiple=True,
    metavar="[POLICY:]KEY=VALUE",
    help="Policy parameter, checked against its declaration (`ctxsim policies show NAME`): "
    "sizes as 8000, 8k or 13_000, durations as 5m or 1h, switches as true or false (repeatable).",
)
@click.option(
    "--cache",
    type=click.Choice(CACHE_CHOICES),
    default="auto",
    show_default=True,
    help="Prompt-cache model (auto: by each session's model provider).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for policies.")
@click.option(
    "--refetch/--no-refetch",
    default=False,
    show_default=True,
    help="Semi-closed loop: the agent fetches back dropped content it uses again "
    "(reports/METRICS.md, Re-fetch); off: open loop.",
)
@click.option(
    "--out", required=True, type=click.Path(path_type=Path), help="Directory (a run's own)."
)
@click.option("--no-report", is_flag=True, help="Write only the Parquet files and the manifest.")
@_session_charts
@_selection
@_lenient
@_no_cache
@_jobs
def run(
    src: tuple[Path, ...],
    filters: Filters,
    policy_names: tuple[str, ...],
    params: tuple[str, ...],
    cache: str,
    seed: int,
    refetch: bool,
    out: Path,
    no_report: bool,
    session_charts: int,
    lenient: bool,
    no_cache: bool,
    jobs: int,
) -> None:
    """Replay traces under policies; write requests.parquet, sessions.parquet, manifest.json,
    then charts/ and report.html drawn from them, and print a summary per policy.

    The Parquet files and the manifest are all computed before the first is written; the
    charts and report are drawn from them, and the whole directory is committed as a unit
    (simulator/run.py write); the same inputs give byte-identical files.
    """
    from reports.tables import render_run_summary, wrap
    from simulator import run as service
    from simulator.app.outputs import write as write_run

    check_target(out)  # an unwritable --out fails before the replay, not after

    parsed: list[Param] = []
    for text in params:
        try:
            parsed.append(parse_param(text))
        except click.BadParameter as exc:
            _fail(f"-P {exc.message}")
    policies = _build_policies(policy_names, parsed)
    tally = _tally()
    reading = Reading.of(src, filters)
    named = _named_traces(src, lenient, no_cache, jobs, tally, reading)
    pool = None if no_report else _chart_pool(named, session_charts)
    settings = service.RunSettings(seed=seed, cache=cache, lenient=lenient, refetch=refetch)
    outputs = service.run(
        named, policies, settings, progress=lambda units: _progress(units, "replaying")
    )
    draw = not no_report and outputs.requests.height  # nothing to draw without a request
    names = write_run(outputs, out, _drawing(session_charts, pool) if draw else None)
    written = list(outputs.files)
    if draw:
        charts = sum(name.endswith(".png") for name in names)
        written.append(f"report.html and {charts} chart(s)")
    click.echo(render_run_summary(outputs), nl=False)
    for line in wrap(
        [
            f"wrote {', '.join(written)} to {out} ({outputs.requests.height:,} request rows, "
            f"{outputs.sessions.height:,} session rows)"
        ]
    ):
        click.echo(line)
    _said(reading, tally)


def _chart_pool(named: Sequence[tuple[str, Any]], session_charts: int) -> Any:
    """Chart workers started before the replay, so they are ready when the rows are
    (reports/charts.py ChartPool); None for a report too small to pay for them. Closed
    with the command."""
    from reports.charts import ChartPool, pool_pays

    if not pool_pays(sum(len(trace.sessions) for _, trace in named), session_charts):
        return None
    return click.get_current_context().with_resource(ChartPool())


def _drawing(session_charts: int, pool: Any = None) -> Any:
    """Draws the charts and report.html of a (staged) run directory from its files (the
    charts by `pool`'s workers where there is one)."""
    from reports.html import ReportError, build_report

    def bar(keys: list[tuple[str, int]]) -> Iterator[tuple[str, int]]:
        return _progress(keys, "drawing charts")

    def draw(run_dir: Path) -> dict[str, bytes]:
        try:
            return build_report(run_dir, session_limit=session_charts, progress=bar, pool=pool)
        except ReportError as exc:
            _fail(str(exc))

    return draw


def _write_report(run_dir: Path, session_charts: int) -> str:
    """Draw the charts and report.html from the run's files and put them in the run
    directory as one unit; returns what was written."""
    from simulator.app.outputs import write_report
    from simulator.frames import REPORT_FILE

    files = _drawing(session_charts)(run_dir)
    write_report(run_dir, files)
    charts = sum(name.endswith(".png") for name in files)
    return f"{REPORT_FILE} and {charts} chart(s)"


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@_session_charts
def report(run_dir: Path, session_charts: int) -> None:
    """Write charts/ and a self-contained report.html for the run in RUN_DIR.

    Drawn only from the run's requests.parquet, sessions.parquet and manifest.json.
    """
    written = _write_report(run_dir, session_charts)
    click.echo(f"wrote {written} to {run_dir}")


def _compare_options(func: Any) -> Any:
    """One --max-... option per compared figure (reports/compare.py METRICS)."""
    from reports.compare import METRICS

    for metric in reversed(METRICS):
        verb = "rises" if metric.worse > 0 else "falls"
        forms = {
            "usd": "in USD ($0.10) or relative to the baseline (2%)",
            "share": "in percentage points (0.5pp), as a fraction (0.005) or relative (2%)",
            "count": "as a count (0) or relative to the baseline (10%)",
            "tokens": "in tokens (0) or relative to the baseline (10%)",
        }
        func = click.option(
            f"--max-{metric.option}",
            metric.param,
            metavar="LIMIT",
            help=f"Exit 1 when {metric.label} {verb} by more than LIMIT: {forms[metric.unit]}.",
        )(func)
    return func


@main.command()
@click.argument("baseline", type=click.Path(file_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(file_okay=False, path_type=Path))
@_compare_options
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Also write compare.md and compare.png (the two runs side by side) here.",
)
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the markdown of compare.md (a CI job summary) instead of a terminal table.",
)
def compare(
    baseline: Path, candidate: Path, out: Path | None, markdown: bool, **limits: str | None
) -> None:
    """Compare two run directories; print a table (--markdown: a CI job summary).

    Exit status: 0 when every stated limit holds, 1 when one is crossed, 2 when the runs
    cannot be compared (missing files, different traces, nothing to pair).
    """
    from reports import compare as cmp
    from reports.html import ReportError

    parsed: dict[str, cmp.Limit] = {}
    for metric in cmp.METRICS:
        text = limits.get(metric.param)
        if text is None:
            continue
        try:
            parsed[metric.key] = cmp.parse_limit(text, metric)
        except ValueError as exc:
            _fail(f"--max-{metric.option}: {exc}")
    try:
        base = cmp.load(baseline, "baseline")
        cand = cmp.load(candidate, "candidate")
        result = cmp.compare(base, cand, parsed)
    except ReportError as exc:
        _fail(str(exc))
    text = cmp.render_markdown(result)
    if out is not None:
        from reports.charts import compare_chart

        atomic_write(out / "compare.md", text.encode("utf-8"))
        chart = compare_chart(base.requests, cand.requests, result.pairs)
        atomic_write(out / "compare.png", chart)
    click.echo(text if markdown else cmp.render_terminal(result), nl=False)
    sys.exit(result.exit_code)


@main.command()
@_sources
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Also write fidelity.parquet and fidelity_sessions.parquet here.",
)
@_selection
@_lenient
@_no_cache
@_jobs
def fidelity(
    src: tuple[Path, ...],
    out: Path | None,
    filters: Filters,
    lenient: bool,
    no_cache: bool,
    jobs: int,
) -> None:
    """Check the cost model: replay as-recorded and compare every request with its usage
    (no SRC: your sessions)."""
    from reports.tables import wrap
    from simulator import policy as registry
    from simulator.app.fidelity import compare, inferred, sessions_without_usage, summarize
    from simulator.app.fidelity_report import render
    from simulator.frames import as_written, parquet_bytes
    from simulator.pricing import PriceBook
    from simulator.replay import replay

    tally = _tally()
    reading = Reading.of(src, filters)
    named = _named_traces(src, lenient, no_cache, jobs, tally, reading)
    prices = PriceBook()
    frame = replay(named, registry.build("as-recorded"), prices=prices)
    per_request = compare(frame, named, prices)
    sessions, overall = summarize(per_request)
    overall["sessions_without_usage"] = sessions_without_usage(named)
    overall["inferred"] = inferred(named)
    if out is not None:
        files = {
            "fidelity.parquet": parquet_bytes(as_written(per_request)),
            "fidelity_sessions.parquet": parquet_bytes(sessions),
        }
        for name, data in files.items():
            atomic_write(out / name, data)
    labels = {
        name: (info.project or "-", info.start_text) for name, info in reading.by_name.items()
    }
    for line in wrap(render(sessions, overall, labels=labels).splitlines()):
        click.echo(line)
    _said(reading, tally)


from simulator.app.cli_sweep import sweep, tune  # noqa: E402

main.add_command(sweep)
main.add_command(tune)


if __name__ == "__main__":
    main()
