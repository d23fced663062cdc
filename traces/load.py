"""One entry point from paths to compiled traces: discover, read, compile, cache."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.model import BLOCK_COLUMNS, Columns, Trace
from traces import claude_code, codex, compiled, swe_agent
from traces.cache import CompileCache
from traces.discover import discover, discover_all
from traces.errors import Problems, TraceError
from traces.source import ImportUnit, shown

Reader = Callable[[ImportUnit, list[bytes], Problems], Trace]

#: Set to `clear` to keep tool names as recorded (see `private_tool_names`).
TOOL_NAMES_ENV = "CTXSIM_TOOL_NAMES"

READERS: dict[str, Reader] = {
    "claude-code": claude_code.read,
    "codex": codex.read,
    "swe-agent": swe_agent.read,
}


class Loaded:
    """A compiled trace, where it came from, and whether the compile cache had it.

    A trace read from a compiled file (a cache hit, an imported `.ctxt`) remembers the file
    and a hash of its bytes: `traces import` then copies those very bytes instead of
    encoding the trace again (issue 16). A cache hit is checked when found (every zip
    member's CRC and meta.json, traces/compiled.py `check`) and decoded only when `.trace`
    is first used; should decoding fail even so, `rebuild` compiles the source again.
    """

    def __init__(
        self,
        label: str,
        name: str,
        *,
        trace: Trace | None = None,
        path: Path | None = None,
        source_sha: bytes | None = None,
        cached: bool = False,
        problems: list[str] | None = None,
        meta: dict[str, Any] | None = None,
        rebuild: Callable[[str], Trace] | None = None,
    ) -> None:
        if trace is None and (path is None or meta is None):
            raise ValueError("a Loaded needs a trace, or a checked compiled file")
        self.label = label
        self.name = name  # a file name for its compiled form, free of directory names
        self.cached = cached
        self.problems = problems or []
        self._trace = trace
        self._path = path
        self._source_sha = source_sha
        self._rebuild = rebuild
        self._data: bytes | None = None
        counts = meta if trace is None else {"skipped": trace.skipped, "stats": trace.stats}
        assert counts is not None
        #: What --lenient skipped, by category (known without decoding a cache hit).
        self.skipped: dict[str, int] = dict(counts["skipped"])
        self._stats: dict[str, int] = dict(counts["stats"])

    @property
    def stats(self) -> dict[str, int]:
        """The reader's counters (lines read, metadata lines, copied calls...)."""
        return dict(self._stats)

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            assert self._path is not None
            try:
                self._trace = compiled.read(self._path, self.label)
            except TraceError as exc:
                if self._rebuild is None:
                    raise
                self._trace = self._rebuild(exc.message)
                self._path = self._source_sha = None
                self.cached = False
        return self._trace

    def compiled_bytes(self) -> bytes:
        """The compiled file's bytes: the file's own while it holds the bytes that were
        checked (so a copy out of the cache encodes nothing again, and carries nothing that
        failed its check, R18), else the trace encoded (the same bytes, same pyarrow)."""
        if self._path is not None and self._source_sha is not None:
            try:
                data = self._path.read_bytes()
            except OSError:
                data = b""
            if hashlib.sha256(data).digest() == self._source_sha:
                return data
        if self._data is None:
            self._data = compiled.to_bytes(self.trace)
        return self._data


def _read_compiled(path: Path, label: str) -> tuple[Trace, bytes]:
    """A compiled file decoded, and the sha256 of the bytes it was decoded from."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(
            label, 0, compiled.UNREADABLE, f"cannot read file: {exc.strerror}"
        ) from None
    return compiled.from_bytes(data, label), hashlib.sha256(data).digest()


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
    copied_calls: int = 0
    passed_over: int = 0
    #: Damaged lines by problem category (`traces validate`'s bracketed names): a line of an
    #: item type the reader does not know (a newer client's) is not a broken one.
    damaged_by: dict[str, int] = field(default_factory=dict)

    @property
    def damaged(self) -> int:
        """Damaged lines skipped, of every category."""
        return sum(self.damaged_by.values())

    def add(self, item: Loaded) -> None:
        stats = item.stats
        self.traces += 1
        self.metadata_lines += sum(stats.get(key, 0) for key in METADATA_COUNTERS)
        self.error_lines += stats.get("lines_synthetic", 0)
        self.copied_calls += stats.get("calls_copied", 0)
        for category, n in item.skipped.items():
            self.damaged_by[category] = self.damaged_by.get(category, 0) + n

    def damaged_kinds(self) -> str:
        """The damaged lines by category, most first: "3 invalid-json, 1 unknown-type"."""
        ranked = sorted(self.damaged_by.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{n:,} {category}" for category, n in ranked if n)

    def line(self, *, lenient: bool) -> str:
        skipped = self.metadata_lines + self.error_lines
        parts = [
            f"input: {self.traces} trace(s)",
            f"skipped {skipped} line(s) ({self.metadata_lines} metadata, "
            f"{self.error_lines} client-error)",
        ]
        if lenient:
            parts.append(f"{self.damaged} damaged line(s) skipped")
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
    stem = shown(unit.files[0].path.name).split(".")[0]
    return f"{stem}-{digest[:12]}.ctxt"


def load_unit(
    unit: ImportUnit, *, lenient: bool = False, cache: CompileCache | None = None
) -> Loaded:
    """Compile one import unit (or take it from the cache); raise TraceError on bad input.

    A cache entry is checked here (every zip member's CRC, meta.json): one that fails (a
    CRC error in a table, a truncated file: R18) is discarded with a note and the source
    compiled again, so a damaged cache never stops a command nor reaches `traces import
    --out`; one that passes but fails to decode is rebuilt when decoded (`Loaded.trace`).
    """
    if unit.format == "compiled":
        path = unit.files[0].path
        trace, sha = _read_compiled(path, unit.label)
        name = shown(path.name)
        return Loaded(unit.label, name, trace=trace, path=path, source_sha=sha, cached=True)
    paths = [f.path for f in unit.files]
    clear = clear_tool_names()
    if clear:  # the cache holds the private names only
        cache = None
    if cache is not None:
        known = cache.remembered(paths)
        if known:
            hit = _cached(cache, known, unit, lenient)
            if hit is not None:
                return hit
    contents = [f.read() for f in unit.files]
    digest, key = unit.fingerprint(contents)
    if cache is not None:
        cache.remember(paths, digest)
        hit = _cached(cache, digest, unit, lenient)
        if hit is not None:
            return hit
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
    if not clear:
        private_tool_names(trace, key)
    loaded = Loaded(
        unit.label, compiled_name(unit, digest), trace=trace, problems=problems.messages
    )
    if cache is not None:
        cache.store(trace, loaded.compiled_bytes())
    return loaded


def clear_tool_names() -> bool:
    """Whether the user asked for tool names as recorded ($CTXSIM_TOOL_NAMES=clear)."""
    return os.environ.get(TOOL_NAMES_ENV, "").strip().lower() == "clear"


def _tool_name(name: str, fmt: str, key: bytes) -> str:
    if name.startswith("mcp__"):
        tag = hashlib.blake2b(name.encode(), key=key, person=b"ctxsim-tool", digest_size=4)
        return f"mcp__{tag.hexdigest()}"
    if fmt == "swe-agent" and name not in swe_agent.OWN_COMMANDS:
        return "bash"
    return name


def private_tool_names(trace: Trace, key: bytes) -> None:
    """Replace, in place, the tool names that tell about the user rather than the agent.

    An MCP tool's name (`mcp__<server>__<tool>`, Claude Code) names the user's MCP server
    and often their product or employer (../shared/traces: `mcp__plugin_serena_serena__*`,
    `mcp__codebase-memory-mcp__*`, ...); it becomes `mcp__` + 8 hex of a BLAKE2b keyed with
    the unit's hashing key (traces/source.py), so the tools of one trace stay apart and a
    guess cannot be confirmed without the source. A SWE-agent "tool" that is the first word
    of a shell command (`curl`, `tshark`, a project's script) becomes `bash`; SWE-agent's own
    commands stay (swe_agent.OWN_COMMANDS). Issue 17. No policy keys on either kind of name
    (they key on the agents' built-in tools: Bash, Read, skill...), so replay is unchanged.
    Names that become equal are merged and the blocks' `tool` indices follow.
    """
    for session in trace.sessions:
        names = [_tool_name(t, trace.format, key) for t in session.tools]
        if names == session.tools:
            continue
        unique = list(dict.fromkeys(names))
        index = np.array([unique.index(n) for n in names] or [0], dtype=np.int32)
        tool = session.blocks["tool"]
        remapped = np.where(tool >= 0, index[np.maximum(tool, 0)], -1).astype(np.int32)
        session.blocks = Columns(BLOCK_COLUMNS, {**session.blocks.data, "tool": remapped})
        session.tools = unique


def _cached(cache: CompileCache, digest: str, unit: ImportUnit, lenient: bool) -> Loaded | None:
    """The cache's compilation of `unit` (whose bytes have `digest`), checked, or None."""
    hit = cache.lookup(digest, lenient=lenient, label=unit.label)
    if hit is None:
        return None
    path = hit[0]
    try:
        data = path.read_bytes()
        meta = compiled.check(data, unit.label)
    except OSError as exc:
        cache.discard(digest, unit.label, f"cannot read it: {exc.strerror}")
        return None
    except TraceError as exc:
        cache.discard(digest, unit.label, exc.message)
        return None
    if meta["source_digest"] != digest:  # the entry changed since it was looked up
        cache.discard(digest, unit.label, "it names another source")
        return None

    def rebuild(why: str) -> Trace:
        cache.discard(digest, unit.label, why)
        return load_unit(unit, lenient=lenient, cache=cache).trace

    return Loaded(
        unit.label,
        compiled_name(unit, digest),
        path=path,
        source_sha=hashlib.sha256(data).digest(),
        cached=True,
        meta=meta,
        rebuild=rebuild,
    )


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

    Threads, not processes: tiktoken encodes outside the GIL, so one unit's tokenizing
    overlaps another's parsing. Results and errors come in unit order.

    The largest units start first, so no large one is left running alone at the end (the
    shared corpus's units run from 1 KB to 4 MB). While the threads run, the interpreter
    hands the GIL over more often (SWITCH_INTERVAL): a thread coming back from tiktoken
    waits for the GIL until the parsing thread is made to drop it, up to the switch
    interval (5 ms by default) per text, and a cold import tokenizes some 55,000 texts.
    Cold import of ../shared/traces, 2 jobs, one process, rounds interleaved on the shared
    2-core machine (load 3-6): 24.0, 31.1 and 22.7 s at 5 ms, 15.9, 21.5 and 24.2 s at
    0.5 ms (against 22.0, 19.9 and 15.1 s with 1 job: under that load a second thread often
    has no core to run on); the bytes are the same either way.
    """
    if jobs <= 1 or len(found) <= 1:
        for unit in found:
            yield load_unit(unit, lenient=lenient, cache=cache)
        return
    first = sorted(range(len(found)), key=lambda i: -_size(found[i]))
    _quick_switch(True)
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {
                i: pool.submit(load_unit, found[i], lenient=lenient, cache=cache) for i in first
            }
            for i in range(len(found)):
                yield futures.pop(i).result()  # held no longer than needed
    finally:
        _quick_switch(False)


#: GIL switch interval (seconds) while units compile on several threads (`load_all`).
SWITCH_INTERVAL = 0.0005
_switch_lock = threading.Lock()
_switch_users: list[float] = []  # the interval to restore, once per parallel load running


def _quick_switch(on: bool) -> None:
    """Lower the switch interval for a parallel load; put it back when the last one ends
    (two loads at once must not leave it lowered)."""
    with _switch_lock:
        if on:
            _switch_users.append(sys.getswitchinterval())
            sys.setswitchinterval(min(_switch_users[0], SWITCH_INTERVAL))
        else:
            saved = _switch_users.pop()
            if not _switch_users:
                sys.setswitchinterval(saved)


def _size(unit: ImportUnit) -> int:
    """Bytes of the unit's files (0 for one that cannot be read: its error comes later)."""
    total = 0
    for f in unit.files:
        with contextlib.suppress(OSError):
            total += f.path.stat().st_size
    return total


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

    Everything is compiled (or found in the cache and checked) before the first file is
    written, so bad input stops the run with `out` untouched; each file is written
    atomically. While files are written `out` holds compiled.INCOMPLETE_MARKER, which every
    reader refuses (traces/discover.py): an import killed half-way leaves a set that no
    command takes for a whole one (issue 17) until an import into `out` completes. An
    empty source (counted under --lenient) has nothing to write.
    """
    items = list(loaded)
    summary = ImportSummary()
    try:
        out.mkdir(parents=True, exist_ok=True)
        marker = out / compiled.INCOMPLETE_MARKER
        marker.write_bytes(b"")
        for item in items:
            summary.skipped_problems += sum(item.skipped.values())
            if "empty-file" in item.skipped:
                summary.empty_files += 1
                continue
            # Atomic (rename), not fsynced: a crash may lose a file, never leave half of one.
            compiled.write_bytes(item.compiled_bytes(), out / item.name, durable=False)
            summary.written += 1
            summary.from_cache += item.cached
        marker.unlink()
    except OSError as exc:  # R15: an unwritable --out is one line, not a traceback
        raise TraceError(
            shown(out.name) or ".", 0, "unwritable", f"cannot write: {exc.strerror}"
        ) from None
    return summary
