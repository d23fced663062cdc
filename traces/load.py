"""One entry point from paths to compiled traces: discover, read, compile, cache."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

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


class Loaded:
    """A compiled trace, where it came from, and whether the compile cache had it.

    A cache hit is decoded only when `.trace` is first used: copying a compiled file (what
    `traces import` does) needs its bytes, not its arrays.
    """

    def __init__(
        self,
        label: str,
        name: str,
        *,
        trace: Trace | None = None,
        path: Path | None = None,
        cached: bool = False,
        problems: list[str] | None = None,
        skipped: dict[str, int] | None = None,
    ) -> None:
        if trace is None and path is None:
            raise ValueError("a Loaded needs a trace or a compiled file")
        self.label = label
        self.name = name  # a file name for its compiled form, free of directory names
        self.cached = cached
        self.problems = problems or []
        self._trace = trace
        self._path = path
        self._data: bytes | None = None
        #: What --lenient skipped, by category (known without decoding a cache hit).
        self.skipped = dict(trace.skipped if trace is not None else skipped or {})

    @property
    def stats(self) -> dict[str, int]:
        """The reader's counters (lines read, metadata lines, copied calls...), read from
        meta.json alone for a cache hit not yet decoded."""
        if self._trace is not None or self._path is None:
            return dict(self.trace.stats)
        return _meta_stats(self._path)

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            assert self._path is not None
            self._trace = compiled.read(self._path, self.label)
        return self._trace

    def compiled_bytes(self) -> bytes:
        """The compiled file's bytes (identical whether compiled now or taken from cache)."""
        if self._data is None:
            if self._trace is None and self._path is not None:
                return self._path.read_bytes()
            self._data = compiled.to_bytes(self.trace)
        return self._data


def _meta_stats(path: Path) -> dict[str, int]:
    try:
        with zipfile.ZipFile(path) as zf:
            meta = orjson.loads(zf.read(compiled.META))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, orjson.JSONDecodeError):
        return {}
    stats = meta.get("stats") if isinstance(meta, dict) else None
    if not isinstance(stats, dict):
        return {}
    return {str(k): v for k, v in stats.items() if isinstance(v, int)}


#: Reader counters of lines skipped as having no bearing on the context: Claude Code's
#: metadata entries (traces/claude_code.py), Codex's UI events and bookkeeping items
#: (`lines_ignored`) and its metadata entry types (`entries_not_context`, traces/codex.py).
METADATA_COUNTERS = ("lines_metadata", "lines_ignored", "entries_not_context")


@dataclass
class InputTally:
    """What a command read, skipped and passed over: the one line every command prints.

    Metadata lines (entries with no bearing on the context, traces/claude_code.py) and
    client-error lines (`<synthetic>`) are skipped in strict mode too; damaged lines only
    under --lenient (strict mode stops at the first). A call copied from another file of
    the unit (a resume, a fork) is counted once; files that hold no trace of a known format
    are passed over.
    """

    traces: int = 0
    metadata_lines: int = 0
    error_lines: int = 0
    damaged: int = 0
    copied_calls: int = 0
    passed_over: int = 0

    def add(self, item: Loaded) -> None:
        stats = item.stats
        self.traces += 1
        self.metadata_lines += sum(stats.get(key, 0) for key in METADATA_COUNTERS)
        self.error_lines += stats.get("lines_synthetic", 0)
        self.copied_calls += stats.get("calls_copied", 0)
        self.damaged += sum(item.skipped.values())

    def line(self, *, lenient: bool) -> str:
        skipped = self.metadata_lines + self.error_lines
        parts = [
            f"input: {self.traces} trace(s)",
            f"skipped {skipped} line(s) ({self.metadata_lines} metadata, "
            f"{self.error_lines} client-error)",
        ]
        if lenient:
            parts.append(f"{self.damaged} damaged line(s) skipped (--lenient)")
        parts.append(f"{self.copied_calls} copied call(s) counted once")
        parts.append(f"passed over {self.passed_over} file(s) holding no trace of a known format")
        return "; ".join(parts)


