"""Source files: reading (plain or gzip), digests, and grouping files into import units.

An import unit is what compiles into one Trace: a session file with its subagent,
compaction and resumed files, a Codex rollout, or a SWE-agent trajectory. Files are named
by a *label* (their path relative to the argument the user gave) in messages and never by
their absolute path, so nothing the project writes carries a machine's directory layout.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from traces.bounds import clip
from traces.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
#: Present in a directory while `traces import` writes into it (traces/load.py import_into):
#: the compiled files there are not yet a complete set, and every reader refuses them.
INCOMPLETE_MARKER = ".ctxsim-import-incomplete"
INCOMPLETE = "incomplete-import"
INCOMPLETE_MESSAGE = "a `traces import` into this directory did not finish; import again"
#: Largest source file read, plain or decompressed: 20 times the largest transcript in
#: ../shared/traces (under 50 MB), and under the int32 reach of the `chars` column.
MAX_SOURCE_BYTES = 1 << 30
#: Expansion allowed of a gzip file: JSONL transcripts compress 5-20x; gzip's own ceiling
#: is about 1030x, reached only by crafted repetition.
MAX_GZIP_RATIO = 200
#: Output below which no ratio is checked (a small file of repeated lines is no bomb).
GZIP_RATIO_FREE = 64 << 20


@dataclass(frozen=True)
class SourceFile:
    path: Path
    label: str

    def read(self) -> bytes:
        """The file's bytes, gunzipped when it is gzip (by content, not by name)."""
        try:
            size = self.path.stat().st_size
            if size > MAX_SOURCE_BYTES:
                raise TraceError(
                    self.label, 0, "too-large", f"file of {size} bytes exceeds {MAX_SOURCE_BYTES}"
                )
            data = self.path.read_bytes()
        except OSError as exc:
            raise TraceError(
                self.label, 0, "unreadable", f"cannot read file: {exc.strerror}"
            ) from exc
        if data[:2] == GZIP_MAGIC:
            return gunzip(data, self.label)
        return data


def gunzip(data: bytes, label: str) -> bytes:
    """`data` decompressed, read in chunks so that a bomb is refused before it fills memory:
    at most MAX_SOURCE_BYTES, and at most MAX_GZIP_RATIO times the compressed size beyond
    the first GZIP_RATIO_FREE bytes (issue 17, R17: a 6 MB .gz of 6 GiB)."""
    limit = min(MAX_SOURCE_BYTES, max(GZIP_RATIO_FREE, MAX_GZIP_RATIO * len(data)))
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            while chunk := fh.read(1 << 20):
                out += chunk
                if len(out) > limit:
                    raise TraceError(
                        label,
                        0,
                        "too-large",
                        f"gzip data expands beyond {limit} bytes (a decompression bomb?)",
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(label, 0, "bad-gzip", f"corrupt gzip data: {clip(str(exc))}") from exc
    return bytes(out)


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


def shown(name: str) -> str:
    """A file name as messages, labels and compiled names carry it: valid UTF-8 always. A
    name that is not UTF-8 (Python holds its bytes as surrogates, which no encoder takes:
    R13) shows each undecodable byte as `\\xNN`."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    return name


def iter_files(root: Path, suffixes: tuple[str, ...]) -> Iterator[SourceFile]:
    """Files under `root` (or `root` itself) with one of `suffixes` (optionally + .gz).

    A directory that cannot be listed is a TraceError naming it, never a silent gap in the
    corpus (issue 17: an unreadable subdirectory was skipped without a word). Directory
    symlinks are not followed, file symlinks are.
    """
    if root.is_file():
        yield SourceFile(root, shown(root.name))
        return
    base = root.parent

    def refuse(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else root
        try:
            label = str(where.relative_to(base))
        except ValueError:
            label = where.name
        raise TraceError(
            shown(label), 0, "unreadable", f"cannot read directory: {exc.strerror}"
        ) from None

    found: list[Path] = []
    for top, _dirs, names in os.walk(root, onerror=refuse):
        if INCOMPLETE_MARKER in names:
            label = shown(str(Path(top).relative_to(base)))
            raise TraceError(label, 0, INCOMPLETE, INCOMPLETE_MESSAGE)
        found.extend(Path(top, n) for n in names)
    for path in sorted(p for p in found if p.is_file()):
        name = path.name[:-3] if path.name.endswith(".gz") else path.name
        if name.endswith(suffixes):
            yield SourceFile(path, shown(str(path.relative_to(base))))
