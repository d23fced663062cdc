"""One entry point from paths to compiled traces: discover, read, compile, cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from simulator.model import Trace
from traces import claude_code, codex, compiled, swe_agent
from traces.cache import CompileCache
from traces.discover import discover, discover_all
from traces.errors import Problems, TraceError
from traces.source import ImportUnit

Reader = Callable[[ImportUnit, list[bytes], Problems], Trace]

READERS: dict[str, Reader] = {
    "claude-code": claude_code.read,
    "codex": codex.read,
    "swe-agent": swe_agent.read,
}


@dataclass
class Loaded:
    """A compiled trace, where it came from, and whether the compile cache had it."""

    label: str
    name: str  # a file name for its compiled form, free of directory names
    trace: Trace
    cached: bool
    problems: list[str]


def compiled_name(unit: ImportUnit, digest: str) -> str:
    stem = unit.files[0].path.name.split(".")[0]
    return f"{stem}-{digest[:12]}.ctxt"


def load_unit(
    unit: ImportUnit, *, lenient: bool = False, cache: CompileCache | None = None
) -> Loaded:
    """Compile one import unit (or take it from the cache); raise TraceError on bad input."""
    if unit.format == "compiled":
        trace = compiled.read(unit.files[0].path, unit.label)
        return Loaded(unit.label, unit.files[0].path.name, trace, True, [])
    contents = [f.read() for f in unit.files]
    digest = unit.digest(contents)
    name = compiled_name(unit, digest)
    if cache is not None:
        hit = cache.get(digest)
        if hit is not None and (lenient or not hit.skipped):
            return Loaded(unit.label, name, hit, True, [])
    problems = Problems(lenient=lenient)
    try:
        trace = READERS[unit.format](unit, contents, problems)
    except TraceError:
        raise
    except Exception as exc:  # a reader bug must still name the file, never dump a traceback
        raise TraceError(
            unit.label, 0, "internal-error", f"could not read: {type(exc).__name__}: {exc}"
        ) from exc
    if cache is not None:
        cache.put(trace)
    return Loaded(unit.label, name, trace, False, problems.messages)


def load(
    paths: list[Path], *, lenient: bool = False, cache: CompileCache | None = None
) -> Iterator[Loaded]:
    """Every trace under `paths`, in a deterministic order."""
    for unit in discover(paths):
        yield load_unit(unit, lenient=lenient, cache=cache)


def units(paths: list[Path]) -> list[ImportUnit]:
    return discover(paths)


def units_and_others(paths: list[Path]) -> tuple[list[ImportUnit], list[str]]:
    """Import units, and the files met in directories that hold no known trace."""
    return discover_all(paths)
