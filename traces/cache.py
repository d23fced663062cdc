"""The on-disk compile cache: a source is parsed and tokenized once, then read compiled.

Entries are keyed by the source digest (sha256 over the import unit's bytes, see
traces/source.py) *and* by the versions of what produced them: FORMAT_VERSION (the file
layout, traces/compiled.py) and COMPILER_VERSION (what the readers extract). Each pair of
versions has its own directory, so changing either makes old entries unreachable instead
of wrong; `prune` deletes them. The cache is an optimisation only: a damaged, truncated or
foreign entry is a miss (and is removed), never an error.

Layout: `<root>/compiled-f<FORMAT_VERSION>-c<COMPILER_VERSION>/<digest[:2]>/<digest>.ctxt`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from pathlib import Path

from simulator.model import Trace
from traces import compiled
from traces.errors import TraceError

#: Bump whenever a reader (traces/*) or the builder changes what it puts into a Trace for
#: the same source bytes (new flags, other token counts, a fixed bug...): every cached
#: compilation made by the old code is then ignored and compiled again.
COMPILER_VERSION = "9"
#: Environment variable naming the cache directory (takes precedence over XDG).
ENV_VAR = "CTXSIM_CACHE_DIR"

_DIGEST = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")
_VERSION_DIR = re.compile(r"compiled-f[^/\\]+-c[^/\\]+")


def _stat_key(files: list[Path]) -> str:
    h = hashlib.sha256(b"ctxsim-stat-v1")
    for f in files:
        st = f.stat()
        h.update(
            f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}\0".encode()
        )
    return h.hexdigest()


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

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

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

    def lookup(self, digest: str, *, lenient: bool = True) -> tuple[Path, dict[str, int]] | None:
        """The entry's path and skipped counts if it holds this source's compilation.

        Reads meta.json only.

        A strict lookup passes over an entry compiled under --lenient that skipped input:
        strict mode must see (and report) the bad input itself.
        """
        path = self.path_for(digest)
        if not path.is_file():
            return None
        peeked = compiled.peek(path)
        if peeked is None or peeked[0] != digest:
            self._discard(path)
            return None
        return (path, peeked[1]) if lenient or not peeked[1] else None

    def remembered(self, files: list[Path]) -> str | None:
        """The digest last computed for these files, if none of them changed since.

        Keyed by path, size, mtime (ns), inode and device, as git's index does: a warm
        import then reads no source bytes at all.
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
            path = self._stat_dir / key[:2] / key
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(digest)
            os.replace(tmp, path)
        except OSError:
            return

    @property
    def _stat_dir(self) -> Path:
        return self.root / "stat-index-v1"

    def put(self, trace: Trace, data: bytes | None = None) -> Path:
        """Store `trace` (serialised as `data` if given) under its source digest.

        Raises OSError if the cache is unwritable.
        """
        path = self.path_for(trace.source_digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            compiled.write(trace, path, durable=False)
        else:
            compiled.write_bytes(data, path, durable=False)
        return path

    def prune(self) -> int:
        """Delete the entries of other format or compiler versions; return how many dirs."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for child in self.root.iterdir():
            if (
                child.is_dir()
                and not child.is_symlink()
                and _VERSION_DIR.fullmatch(child.name)
                and child.name != self.directory.name
            ):
                shutil.rmtree(child, ignore_errors=True)
                removed += 1
        return removed

    @staticmethod
    def _discard(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
