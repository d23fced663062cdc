"""ctxsim's compiled trace format (`.ctxt`): a content-free Trace on disk.

Compiling is the slow part (parsing, tokenizing, anchoring); sweeps read the compiled form
many times, and users share it instead of transcripts because it holds no message text.
The layout is documented in traces/README.md; in short, a ZIP archive of stored entries,
in this order:

- `meta.json`: format name and version, the trace's metadata and per-session metadata
  (compact JSON, sorted keys);
- `columns.zst`: every column of the blocks table, then every column of the requests
  table (every session's rows concatenated, in session order), each as little-endian
  fixed-width values padded to 8 bytes, compressed together as one zstd frame.

Version 5 replaced the two Parquet tables of versions 1-4 (`blocks.parquet`,
`requests.parquet`, still read) by the one frame. Issue 16: `from_bytes` of the warm compile
cache of the shared Claude Code corpus (178 files, 356 tables; one process, 5 rounds) took
0.29-0.40 s, almost all of it pyarrow's per-table and per-column overhead (the Parquet reads
alone 0.10-0.14 s), and every warm command (a sweep's serial part, `ctxsim run`) paid it
before its first request; in this format the same 178 files decode in 0.052-0.070 s (the
frames alone 0.015-0.035 s) and take 1.30 MB instead of 1.84 MB (Parquet compresses each
small column chunk apart). Arrow IPC tables were measured too (frames and tables alone):
zstd-compressed buffers 0.13-0.18 s (a codec call per buffer); plain buffers in a deflated
zip entry 0.04-0.05 s and 1.44 MB, but an IPC reader allocates what a compressed buffer
declares before anything can bound it (issue 17's bombs), where this frame decodes into
exactly the size that `meta.json`'s row counts imply, or fails.

Writing the same Trace twice gives identical bytes (fixed entry order and timestamps, a
fixed zstd level), so compiled files can be compared, deduplicated and cached by content.
Reading never raises anything but TraceError for a bad file, and gives read-only numpy
arrays that share memory with the decoded buffer (zero copy).
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from simulator.model import (
    BLOCK_COLUMNS,
    NEVER,
    REQUEST_COLUMNS,
    Columns,
    CompactionEvent,
    ForkContext,
    Session,
    Trace,
)
from simulator.view import FIVE_MINUTES, ONE_HOUR
from traces.bounds import MAX_CONTEXT_TOKENS, MAX_OUTPUT_TOKENS, MAX_TS_MS, clip
from traces.errors import TraceError
from traces.source import INCOMPLETE_MARKER as INCOMPLETE_MARKER

FORMAT_NAME = "ctxsim compiled trace"
#: Bumped on any change to the entries, columns, column types or meta.json fields.
FORMAT_VERSION = 6
SUFFIX = ".ctxt"

META = "meta.json"
COLUMNS = "columns.zst"
#: The entries of a file of this version.
ENTRIES = (META, COLUMNS)
#: The tables of versions 1 to 4 (Parquet, one per table), read still.
BLOCKS = "blocks.parquet"
REQUESTS = "requests.parquet"
PARQUET_ENTRIES = (META, BLOCKS, REQUESTS)

#: Error categories (TraceError.category) raised by `read` / `from_bytes`.
NOT_COMPILED = "not-compiled"
VERSION = "compiled-version"
MISSING_ENTRY = "compiled-missing-entry"
SCHEMA = "compiled-schema"
CORRUPT = "compiled-corrupt"
UNREADABLE = "unreadable"

#: Decoding limit of a table: at most _MAX_DECODE_RATIO times its stored size, beyond the
#: first _DECODE_FREE bytes. ctxsim's own tables decode to 0.5-2.1 times their size (the
#: samples; the random 8-byte block hash keeps zstd from doing better); a crafted 1 MB file
#: of constant columns decoded to 2.1 GB (issue 17).
_MAX_DECODE_RATIO = 64
_DECODE_FREE = 64 << 20


def _decode_limit(stored: int) -> int:
    """The most bytes an entry or table of `stored` bytes may decode to."""
    return max(_DECODE_FREE, _MAX_DECODE_RATIO * stored)


_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_LOCAL_HEADER = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"
#: zstd level of `columns.zst` (level 1 as the Parquet tables had: the corpus's frames
#: take 1.12 MB; higher levels gain little on 8-byte random hashes and cost compile time).
_ZSTD_LEVEL = 1
#: Each column starts at a multiple of this many bytes of the frame (zeros between), so
#: every array read from it is aligned for its type.
_ALIGN = 8


def _arrow_schema(columns: dict[str, Any]) -> pa.Schema:
    fields = [pa.field("session", pa.int32(), nullable=False)]
    fields += [
        pa.field(name, pa.from_numpy_dtype(np.dtype(dtype)), nullable=False)
        for name, dtype in columns.items()
    ]
    return pa.schema(fields)


#: The Parquet tables of versions 1 to 4 (read only), each with a leading `session` column.
BLOCKS_SCHEMA = _arrow_schema(BLOCK_COLUMNS)
REQUESTS_SCHEMA = _arrow_schema(REQUEST_COLUMNS)
#: Version 1 had no `ts_end` (a response's end); reading one, it defaults to `ts`.
REQUESTS_SCHEMA_V1 = _arrow_schema(
    {k: v for k, v in REQUEST_COLUMNS.items() if k not in ("ts_end", "prefix")}
)
#: Versions 1 to 3 had no per-request `prefix`; reading one, it is -1 (the session's
#: `prefix_tokens`) throughout.
REQUESTS_SCHEMA_V3 = _arrow_schema({k: v for k, v in REQUEST_COLUMNS.items() if k != "prefix"})
#: Versions 1 and 2 had no `file_tokens`; reading one, it is -1 (unknown) throughout.
BLOCKS_SCHEMA_V2 = _arrow_schema({k: v for k, v in BLOCK_COLUMNS.items() if k != "file_tokens"})


# -- writing ------------------------------------------------------------------------------


def to_bytes(trace: Trace) -> bytes:
    """The compiled file's bytes; equal traces give equal bytes."""
    meta = _meta(trace)
    columns = _frame(trace)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in ((META, meta), (COLUMNS, columns)):
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # the default depends on the platform
            info.external_attr = 0o100644 << 16
            zf.writestr(info, data)
    return out.getvalue()


