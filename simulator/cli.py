"""The `ctxsim` command line: the one place that wires readers, policies and reports.

Every command turns bad input into a one-line error naming file and line (exit 2), never a
traceback, and writes its outputs atomically.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from traces.errors import TraceError

EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _cache(no_cache: bool) -> Any:
    from traces.cache import CompileCache, default_root

    return None if no_cache else CompileCache(default_root())


def _loaded(
    paths: tuple[Path, ...], lenient: bool, no_cache: bool, label: str, jobs: int = 0
) -> Iterator[Any]:
    """Compile (or fetch from cache) every trace under `paths`, with a progress bar."""
    from traces.load import default_jobs, load_all, units_and_others

    try:
        found, others = units_and_others(list(paths))
    except TraceError as exc:
        _fail(str(exc))
    _note_others(others)
    cache = _cache(no_cache)
    show = len(found) > 1 and sys.stderr.isatty()
    results = load_all(found, lenient=lenient, cache=cache, jobs=jobs or default_jobs())
    try:
        if show:
            with click.progressbar(results, length=len(found), label=label, file=sys.stderr) as bar:
                yield from bar
        else:
            yield from results
    except TraceError as exc:
        _fail(str(exc))


def _note_others(others: list[str]) -> None:
    if others:
        click.echo(
            f"note: passed over {len(others)} file(s) holding no trace of a known format "
            f"(first: {others[0]})",
            err=True,
        )


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory, then rename: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.group()
@click.version_option(package_name="ctxsim")
def main() -> None:
    """ctxsim: replay recorded agent sessions through context-compaction policies."""


@main.group()
def traces() -> None:
    """Import, validate and summarise recorded traces."""


_paths = click.argument(
    "src", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path)
)
_lenient = click.option(
    "--lenient", is_flag=True, help="Skip and count bad lines instead of stopping at the first."
)
_no_cache = click.option("--no-cache", is_flag=True, help="Always compile; ignore the cache.")
_jobs = click.option(
    "--jobs", "-j", type=click.IntRange(0), default=0, help="Traces compiled at once (0: auto)."
)


@traces.command("import")
@_paths
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Directory.")
@_lenient
@_no_cache
@_jobs
def import_(src: tuple[Path, ...], out: Path, lenient: bool, no_cache: bool, jobs: int) -> None:
    """Compile traces into content-free .ctxt files under OUT."""
    from traces.load import import_into

    summary = import_into(_loaded(src, lenient, no_cache, "importing", jobs), out)
    msg = f"imported {summary.written} trace(s) into {out} ({summary.from_cache} from cache)"
    skipped = summary.skipped_problems
    if skipped:
        msg += f"; skipped {skipped} bad line(s) (--lenient)"
    click.echo(msg)


@traces.command()
@_paths
@_lenient
def validate(src: tuple[Path, ...], lenient: bool) -> None:
    """Check traces and list every problem with its file and line.

    Exits 1 when a problem was found, unless --lenient (problems are then only counted).
    """
    from traces.load import load_unit, units_and_others

    try:
        found, others = units_and_others(list(src))
    except TraceError as exc:
        _fail(str(exc))
    for label in others:
        click.echo(f"{label}: not a trace of a known format (passed over)")
    problems = 0
    for unit in found:
        try:
            item = load_unit(unit, lenient=True, cache=None)
        except TraceError as exc:
            click.echo(str(exc))
            problems += 1
            continue
        for message in item.problems:
            click.echo(message)
        problems += len(item.problems)
        sessions = len(item.trace.sessions)
        requests = sum(s.n_requests for s in item.trace.sessions)
        status = "ok" if not item.problems else f"{len(item.problems)} problem(s)"
        click.echo(f"{item.label}: {sessions} session(s), {requests} request(s): {status}")
    click.echo(f"{len(found)} trace(s), {problems} problem(s)")
    if problems and not lenient:
        sys.exit(1)


@traces.command()
@_paths
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--parquet", type=click.Path(path_type=Path), help="Also write the rows here.")
@_lenient
@_no_cache
def stats(
    src: tuple[Path, ...], as_json: bool, parquet: Path | None, lenient: bool, no_cache: bool
) -> None:
    """Per session: requests, duration, recorded tokens and cost, recorded compactions."""
    from reports.trace_stats import render_table, session_stats, to_json
    from simulator.pricing import PriceBook, UnknownModelError

    loaded = [(item.label, item.trace) for item in _loaded(src, lenient, no_cache, "reading")]
    try:
        df = session_stats(loaded, PriceBook())
    except UnknownModelError as exc:
        _fail(str(exc))
    if parquet is not None:
        import io

        buf = io.BytesIO()
        df.write_parquet(buf, statistics=False)
        atomic_write_bytes(parquet, buf.getvalue())
    click.echo(to_json(df) if as_json else render_table(df))


if __name__ == "__main__":
    main()
