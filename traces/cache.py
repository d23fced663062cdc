"""The on-disk compile cache: a source is parsed and tokenized once, then read compiled.

Entries are keyed by the source digest (sha256 over the import unit's bytes, see
traces/source.py) *and* by the versions of what produced them: FORMAT_VERSION (the file
layout, traces/compiled.py) and COMPILER_VERSION (what the readers extract). Each pair of
versions has its own directory, so changing either makes old entries unreachable instead
of wrong; `prune` deletes them. The cache is an optimisation only: a damaged, truncated or
foreign entry is a miss (and is removed), never an error.

Layout: `<root>/compiled-f<FORMAT_VERSION>-c<COMPILER_VERSION>/<digest[:2]>/<digest>.ctxt`.

Healing (issue 17): an entry whose meta.json cannot be read is discarded at lookup; one
whose columns fail their CRC (columns.zst damaged, meta.json intact: R18) is discarded
when traces/load.py checks the hit, and one that fails to decode, when it is decoded; the
source is then compiled again, with one note. An unwritable cache (R15) prints one warning
and the run goes on without it. Temporary files left by a killed writer are deleted once
STALE_TMP_SECONDS old.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from simulator.model import Trace
from traces import compiled
from traces.errors import TraceError

#: Bump whenever a reader (traces/*) or the builder changes what it puts into a Trace for
#: the same source bytes (new flags, other token counts, a fixed bug...): every cached
#: compilation made by the old code is then ignored and compiled again.
COMPILER_VERSION = "18"
#: Environment variable naming the cache directory (takes precedence over XDG).
ENV_VAR = "CTXSIM_CACHE_DIR"

#: Age past which a cache `.tmp` file is a writer's leftover: a write (temporary file, then
#: rename) of the largest entry takes well under a second, so a temporary file ten minutes
#: old belongs to a process that was killed between the two (issue 17).
STALE_TMP_SECONDS = 600

_DIGEST = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")
_VERSION_DIR = re.compile(r"compiled-f[^/\\]+-c[^/\\]+")
_TMP = re.compile(r"\..+\.tmp")


def _stat_key(files: list[Path]) -> str:
    """Path (as bytes: a file name need not be UTF-8, R13), size, mtime, ctime, inode and
    device of each file. ctime is in the key because an in-place edit of the same size whose
    mtime is put back (`cp -p` onto the file, `rsync -t --inplace`, `touch -r`) changes only
    ctime, which no user can set (R23); git's index keys on it for the same reason."""
    h = hashlib.sha256(b"ctxsim-stat-v2")
    for f in files:
        st = f.stat()
        h.update(os.fsencode(f.resolve()) + b"\0")
        h.update(
            f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0{st.st_dev}\0".encode()
        )
    return h.hexdigest()


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file beside it, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def default_root() -> Path:
    """$CTXSIM_CACHE_DIR, else $XDG_CACHE_HOME/ctxsim, else ~/.cache/ctxsim."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore relative paths
        return Path(xdg) / "ctxsim"
    return Path.home() / ".cache" / "ctxsim"


class CompileCache:
    """Compiled traces under `root`, safe to share between concurrent processes.

    Writes are atomic (traces.compiled.write), so a concurrent reader sees either no entry
    or a complete one; two processes compiling the same source both write identical bytes.
    """

    def __init__(self, root: Path, note: Callable[[str], None] = _warn) -> None:
        self.root = Path(root)
        #: Where the one-line notes go (a damaged entry rebuilt, an unwritable cache).
        self.note = note
        #: Why the cache is off for the rest of this process (it could not be written).
        self.disabled: str | None = None
        self._swept = False
        #: Shard directories this instance made or found (one mkdir each, not one per
        #: entry; a shard deleted since is made again when a write finds it missing).
        self._dirs: set[Path] = set()

    def _write(self, path: Path, write: Callable[[Path], None]) -> None:
        """`write(path)` into a shard directory made at most once per instance."""
        parent = path.parent
        if parent not in self._dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(parent)
        try:
            write(path)
        except FileNotFoundError:  # the shard was removed since: make it again, once
            parent.mkdir(parents=True, exist_ok=True)
            write(path)

    @property
    def directory(self) -> Path:
        """Where entries of the current format and compiler versions live."""
        return self.root / f"compiled-f{compiled.FORMAT_VERSION}-c{COMPILER_VERSION}"

    def path_for(self, digest: str) -> Path:
        """The entry's path; the digest must be a plain token (it becomes a file name)."""
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"not a source digest: {digest!r}")
        return self.directory / digest[:2] / f"{digest}{compiled.SUFFIX}"

    def get(self, digest: str) -> Trace | None:
        """The cached compilation of the source with this digest, or None."""
        path = self.path_for(digest)
        if not path.is_file():
            return None
        try:
            trace = compiled.read(path)
        except TraceError:
            self._discard(path)
            return None
        if trace.source_digest != digest:  # misplaced or tampered with: not this source
            self._discard(path)
            return None
        return trace

    def lookup(
        self, digest: str, *, lenient: bool = True, label: str = "a source"
    ) -> tuple[Path, dict[str, int]] | None:
        """The entry's path and skipped counts if it holds this source's compilation.

        Reads meta.json only; an entry whose meta.json fails is discarded with a note
        naming `label` (the source's).

        A strict lookup passes over an entry compiled under --lenient that skipped input:
        strict mode must see (and report) the bad input itself.
        """
        path = self.path_for(digest)
        if not path.is_file():
            return None
        peeked = compiled.peek(path)
        if peeked is None or peeked[0] != digest:
            why = "its meta.json is unreadable" if peeked is None else "it names another source"
            self.discard(digest, label, why)
            return None
        return (path, peeked[1]) if lenient or not peeked[1] else None

    def remembered(self, files: list[Path]) -> str | None:
        """The digest last computed for these files, if none of them changed since.

        Keyed by path, size, mtime and ctime (ns), inode and device, as git's index does: a
        warm import then reads no source bytes at all.
        """
        try:
            key = _stat_key(files)
            value = (self._stat_dir / key[:2] / key).read_text().strip()
        except (OSError, ValueError):
            return None
        return value if _DIGEST.fullmatch(value) else None

    def remember(self, files: list[Path], digest: str) -> None:
        try:
            key = _stat_key(files)
            self._write(self._stat_dir / key[:2] / key, lambda path: _replace_text(path, digest))
        except OSError:
            return

    @property
    def _stat_dir(self) -> Path:
        return self.root / "stat-index-v2"

    def put(self, trace: Trace, data: bytes | None = None) -> Path:
        """Store `trace` (serialised as `data` if given) under its source digest.

        Raises OSError if the cache is unwritable.
        """
        path = self.path_for(trace.source_digest)
        if not self._swept:
            self._swept = True
            self.sweep_tmp()
        if data is None:
            data = compiled.to_bytes(trace)
        payload = data
        self._write(path, lambda target: compiled.write_bytes(payload, target, durable=False))
        return path

    def store(self, trace: Trace, data: bytes | None = None) -> None:
        """`put`, but an unwritable cache is one warning and then off for this process: the
        cache is an optimisation, so a read-only or full disk must not stop a run (R15)."""
        if self.disabled is not None:
            return
        try:
            self.put(trace, data)
        except OSError as exc:
            self.disabled = exc.strerror or type(exc).__name__
            self.note(
                f"warning: compile cache not written ({self.disabled}); going on without it "
                f"(set {ENV_VAR} or pass --no-cache)"
            )

    def discard(self, digest: str, label: str, reason: str) -> None:
        """Remove a damaged entry, with one note saying its source is compiled again."""
        self._discard(self.path_for(digest))
        self.note(f"note: {label}: cached compilation was damaged ({reason}); compiling again")

    def sweep_tmp(self, max_age: float = STALE_TMP_SECONDS) -> int:
        """Delete temporary files (`.NAME.*.tmp`) older than `max_age` seconds left in the
        cache by writers killed between write and rename; return how many."""
        cutoff = time.time() - max_age  # file ages, never written into any output
        removed = 0
        for top in (self.directory, self._stat_dir):
            try:
                shards = [d for d in os.scandir(top) if d.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for shard in shards:
                with contextlib.suppress(OSError), os.scandir(shard.path) as it:
                    for entry in it:
                        if not _TMP.fullmatch(entry.name) or not entry.is_file(
                            follow_symlinks=False
                        ):
                            continue
                        with contextlib.suppress(OSError):
                            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                                os.unlink(entry.path)
                                removed += 1
        return removed

    def prune(self) -> int:
        """Delete the entries of other format or compiler versions, and the stat index of
        earlier versions; return how many directories."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for child in self.root.iterdir():
            if (
                child.is_dir()
                and not child.is_symlink()
                and _VERSION_DIR.fullmatch(child.name)
                and child.name != self.directory.name
            ) or (child.name == "stat-index-v1" and not child.is_symlink()):
                shutil.rmtree(child, ignore_errors=True)
                removed += 1
        return removed

    @staticmethod
    def _discard(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