def write(trace: Trace, path: Path, *, durable: bool = True) -> None:
    """Write atomically: readers see the old file or the complete new one, never a part.

    `durable=False` skips the fsyncs (for the compile cache, where an entry lost to a crash
    is only a miss).
    """
    data = to_bytes(trace)  # serialise first: a failure here touches nothing on disk
    _atomic_write(Path(path), data, durable=durable)


def write_bytes(data: bytes, path: Path, *, durable: bool = True) -> None:
    """Atomically write an already serialised compiled trace (a copy out of the cache)."""
    _atomic_write(Path(path), data, durable=durable)


def _atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), 0o644)  # mkstemp's 0600 would hide shared files
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _meta(trace: Trace) -> bytes:
    sessions = [
        {
            "id": s.id,
            "kind": s.kind,
            "parent": operator.index(s.parent),
            "client": s.client,
            "prefix_tokens": operator.index(s.prefix_tokens),
            "tools": list(s.tools),
            "models": list(s.models),
            "events": [
                {
                    "request": operator.index(e.request),
                    "trigger": e.trigger,
                    "pre_tokens": operator.index(e.pre_tokens),
                    "summary_block": operator.index(e.summary_block),
                    "ts": operator.index(e.ts),
                    **_call_usage_meta(e.call_usage),
                    **_call_ms_meta(e.call_ms),
                }
                for e in s.events
            ],
            "n_blocks": len(s.blocks),
            "n_requests": len(s.requests),
            **_context_windows_meta(s.context_windows),
            **_restored_meta(s.restored_at),
            **_restarted_meta(s.restarted_at),
            **_fork_meta(s.fork),
            **({"skill_listing": operator.index(s.skill_listing)} if s.skill_listing >= 0 else {}),
        }
        for s in trace.sessions
    ]
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "trace_format": trace.format,
        "source_digest": trace.source_digest,
        "skipped": {k: operator.index(v) for k, v in trace.skipped.items()},
        "skipped_at": list(trace.skipped_at),
        "stats": {k: operator.index(v) for k, v in trace.stats.items()},
        "sessions": sessions,
    }
    try:
        raw = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"trace metadata cannot be written as JSON: {exc}") from exc
    try:  # never write a file that `read` would refuse (e.g. a tool name that is None)
        _parse_meta(raw, "<trace being written>")
    except TraceError as exc:
        raise ValueError(f"trace metadata is malformed: {exc.message}") from exc
    return raw