class NameClash(ValueError):
    """Two different traces would replay under one name."""


def named_traces(items: Iterable[Loaded]) -> list[tuple[str, Trace]]:
    """(name, trace) of each loaded trace, named as runs name them: the compiled file name
    without `.ctxt` (source stem + digest), so a source and its imported compiled file replay
    under the same name and give the same rows. The same trace given twice is kept once."""
    named: dict[str, Trace] = {}
    for item in items:
        name = item.name.removesuffix(".ctxt")
        trace = item.trace
        seen = named.get(name)
        if seen is None:
            named[name] = trace
        elif seen.source_digest != trace.source_digest:
            raise NameClash(f"two different traces are named {name!r}; rename one")
    return list(named.items())


def compiled_name(unit: ImportUnit, digest: str) -> str:
    stem = unit.files[0].path.name.split(".")[0]
    return f"{stem}-{digest[:12]}.ctxt"


def load_unit(
    unit: ImportUnit, *, lenient: bool = False, cache: CompileCache | None = None
) -> Loaded:
    """Compile one import unit (or take it from the cache); raise TraceError on bad input."""
    if unit.format == "compiled":
        path = unit.files[0].path
        return Loaded(unit.label, path.name, trace=compiled.read(path, unit.label), cached=True)
    paths = [f.path for f in unit.files]
    if cache is not None:
        known = cache.remembered(paths)
        hit = cache.lookup(known, lenient=lenient) if known else None
        if known and hit is not None:
            name = compiled_name(unit, known)
            return Loaded(unit.label, name, path=hit[0], cached=True, skipped=hit[1])
    contents = [f.read() for f in unit.files]
    digest = unit.digest(contents)
    name = compiled_name(unit, digest)
    if cache is not None:
        cache.remember(paths, digest)
        hit = cache.lookup(digest, lenient=lenient)
        if hit is not None:
            return Loaded(unit.label, name, path=hit[0], cached=True, skipped=hit[1])
    problems = Problems(lenient=lenient)
    try:
        trace = READERS[unit.format](unit, contents, problems)
    except TraceError:
        raise
    except Exception as exc:  # a reader bug must still name the file, never dump a traceback
        raise TraceError(
            unit.label, 0, "internal-error", f"could not read: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        unit.forget()
    loaded = Loaded(unit.label, name, trace=trace, problems=problems.messages)
    if cache is not None:
        cache.put(trace, loaded.compiled_bytes())
    return loaded


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


def load_all(
    found: list[ImportUnit],
    *,
    lenient: bool = False,
    cache: CompileCache | None = None,
    jobs: int = 1,
) -> Iterator[Loaded]:
    """`load_unit` over many units, in order; `jobs` > 1 compiles that many at once.

    Threads, not processes: tiktoken encodes outside the GIL for much of its work, so one
    unit's tokenizing overlaps another's parsing. Results and errors come in unit order.
    """
    if jobs <= 1 or len(found) <= 1:
        for unit in found:
            yield load_unit(unit, lenient=lenient, cache=cache)
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(lambda u: load_unit(u, lenient=lenient, cache=cache), found)


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


@dataclass
class ImportSummary:
    written: int = 0
    from_cache: int = 0
    skipped_problems: int = 0
    empty_files: int = 0


def import_into(loaded: Iterator[Loaded] | list[Loaded], out: Path) -> ImportSummary:
    """Write compiled traces into `out`, all or nothing.

    Everything is compiled before the first file is written, so bad input stops the run
    with `out` untouched; each file is written atomically. An empty source (counted under
    --lenient) has nothing to write.
    """
    items = list(loaded)
    summary = ImportSummary()
    out.mkdir(parents=True, exist_ok=True)
    for item in items:
        summary.skipped_problems += sum(item.skipped.values())
        if "empty-file" in item.skipped:
            summary.empty_files += 1
            continue
        # Atomic (rename) but not fsynced: a crash may lose a file, never leave half of one.
        compiled.write_bytes(item.compiled_bytes(), out / item.name, durable=False)
        summary.written += 1
        summary.from_cache += item.cached
    return summary
