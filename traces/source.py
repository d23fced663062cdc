"""Source files: reading (plain or gzip), digests, and grouping files into import units.

An import unit is what compiles into one Trace: a session file with its subagent,
compaction and resumed files, a Codex rollout, or a SWE-agent trajectory. Files are named
by a *label* (their path relative to the argument the user gave) in messages and never by
their absolute path, so nothing the project writes carries a machine's directory layout.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from traces.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class SourceFile:
    path: Path
    label: str

    def read(self) -> bytes:
        """The file's bytes, gunzipped when it is gzip (by content, not by name)."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise TraceError(
                self.label, 0, "unreadable", f"cannot read file: {exc.strerror}"
            ) from exc
        if data[:2] == GZIP_MAGIC:
            try:
                return gzip.decompress(data)
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceError(self.label, 0, "bad-gzip", f"corrupt gzip data: {exc}") from exc
        return data


@dataclass
class ImportUnit:
    """Files that compile into one trace; `files[0]` is the main one."""

    format: str
    files: list[SourceFile]
    #: Role of each file beyond the first: "resume" (a session file that repeats calls of
    #: another, traces/discover.py), "subagent" or "compaction".
    roles: list[str] = field(default_factory=list)
    _memo: tuple[int, str, bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return self.files[0].label

    def fingerprint(self, contents: list[bytes]) -> tuple[str, bytes]:
        """(digest, key) of the unit's bytes in one pass over them.

        `key` (sha256 over the bytes and their roles) keys the content hashes; `digest`, the
        compile-cache key stored in the compiled trace, is a hash *of* the key, so holding a
        compiled trace does not reveal its hashing key. Remembered for the `contents` list
        last given, so readers and the loader share one pass.
        """
        memo = self._memo
        if memo is not None and memo[0] == id(contents):
            return memo[1], memo[2]
        h = hashlib.sha256(b"ctxsim-unit-v1\0" + self.format.encode())
        for role, data in zip(["main", *self.roles], contents, strict=True):
            h.update(role.encode() + b"\0" + len(data).to_bytes(8, "little"))
            h.update(data)
        key = h.digest()
        digest = hashlib.sha256(b"ctxsim-source-digest\0" + key).hexdigest()
        self._memo = (id(contents), digest, key)
        return digest, key

    def digest(self, contents: list[bytes]) -> str:
        """The compile-cache key of these bytes."""
        return self.fingerprint(contents)[0]

    def forget(self) -> None:
        self._memo = None


def iter_files(root: Path, suffixes: tuple[str, ...]) -> Iterator[SourceFile]:
    """Files under `root` (or `root` itself) with one of `suffixes` (optionally + .gz)."""
    if root.is_file():
        yield SourceFile(root, root.name)
        return
    base = root
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.name[:-3] if path.name.endswith(".gz") else path.name
        if name.endswith(suffixes):
            yield SourceFile(path, str(path.relative_to(base.parent)))