def _padded(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


#: (table, column, little-endian dtype) of every column of `columns.zst`, in order: the
#: blocks' columns, then the requests', each in its schema's order.
_FRAME_COLUMNS = [
    (table, name, np.dtype(dtype).newbyteorder("<"))
    for table, columns in (("blocks", BLOCK_COLUMNS), ("requests", REQUEST_COLUMNS))
    for name, dtype in columns.items()
]


def _layout(n_blocks: int, n_requests: int) -> tuple[list[tuple[str, str, Any, int, int]], int]:
    """(table, column, dtype, offset, rows) of every column of `columns.zst` for a trace of
    these many rows, and the frame's decoded size."""
    out = []
    offset = 0
    for table, name, dtype in _FRAME_COLUMNS:
        rows = n_blocks if table == "blocks" else n_requests
        out.append((table, name, dtype, offset, rows))
        offset += _padded(rows * dtype.itemsize)
    return out, offset


def _frame(trace: Trace) -> bytes:
    """`columns.zst`: every column, all sessions concatenated, one zstd frame."""
    n_blocks = sum(len(s.blocks) for s in trace.sessions)
    n_requests = sum(len(s.requests) for s in trace.sessions)
    layout, size = _layout(n_blocks, n_requests)
    raw = bytearray(size)
    for table, name, dtype, offset, rows in layout:
        parts = [s.blocks if table == "blocks" else s.requests for s in trace.sessions]
        values = [np.asarray(c[name], dtype=dtype) for c in parts]
        merged = np.concatenate(values) if values else np.zeros(0, dtype=dtype)
        raw[offset : offset + rows * dtype.itemsize] = merged.tobytes()
    codec = pa.Codec("zstd", compression_level=_ZSTD_LEVEL)
    return bytes(codec.compress(bytes(raw), asbytes=True))


# -- reading ------------------------------------------------------------------------------


def peek(path: Path) -> tuple[str, dict[str, int]] | None:
    """(source digest, what --lenient skipped, by category) from meta.json alone."""
    try:
        with zipfile.ZipFile(path) as zf:
            if zf.getinfo(META).file_size > _DECODE_FREE:
                return None
            meta = orjson.loads(zf.read(META))
    except (  # what a damaged archive raises (the fuzz test's cache cases found EOFError)
        OSError,
        KeyError,
        ValueError,
        EOFError,
        NotImplementedError,
        RuntimeError,
        zlib.error,
        zipfile.BadZipFile,
    ):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("source_digest"), str):
        return None
    skipped = meta.get("skipped")
    if not isinstance(skipped, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in skipped.values()
    ):
        return None
    return meta["source_digest"], {str(k): int(v) for k, v in skipped.items()}


def read(path: Path, label: str | None = None) -> Trace:
    """Read a `.ctxt` file; errors name `label` (default: the file name, never its path)."""
    path = Path(path)
    label = label if label is not None else path.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(label, 0, UNREADABLE, f"cannot read file: {exc.strerror}") from None
    return from_bytes(data, label)


def from_bytes(data: bytes | bytearray | memoryview, label: str = "<bytes>") -> Trace:
    """Decode a compiled trace; any problem is a TraceError with one of the categories above."""
    meta, entries = _unzip(bytes(data), label)
    sessions_meta = meta["sessions"]
    n_blocks = np.array([s["n_blocks"] for s in sessions_meta], dtype=np.int64)
    n_requests = np.array([s["n_requests"] for s in sessions_meta], dtype=np.int64)
    version = meta["version"]
    if version >= 5:
        blocks, requests = _read_frame(entries[COLUMNS], n_blocks, n_requests, label)
    else:
        blocks_schema = BLOCKS_SCHEMA_V2 if version < 3 else BLOCKS_SCHEMA
        blocks = _read_table(entries[BLOCKS], BLOCKS, blocks_schema, n_blocks, label)
        request_schema = (
            REQUESTS_SCHEMA_V1
            if version == 1
            else REQUESTS_SCHEMA_V3
            if version < 4
            else REQUESTS_SCHEMA
        )
        requests = _read_table(entries[REQUESTS], REQUESTS, request_schema, n_requests, label)
    sessions = [
        Session(
            id=s["id"],
            kind=s["kind"],
            parent=s["parent"],
            client=s["client"],
            prefix_tokens=s["prefix_tokens"],
            tools=s["tools"],
            models=s["models"],
            blocks=Columns(BLOCK_COLUMNS, b),
            requests=Columns(REQUEST_COLUMNS, r),
            events=s["events"],
            context_windows=s["context_windows"],
            restored_at=s["restored_at"],
            restarted_at=s["restarted_at"],
            fork=s["fork"],
            skill_listing=s["skill_listing"],
        )
        for s, b, r in zip(sessions_meta, blocks, requests, strict=True)
    ]
    for i, session in enumerate(sessions):
        problem = _value_problem(session)
        if problem is not None:
            raise TraceError(label, 0, CORRUPT, f"session {i}: {problem}")
    return Trace(
        format=meta["trace_format"],
        source_digest=meta["source_digest"],
        sessions=sessions,
        skipped=meta["skipped"],
        skipped_at=meta["skipped_at"],
        stats=meta["stats"],
    )


def check(data: bytes, label: str = "<bytes>") -> dict[str, Any]:
    """The validated meta.json of a compiled file whose every zip member extracts with its
    CRC: what a cache hit must pass before it is used or copied (a flipped or truncated
    byte anywhere fails it, R18), at a small part of decoding's cost."""
    return _unzip(bytes(data), label)[0]


_EXTRACT_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
)


def _unzip(data: bytes, label: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The validated meta.json and the entries its version has, each extracted with its
    CRC checked."""
    looks_zip = data[:4] in (_LOCAL_HEADER, _EMPTY_ZIP)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        if looks_zip:
            raise TraceError(label, 0, CORRUPT, f"damaged zip archive: {clip(str(exc))}") from None
        raise TraceError(
            label, 0, NOT_COMPILED, "not a ctxsim compiled trace (not a zip archive)"
        ) from None
    with zf:
        names = set(zf.namelist())
        if META not in names:
            raise TraceError(label, 0, MISSING_ENTRY, f"compiled trace lacks {META}")
        meta = _parse_meta(_extract(zf, META, len(data), label), label)
        wanted = ENTRIES if meta["version"] >= 5 else PARQUET_ENTRIES
        missing = [name for name in wanted if name not in names]
        if missing:
            raise TraceError(label, 0, MISSING_ENTRY, f"compiled trace lacks {', '.join(missing)}")
        out = {name: _extract(zf, name, len(data), label) for name in wanted if name != META}
    return meta, out


def _extract(zf: zipfile.ZipFile, name: str, stored: int, label: str) -> bytes:
    """One member's bytes, refused from its declared size when that is far beyond the file's."""
    size = zf.getinfo(name).file_size
    if size > _decode_limit(stored):
        raise TraceError(label, 0, CORRUPT, f"{name} would extract to {size} bytes")
    try:
        return zf.read(name)
    except _EXTRACT_ERRORS as exc:
        raise TraceError(label, 0, CORRUPT, f"cannot extract {name}: {clip(str(exc))}") from None


# -- meta.json validation: a malformed file must fail with a message, never a KeyError -----


def _fail(label: str, message: str) -> TraceError:
    return TraceError(label, 0, SCHEMA, f"{META}: {message}")


def _get(obj: dict[str, Any], key: str, where: str, label: str) -> Any:
    if key not in obj:
        raise _fail(label, f"{where}{key} is missing")
    return obj[key]


def _int(obj: dict[str, Any], key: str, where: str, label: str) -> int:
    value = _get(obj, key, where, label)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise _fail(label, f"{where}{key} must be an integer (64-bit)")
    return value


def _str(obj: dict[str, Any], key: str, where: str, label: str) -> str:
    value = _get(obj, key, where, label)
    if not isinstance(value, str):
        raise _fail(label, f"{where}{key} must be a string")
    return value


def _str_list(obj: dict[str, Any], key: str, where: str, label: str) -> list[str]:
    value = _get(obj, key, where, label)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(label, f"{where}{key} must be a list of strings")
    return value


def _counts(obj: dict[str, Any], key: str, where: str, label: str) -> dict[str, int]:
    value = _get(obj, key, where, label)
    if not isinstance(value, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value.values()
    ):
        raise _fail(label, f"{where}{key} must map names to integers")
    return value


def _list(obj: dict[str, Any], key: str, where: str, label: str) -> list[Any]:
    value = _get(obj, key, where, label)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _fail(label, f"{where}{key} must be a list of objects")
    return value


def _context_windows_meta(windows: list[int]) -> dict[str, list[int]]:
    """A session's `context_windows` entry: absent when the recording logged none."""
    return {"context_windows": [operator.index(w) for w in windows]} if windows else {}


def _context_windows(s: dict[str, Any], where: str, label: str) -> list[int]:
    """A session's optional `context_windows` (version 4 on): one window per model, each
    positive or -1 (none logged for that model)."""
    if "context_windows" not in s:
        return []
    v = s["context_windows"]
    n_models = len(s.get("models", []))
    if (
        not isinstance(v, list)
        or len(v) != n_models
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in v)
        or any(w == 0 or w < -1 for w in v)
    ):
        raise _fail(label, f"{where}context_windows is not one window (or -1) per model")
    return list(v)


def _restored_meta(restored: list[int]) -> dict[str, list[int]]:
    """A session's `restored_at` entry: absent when the client never resumed a rewritten
    rollout (every session but a few), so other compiled files are unchanged."""
    return {"restored_at": [operator.index(k) for k in restored]} if restored else {}


def _restarted_meta(restarted: list[int]) -> dict[str, list[int]]:
    """A session's `restarted_at` entry: absent when one client process sent every request
    (most sessions), so their compiled meta is as before the field existed."""
    return {"restarted_at": [operator.index(k) for k in restarted]} if restarted else {}


def _restored_at(s: dict[str, Any], where: str, label: str, name: str = "restored_at") -> list[int]:
    """A session's optional `restored_at` (or `restarted_at`, `name`): ascending request
    indices within the session; absent in files written before the field existed."""
    if name not in s:
        return []
    v = s[name]
    n = s.get("n_requests", 0)
    if (
        not isinstance(v, list)
        or not all(isinstance(k, int) and not isinstance(k, bool) for k in v)
        or any(not 0 <= k < n for k in v)
        or v != sorted(set(v))
    ):
        raise _fail(label, f"{where}{name} is not ascending request indices")
    return list(v)


def _fork_meta(fork: ForkContext | None) -> dict[str, list[int]]:
    """A session's `fork` entry: absent for a session that is no fork (all but a few), so
    other compiled files are unchanged."""
    if fork is None:
        return {}
    values = (fork.block, fork.sent_ms, fork.end_ms, fork.ttl_ms)
    return {"fork": [operator.index(v) for v in values]}


def _fork(s: dict[str, Any], where: str, label: str) -> ForkContext | None:
    """A session's optional `fork`: a block of the session, two times in order and a TTL
    of 5 minutes or 1 hour; absent in files written before the field existed."""
    if "fork" not in s:
        return None
    v = s["fork"]
    ok = isinstance(v, list) and len(v) == 4
    ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    if not ok or not (
        0 <= v[0] < s.get("n_blocks", 0)
        and 0 <= v[1] <= v[2] <= MAX_TS_MS
        and v[3] in (FIVE_MINUTES, ONE_HOUR)
    ):
        raise _fail(label, f"{where}fork is not a block, two times in order and a TTL")
    return ForkContext(v[0], v[1], v[2], v[3])


def _skill_listing(s: dict[str, Any], where: str, label: str) -> int:
    """A session's optional `skill_listing`: a token count; -1 when absent (no listing
    logged, or a file written before the field existed)."""
    if "skill_listing" not in s:
        return -1
    v = s["skill_listing"]
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_CONTEXT_TOKENS:
        raise _fail(label, f"{where}skill_listing is not a token count")
    return v


def _call_usage_meta(usage: tuple[int, int, int, int, int] | None) -> dict[str, list[int]]:
    """An event's `call_usage` entry: absent when the recording logged no compaction call."""
    return {} if usage is None else {"call_usage": [operator.index(v) for v in usage]}


def _call_usage(e: dict[str, Any], where: str, label: str) -> tuple[int, int, int, int, int] | None:
    """An event's optional `call_usage`: five non-negative counts (version 4 on)."""
    if "call_usage" not in e:
        return None
    v = e["call_usage"]
    ok = isinstance(v, list) and len(v) == 5
    if not ok or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise _fail(label, f"{where}call_usage is not five counts")
    return v[0], v[1], v[2], v[3], v[4]


def _call_ms_meta(ms: tuple[int, int] | None) -> dict[str, list[int]]:
    """An event's `call_ms` entry: absent when the recording did not time its call."""
    return {} if ms is None else {"call_ms": [operator.index(v) for v in ms]}


def _call_ms(e: dict[str, Any], where: str, label: str) -> tuple[int, int] | None:
    """An event's optional `call_ms`: when the call was sent and its response ended, two
    times in range, the second not before the first (version 6 on)."""
    if "call_ms" not in e:
        return None
    v = e["call_ms"]
    ok = isinstance(v, list) and len(v) == 2
    if not ok or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _fail(label, f"{where}call_ms is not two times")
    if not 0 <= v[0] <= v[1] <= MAX_TS_MS:
        raise _fail(label, f"{where}call_ms {v} is not a send and a later end in range")
    return v[0], v[1]


def _parse_meta(raw: bytes, label: str) -> dict[str, Any]:
    """The validated meta.json, with every field present and of the right type."""
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(label, 0, CORRUPT, f"{META} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise _fail(label, "must be a JSON object")
    if meta.get("format") != FORMAT_NAME:
        raise TraceError(
            label, 0, NOT_COMPILED, f"zip archive is not a {FORMAT_NAME} (format field)"
        )
    version = _int(meta, "version", "", label)
    if version > FORMAT_VERSION:
        raise TraceError(
            label,
            0,
            VERSION,
            f"compiled trace format version {version} is newer than this ctxsim reads "
            f"({FORMAT_VERSION}); upgrade ctxsim or compile the source again",
        )
    if version < 1:
        raise _fail(label, f"version {version} is not a valid format version")
    out: dict[str, Any] = {
        "version": version,
        "trace_format": _str(meta, "trace_format", "", label),
        "source_digest": _str(meta, "source_digest", "", label),
        "skipped": _counts(meta, "skipped", "", label),
        "skipped_at": _str_list(meta, "skipped_at", "", label),
        "stats": _counts(meta, "stats", "", label),
    }
    sessions = []
    for i, s in enumerate(_list(meta, "sessions", "", label)):
        where = f"sessions[{i}]."
        events = []
        for j, e in enumerate(_list(s, "events", where, label)):
            ew = f"{where}events[{j}]."
            events.append(
                CompactionEvent(
                    request=_int(e, "request", ew, label),
                    trigger=_str(e, "trigger", ew, label),
                    pre_tokens=_int(e, "pre_tokens", ew, label),
                    summary_block=_int(e, "summary_block", ew, label),
                    ts=_int(e, "ts", ew, label),
                    call_usage=_call_usage(e, ew, label),
                    call_ms=_call_ms(e, ew, label),
                )
            )
        session: dict[str, Any] = {
            "id": _str(s, "id", where, label),
            "kind": _str(s, "kind", where, label),
            "parent": _int(s, "parent", where, label),
            "client": _str(s, "client", where, label),
            "prefix_tokens": _int(s, "prefix_tokens", where, label),
            "tools": _str_list(s, "tools", where, label),
            "models": _str_list(s, "models", where, label),
            "events": events,
            "n_blocks": _int(s, "n_blocks", where, label),
            "n_requests": _int(s, "n_requests", where, label),
            "context_windows": _context_windows(s, where, label),
            "restored_at": _restored_at(s, where, label),
            "restarted_at": _restored_at(s, where, label, "restarted_at"),
            "fork": _fork(s, where, label),
            "skill_listing": _skill_listing(s, where, label),
        }
        if not (0 <= session["n_blocks"] < 2**31 and 0 <= session["n_requests"] < 2**31):
            raise _fail(
                label, f"{where}n_blocks and n_requests must not be negative nor reach 2^31"
            )
        sessions.append(session)
    out["sessions"] = sessions
    return out


# -- columns.zst (version 5 on) -----------------------------------------------------------

Split = list[dict[str, npt.NDArray[Any]]]


def _read_frame(
    raw: bytes, n_blocks: npt.NDArray[np.int64], n_requests: npt.NDArray[np.int64], label: str
) -> tuple[Split, Split]:
    """Decode `columns.zst` into per-session column dicts of both tables (views, no copies).

    The decoded size follows from the row counts of meta.json (every column fixed-width),
    so it is bounded before anything is decoded, and the frame must decode to exactly that
    size (the codec refuses a frame that is larger or smaller)."""
    layout, size = _layout(int(n_blocks.sum()), int(n_requests.sum()))
    limit = _decode_limit(len(raw))
    if size > limit:
        raise TraceError(label, 0, CORRUPT, f"{COLUMNS} of {len(raw)} bytes would decode to {size}")
    try:
        buffer = pa.Codec("zstd").decompress(raw, decompressed_size=size)
    except Exception as exc:  # pyarrow raises OSError or ArrowInvalid for a damaged frame
        raise TraceError(
            label,
            0,
            CORRUPT,
            f"{COLUMNS} does not decode to the {size} bytes {META} announces: {clip(str(exc))}",
        ) from None
    tables: dict[str, dict[str, npt.NDArray[Any]]] = {"blocks": {}, "requests": {}}
    for table, name, dtype, offset, rows in layout:
        array: npt.NDArray[Any] = np.frombuffer(buffer, dtype=dtype, count=rows, offset=offset)
        array.flags.writeable = False
        if dtype == np.bool_ and rows and int(array.view(np.uint8).max()) > 1:
            raise TraceError(
                label, 0, CORRUPT, f"{COLUMNS}: column {name!r} holds a value other than 0 and 1"
            )
        tables[table][name] = array
    return _split(tables["blocks"], n_blocks), _split(tables["requests"], n_requests)


def _split(arrays: dict[str, npt.NDArray[Any]], counts: npt.NDArray[np.int64]) -> Split:
    """Whole-table columns cut into each session's rows (views)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    bounds = offsets.tolist()
    return [
        {name: a[bounds[i] : bounds[i + 1]] for name, a in arrays.items()}
        for i in range(len(counts))
    ]


# -- Parquet tables (versions 1 to 4) ------------------------------------------------------


def _read_table(
    raw: bytes, entry: str, schema: pa.Schema, counts: npt.NDArray[np.int64], label: str
) -> list[dict[str, npt.NDArray[Any]]]:
    """Decode one table of a version 1-4 file and split it into per-session column dicts
    (views, no copies)."""
    import pyarrow.parquet as pq  # only files of those versions need it

    try:
        # Single-threaded on purpose: sweeps parallelise across processes, and Arrow's
        # thread pool can abort the interpreter at exit (apache/arrow#34314; seen here
        # in about 2% of runs with polars loaded). ParquetFile also skips the dataset
        # layer, which costs ~1 ms per call on small tables.
        pf = pq.ParquetFile(pa.BufferReader(raw))
        # The columns' types first: with only the fixed-width columns of the schema, rows
        # times width bounds the decoded size; a string column of one repeated megabyte
        # value would not be bounded by its row count.
        _check_schema(pf.schema_arrow, schema, entry, label)
        meta = pf.metadata
        width = sum((f.type.bit_width + 7) // 8 for f in schema)
        declared = sum(
            meta.row_group(i).column(j).total_uncompressed_size
            for i in range(meta.num_row_groups)
            for j in range(meta.num_columns)
        )
        size = max(meta.num_rows * width, declared)
        limit = _decode_limit(len(raw))
        if size > limit:
            raise TraceError(
                label, 0, CORRUPT, f"{entry} of {len(raw)} bytes would decode to {size}"
            )
        table = pf.read(use_threads=False)
    except TraceError:
        raise
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise TraceError(
            label, 0, CORRUPT, f"{entry} is not readable Parquet: {clip(str(exc))}"
        ) from None
    _check_schema(table.schema, schema, entry, label)
    total = int(counts.sum())
    if table.num_rows != total:
        raise TraceError(
            label,
            0,
            CORRUPT,
            f"{entry} has {table.num_rows} rows, {META} announces {total}",
        )
    for name in schema.names:
        if table.column(name).null_count:
            raise TraceError(label, 0, SCHEMA, f"{entry}: column {name!r} holds nulls")
    arrays = {name: _to_numpy(table.column(name), schema.field(name).type) for name in schema.names}
    session = arrays.pop("session")
    if total and not np.array_equal(
        session, np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    ):
        raise TraceError(
            label,
            0,
            CORRUPT,
            f"{entry}: session column does not match the sessions in {META} "
            "(rows must be grouped by session, in session order)",
        )
    return _split(arrays, counts)


def _outside(a: npt.NDArray[Any], lo: int, hi: int, *also: int) -> bool:
    """Whether any value of `a` lies outside [lo, hi] and is none of `also`."""
    if not len(a):
        return False
    bad = (a < lo) | (a > hi)
    for v in also:
        bad &= a != v
    return bool(bad.any())


def _value_problem(session: Session) -> str | None:
    """Why a session's columns hold impossible values, or None.

    The schema check proves types only; a crafted or damaged file can still hold a negative
    size, an index past its table or a year-3000 time, which would crash a policy or price
    an impossible call (issue 17: 76 tracebacks, 23 wrong results from crafted files). The
    bounds are the readers' (traces/bounds.py), so every file ctxsim wrote passes them;
    times only from 0, not MIN_TS_MS: SWE-agent trajectories and synthetic sessions run on a
    clock that starts at the epoch (traces/swe_agent.py).
    """
    b, r = session.blocks.data, session.requests.data
    n_blocks, n_req = len(b["tokens"]), len(r["ts"])
    n_tools, n_models = len(session.tools), len(session.models)
    checks: list[tuple[str, bool]] = [
        ("block tokens", _outside(b["tokens"], 0, MAX_CONTEXT_TOKENS)),
        ("block tokens_raw", _outside(b["tokens_raw"], 0, MAX_CONTEXT_TOKENS)),
        ("block chars", _outside(b["chars"], 0, np.iinfo(np.int32).max)),
        ("block msg", _outside(b["msg"], 0, max(n_blocks - 1, 0))),
        ("block tool", _outside(b["tool"], -1, n_tools - 1)),
        ("block link", _outside(b["link"], -1, n_blocks - 1)),
        ("block first_request", _outside(b["first_request"], 0, n_req)),
        ("block hidden_from", _outside(b["hidden_from"], 0, n_req, NEVER)),
        ("block compacted_at", _outside(b["compacted_at"], 0, n_req, NEVER)),
        ("block origin", _outside(b["origin"], -1, n_req - 1)),
        ("block file_tokens", _outside(b["file_tokens"], -1, MAX_CONTEXT_TOKENS)),
        ("block ts", _outside(b["ts"], 0, MAX_TS_MS)),
        ("request model", _outside(r["model"], 0, n_models - 1)),
        ("request ts", _outside(r["ts"], 0, MAX_TS_MS)),
        ("request ts_end", _outside(r["ts_end"], 0, MAX_TS_MS)),
        ("request output", _outside(r["output"], 0, MAX_OUTPUT_TOKENS)),
        ("request output_recorded", _outside(r["output_recorded"], 0, MAX_OUTPUT_TOKENS)),
        ("request prefix", _outside(r["prefix"], -1, MAX_CONTEXT_TOKENS)),
    ]
    for name in ("input", "cache_read", "cache_write_5m", "cache_write_1h"):
        checks.append((f"request {name}", _outside(r[name], 0, MAX_CONTEXT_TOKENS)))
    for name, bad in checks:
        if bad:
            return f"{name} out of range"
    if n_req:
        context = r["input"] + r["cache_read"] + r["cache_write_5m"] + r["cache_write_1h"]
        if int(context.max()) > MAX_CONTEXT_TOKENS:
            return "request context out of range"
        if bool((r["ts_end"] < r["ts"]).any()):
            return "request ts_end before ts"
    if not 0 <= session.prefix_tokens <= MAX_CONTEXT_TOKENS:
        return "prefix_tokens out of range"
    for e in session.events:
        if not 0 <= e.request <= n_req or not -1 <= e.summary_block < n_blocks:
            return "compaction event index out of range"
    return None


def _check_schema(actual: pa.Schema, expected: pa.Schema, entry: str, label: str) -> None:
    """Names and types must match (nullability is checked on the data, not the schema)."""
    problems = []
    have = {f.name: f.type for f in actual}
    for field in expected:
        if field.name not in have:
            problems.append(f"missing column {field.name!r}")
        elif have[field.name] != field.type:
            problems.append(f"column {field.name!r} is {have[field.name]}, expected {field.type}")
    extra = [name for name in have if name not in expected.names]
    if extra:
        problems.append(f"unexpected columns {extra}")
    if problems:
        raise TraceError(label, 0, SCHEMA, f"{entry}: " + "; ".join(problems))


def _to_numpy(column: pa.ChunkedArray, dtype: pa.DataType) -> npt.NDArray[Any]:
    """A read-only numpy view of a null-free Arrow column (a copy only for bool/chunks)."""
    if column.num_chunks == 1:
        chunk = column.chunk(0)
    elif column.num_chunks == 0:
        chunk = pa.array([], type=dtype)
    else:
        chunk = pa.concat_arrays(column.chunks)
    array: npt.NDArray[Any] = chunk.to_numpy(zero_copy_only=False)
    array.flags.writeable = False
    return array
