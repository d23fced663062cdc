"""The compiled trace format (traces/compiled.py) and the compile cache (traces/cache.py)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.model import (
    BLOCK_COLUMNS,
    NEVER,
    REQUEST_COLUMNS,
    CompactionEvent,
    Flag,
    Kind,
    Role,
    Session,
    Trace,
    block_columns,
    request_columns,
)
from traces import cache as cache_mod
from traces import compiled
from traces.bounds import MAX_CONTEXT_TOKENS, MAX_TS_MS, MIN_TS_MS
from traces.cache import CompileCache, default_root
from traces.errors import TraceError

DIGEST = "3f" * 32

CURRENT_DIR = f"compiled-f{compiled.FORMAT_VERSION}-c{cache_mod.COMPILER_VERSION}"


def _session(n_blocks: int, n_requests: int, *, seed: int = 0, sid: str = "s") -> Session:
    rng = np.random.default_rng(seed)
    first = np.sort(rng.integers(0, max(n_requests, 1), n_blocks)).astype(np.int32)
    blocks: dict[str, npt.NDArray[Any]] = {
        "msg": np.arange(n_blocks, dtype=np.int32) // 2,
        "kind": rng.integers(0, len(Kind), n_blocks).astype(np.uint8),
        "role": rng.integers(0, len(Role), n_blocks).astype(np.uint8),
        "tool": rng.integers(-1, 3, n_blocks).astype(np.int32),
        "link": np.full(n_blocks, -1, dtype=np.int32),
        "tokens_raw": rng.integers(0, 5_000, n_blocks).astype(np.int32),
        "tokens": rng.integers(0, 5_000, n_blocks).astype(np.int32),
        "chars": rng.integers(0, 20_000, n_blocks).astype(np.int32),
        "hash": rng.integers(1, 2**63, n_blocks, dtype=np.uint64) * np.uint64(2),
        "ts": 1_700_000_000_000 + np.sort(rng.integers(0, 10**8, n_blocks)),
        "first_request": first,
        "hidden_from": np.full(n_blocks, NEVER, dtype=np.int32),
        "compacted_at": np.where(rng.random(n_blocks) < 0.1, first + 1, NEVER).astype(np.int32),
        "origin": np.where(rng.random(n_blocks) < 0.5, first, -1).astype(np.int32),
        "flags": rng.choice([0, Flag.HUMAN, Flag.ARTIFACT, Flag.PATH_READ], n_blocks).astype(
            np.uint8
        ),
        "path_hash": np.where(rng.random(n_blocks) < 0.2, np.uint64(2**64 - 1), 0).astype(
            np.uint64
        ),
        "file_tokens": rng.integers(-1, 30_000, n_blocks).astype(np.int32),
    }
    requests: dict[str, npt.NDArray[Any]] = {
        "ts": 1_700_000_000_000 + np.sort(rng.integers(0, 10**8, n_requests)),
        "model": np.zeros(n_requests, dtype=np.int32),
        "has_usage": rng.random(n_requests) < 0.8,
        "input": rng.integers(0, 10, n_requests),
        "cache_read": rng.integers(0, 200_000, n_requests),
        "cache_write_5m": rng.integers(0, 20_000, n_requests),
        "cache_write_1h": np.zeros(n_requests, dtype=np.int64),
        "output": rng.integers(0, 4_000, n_requests),
        "output_recorded": rng.integers(0, 4_000, n_requests),
        "prefix": rng.choice([-1, 14_000, 42_000], n_requests).astype(np.int64),
    }
    return Session(
        id=sid,
        kind="main",
        parent=-1,
        client="claude-code 2.1.9",
        prefix_tokens=14_000,
        tools=["Read", "Bash", "Grep"],
        models=["claude-sonnet-4-5-20250929"],
        blocks=block_columns(blocks),
        requests=request_columns(requests),
        events=[
            CompactionEvent(
                min(3, n_requests), "auto", 167_000, 7 if n_blocks > 7 else -1, 1_700_000_000_500
            )
        ],
    )


def _trace(*sessions: Session, digest: str = DIGEST) -> Trace:
    return Trace(
        format="claude-code",
        source_digest=digest,
        sessions=list(sessions),
        skipped={"invalid-json": 2, "unknown-type": 1},
        skipped_at=["file#0:17", "file#1:3"],
        stats={"lines": 120, "ignored:progress": 4},
    )


def _sample() -> Trace:
    main = _session(40, 8, seed=1, sid="main")
    sub = _session(12, 3, seed=2, sid="agent-a1")
    sub.kind, sub.parent = "subagent", 0
    empty = Session("agent-empty", "subagent", 0, "claude-code 2.1.9", 0, [], [])
    return _trace(main, empty, sub)


def _assert_same(a: Trace, b: Trace) -> None:
    """Trace.equals, plus dtypes (np.array_equal ignores them)."""
    assert a.equals(b)
    for sa, sb in zip(a.sessions, b.sessions, strict=True):
        for name in BLOCK_COLUMNS:
            assert sa.blocks[name].dtype == sb.blocks[name].dtype == np.dtype(BLOCK_COLUMNS[name])
        for name in REQUEST_COLUMNS:
            want = np.dtype(REQUEST_COLUMNS[name])
            assert sa.requests[name].dtype == sb.requests[name].dtype == want


def _rezip(data: bytes, replace: dict[str, bytes] | None = None, drop: str = "") -> bytes:
    """The archive with entries replaced or dropped (to build damaged files)."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name in src.namelist():
            if name != drop:
                zf.writestr(name, (replace or {}).get(name, src.read(name)))
    return out.getvalue()


def _meta(data: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = orjson.loads(zipfile.ZipFile(io.BytesIO(data)).read("meta.json"))
    return meta


def _category(data: bytes) -> str:
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(data, "bad.ctxt")
    assert info.value.file == "bad.ctxt"
    assert info.value.line == 0
    return info.value.category


def _v4(trace: Trace) -> bytes:
    """The trace as ctxsim wrote it before version 5: meta.json and two Parquet tables,
    each with a leading `session` column (the layout files shared then still have)."""
    meta = orjson.loads(compiled._meta(trace))
    meta["version"] = 4
    entries = {"meta.json": orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)}
    for entry, columns, schema, part in (
        ("blocks.parquet", BLOCK_COLUMNS, compiled.BLOCKS_SCHEMA, "blocks"),
        ("requests.parquet", REQUEST_COLUMNS, compiled.REQUESTS_SCHEMA, "requests"),
    ):
        parts = [getattr(s, part) for s in trace.sessions]
        lengths = [len(c) for c in parts]
        arrays = [pa.array(np.repeat(np.arange(len(parts), dtype=np.int32), lengths))]
        for name, dtype in columns.items():
            values = [np.asarray(c[name], dtype=dtype) for c in parts]
            merged = np.concatenate(values) if values else np.zeros(0, dtype=dtype)
            arrays.append(pa.array(merged, type=schema.field(name).type))
        sink = io.BytesIO()
        table = pa.Table.from_arrays(arrays, schema=schema)
        pq.write_table(table, sink, compression="zstd", write_statistics=False)
        entries[entry] = sink.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, raw in entries.items():
            zf.writestr(name, raw)
    return out.getvalue()


def _frame_arrays(data: bytes) -> dict[tuple[str, str], npt.NDArray[Any]]:
    """Every column of a version 5 file's `columns.zst`, as writable copies."""
    meta = _meta(data)
    rows = [sum(s[k] for s in meta["sessions"]) for k in ("n_blocks", "n_requests")]
    layout, size = compiled._layout(*rows)
    frame = zipfile.ZipFile(io.BytesIO(data)).read("columns.zst")
    raw = pa.Codec("zstd").decompress(frame, decompressed_size=size, asbytes=True)
    return {
        (table, name): np.frombuffer(raw, dtype=dtype, count=n, offset=offset).copy()
        for table, name, dtype, offset, n in layout
    }


def _with_frame(data: bytes, arrays: dict[tuple[str, str], npt.NDArray[Any]]) -> bytes:
    """The archive with `columns.zst` rebuilt from `arrays` (laid out as the writer does)."""
    meta = _meta(data)
    rows = [sum(s[k] for s in meta["sessions"]) for k in ("n_blocks", "n_requests")]
    layout, size = compiled._layout(*rows)
    raw = bytearray(size)
    for table, name, dtype, offset, n in layout:
        raw[offset : offset + n * dtype.itemsize] = arrays[(table, name)].tobytes()
    frame = pa.Codec("zstd").compress(bytes(raw), asbytes=True)
    return _rezip(data, {"columns.zst": frame})


# -- round trip ---------------------------------------------------------------------------


def test_round_trip_file(tmp_path: Path) -> None:
    trace = _sample()
    path = tmp_path / "t.ctxt"
    compiled.write(trace, path)
    back = compiled.read(path)
    _assert_same(trace, back)
    assert [len(s.blocks) for s in back.sessions] == [40, 0, 12]


def test_round_trip_zero_sessions() -> None:
    trace = Trace("codex", DIGEST, [])
    _assert_same(trace, compiled.from_bytes(compiled.to_bytes(trace)))


def test_round_trip_only_empty_sessions() -> None:
    trace = _trace(
        Session("a", "main", -1, "", 0, [], []), Session("b", "subagent", 0, "", 0, [], [])
    )
    _assert_same(trace, compiled.from_bytes(compiled.to_bytes(trace)))


def test_extreme_values_round_trip() -> None:
    s = _session(3, 2)
    s.blocks.data["hash"][:] = [0, 2**63, 2**64 - 1]
    # Block times: 0 (a line without a time) and the bounds of traces/bounds.py.
    s.blocks.data["ts"][:] = [MIN_TS_MS, 0, MAX_TS_MS]
    s.blocks.data["kind"][:] = 255
    s.events = [CompactionEvent(0, "unknown", -1, -1, -(2**63)), CompactionEvent(0, "", 0, 0, 0)]
    s.prefix_tokens = MAX_CONTEXT_TOKENS
    s.id, s.client, s.tools = "sé/ss\0ion ✓", "cl\u200bient", ["mcp__x__y", "", "Read"]
    _assert_same(_trace(s), compiled.from_bytes(compiled.to_bytes(_trace(s))))


def test_deterministic_bytes(tmp_path: Path) -> None:
    trace = _sample()
    first = compiled.to_bytes(trace)
    assert compiled.to_bytes(trace) == first
    # An equal trace built separately (other dict order) gives the same bytes.
    again = _sample()
    again.stats = dict(reversed(list(again.stats.items())))
    assert compiled.to_bytes(again) == first
    compiled.write(trace, tmp_path / "a.ctxt")
    compiled.write(compiled.read(tmp_path / "a.ctxt"), tmp_path / "b.ctxt")
    assert (tmp_path / "a.ctxt").read_bytes() == (tmp_path / "b.ctxt").read_bytes() == first


def test_archive_layout() -> None:
    trace = _sample()
    data = compiled.to_bytes(trace)
    zf = zipfile.ZipFile(io.BytesIO(data))
    infos = zf.infolist()
    assert [i.filename for i in infos] == ["meta.json", "columns.zst"]
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in infos)
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
    assert all(i.create_system == 3 and i.external_attr == 0o100644 << 16 for i in infos)
    raw = zf.read("meta.json")
    meta = orjson.loads(raw)
    assert orjson.dumps(meta, option=orjson.OPT_SORT_KEYS) == raw
    assert meta["format"] == "ctxsim compiled trace"
    assert meta["version"] == compiled.FORMAT_VERSION == 6
    assert meta["trace_format"] == "claude-code"
    assert [s["n_blocks"] for s in meta["sessions"]] == [40, 0, 12]
    frame = zf.read("columns.zst")
    assert frame[:4] == b"\x28\xb5\x2f\xfd"  # one zstd frame
    # 52 blocks and 11 requests: every column padded to 8 bytes, blocks then requests.
    widths = [np.dtype(t).itemsize for t in (*BLOCK_COLUMNS.values(), *REQUEST_COLUMNS.values())]
    rows = [52] * len(BLOCK_COLUMNS) + [11] * len(REQUEST_COLUMNS)
    size = sum(-(-n * w // 8) * 8 for n, w in zip(rows, widths, strict=True))
    decoded = pa.Codec("zstd").decompress(frame, decompressed_size=size, asbytes=True)
    tokens = np.concatenate([s.blocks["tokens"] for s in trace.sessions]).astype("<i4")
    offset = sum(-(-52 * np.dtype(t).itemsize // 8) * 8 for t in list(BLOCK_COLUMNS.values())[:6])
    assert list(BLOCK_COLUMNS)[6] == "tokens"
    assert decoded[offset : offset + 52 * 4] == tokens.tobytes()
    assert decoded[offset + 52 * 4 : offset + 208] == b""  # 208 is a multiple of 8: no pad
    has_usage = np.concatenate([s.requests["has_usage"] for s in trace.sessions])
    offset = size - sum(-(-11 * np.dtype(t).itemsize // 8) * 8 for t in REQUEST_COLUMNS.values())
    offset += sum(
        -(-11 * np.dtype(t).itemsize // 8) * 8 for t in list(REQUEST_COLUMNS.values())[:3]
    )
    assert list(REQUEST_COLUMNS)[3] == "has_usage"
    assert decoded[offset : offset + 16] == has_usage.tobytes() + bytes(5)  # 11 bytes, padded


def test_read_arrays_are_read_only_views() -> None:
    back = compiled.from_bytes(compiled.to_bytes(_sample()))
    for session in back.sessions:
        for cols in (session.blocks, session.requests):
            assert not any(a.flags.writeable for a in cols.data.values())
    tokens = back.sessions[0].blocks["tokens"]
    with pytest.raises(ValueError):
        tokens[0] = 1


def test_readme_recipe_polars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """traces/README.md shows how to read the tables; keep that snippet working."""
    readme = (Path(compiled.__file__).parent / "README.md").read_text()
    assert f"version {compiled.FORMAT_VERSION}" in readme.splitlines()[0]
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    trace = _sample()
    compiled.write(trace, tmp_path / "session.ctxt")
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(snippet, scope)
    blocks, requests, meta = scope["blocks"], scope["requests"], scope["meta"]
    assert blocks.columns == ["session", *BLOCK_COLUMNS]
    assert requests.columns == ["session", *REQUEST_COLUMNS]
    assert blocks.schema["hash"] == pl.UInt64
    assert blocks.schema["kind"] == pl.UInt8
    assert blocks.height == sum(s["n_blocks"] for s in meta["sessions"]) == 52
    assert scope["per_kind"]["tokens"].sum() == int(blocks["tokens"].sum())
    assert blocks.group_by("session").len().sort("session")["len"].to_list() == [40, 12]
    assert requests["cache_read"].to_list() == [
        v for s in trace.sessions for v in s.requests["cache_read"].tolist()
    ]


# -- property: random traces round-trip exactly -------------------------------------------

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_i64 = st.integers(-(2**63), 2**63 - 1)


def _ints(lo: int, hi: int, *also: int) -> st.SearchStrategy[int]:
    """Integers in [lo, hi] (shrinking towards the ends too) or one of `also`."""
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, *also]))


@st.composite
def _sessions(draw: st.DrawFn) -> Session:
    """A session whose every value lies in the range a reader can write (traces/bounds.py:
    10M tokens of context, 1M of output, times in 2020-2100; indices within their tables):
    the loader must give such a session back unchanged."""
    n, m = draw(st.integers(0, 12)), draw(st.integers(0, 6))
    tools = draw(st.lists(_text, max_size=4))
    models = draw(st.lists(_text, min_size=1 if m else 0, max_size=3))
    t, k = len(tools), len(models)

    def col(dtype: Any, values: st.SearchStrategy[int], size: int) -> npt.NDArray[Any]:
        return np.array(draw(st.lists(values, min_size=size, max_size=size)), dtype=dtype)

    u8, u64 = st.integers(0, 255), st.integers(0, 2**64 - 1)
    blocks = {
        "msg": col(np.int32, _ints(0, max(n - 1, 0)), n),
        "kind": col(np.uint8, u8, n),
        "role": col(np.uint8, u8, n),
        "tool": col(np.int32, _ints(-1, t - 1), n),
        "link": col(np.int32, _ints(-1, n - 1), n),
        "tokens_raw": col(np.int32, _ints(0, 10_000_000), n),
        "tokens": col(np.int32, _ints(0, 10_000_000), n),
        "chars": col(np.int32, _ints(0, 2**31 - 1), n),
        "hash": col(np.uint64, u64, n),
        "ts": col(np.int64, _ints(MIN_TS_MS, MAX_TS_MS, 0), n),
        "first_request": col(np.int32, _ints(0, m), n),
        "hidden_from": col(np.int32, _ints(0, m, NEVER), n),
        "compacted_at": col(np.int32, _ints(0, m, NEVER), n),
        "origin": col(np.int32, _ints(-1, m - 1), n),
        "flags": col(np.uint8, u8, n),
        "path_hash": col(np.uint64, u64, n),
        "file_tokens": col(np.int32, _ints(-1, 10_000_000), n),
    }
    ts = col(np.int64, _ints(MIN_TS_MS, MAX_TS_MS - 10**9), m)
    requests = {
        "ts": ts,
        "ts_end": ts + col(np.int64, _ints(0, 10**9), m),
        "model": col(np.int32, _ints(0, max(k - 1, 0)), m),
        "has_usage": col(np.bool_, st.booleans(), m),
        **{
            name: col(np.int64, _ints(0, 2_500_000), m)
            for name in ("input", "cache_read", "cache_write_5m", "cache_write_1h")
        },
        "output": col(np.int64, _ints(0, 1_000_000), m),
        "output_recorded": col(np.int64, _ints(0, 1_000_000), m),
        "prefix": col(np.int64, _ints(-1, 10_000_000), m),
    }
    events = draw(
        st.lists(
            st.builds(
                CompactionEvent,
                request=_ints(0, m),
                trigger=st.sampled_from(["auto", "manual", "unknown"]) | _text,
                pre_tokens=_i64,
                summary_block=_ints(-1, n - 1),
                ts=_i64,
            ),
            max_size=3,
        )
    )
    return Session(
        id=draw(_text),
        kind=draw(st.sampled_from(["main", "subagent", "compaction"])),
        parent=draw(st.integers(-1, 5)),
        client=draw(_text),
        prefix_tokens=draw(_ints(0, 10_000_000)),
        tools=tools,
        models=models,
        blocks=block_columns(blocks),
        requests=request_columns(requests),
        events=events,
    )


_traces = st.builds(
    Trace,
    format=st.sampled_from(["claude-code", "codex", "swe-agent"]),
    source_digest=st.text("0123456789abcdef", min_size=64, max_size=64),
    sessions=st.lists(_sessions(), max_size=4),
    skipped=st.dictionaries(_text, st.integers(0, 2**40), max_size=3),
    skipped_at=st.lists(_text, max_size=3),
    stats=st.dictionaries(_text, _i64, max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_traces)
def test_random_traces_round_trip(trace: Trace) -> None:
    data = compiled.to_bytes(trace)
    _assert_same(trace, compiled.from_bytes(data))
    assert compiled.to_bytes(trace) == data


# -- atomic writes ------------------------------------------------------------------------


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("stage", ["fsync", "replace"])
def test_failed_write_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    def boom(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, stage, boom)
    path = tmp_path / "t.ctxt"
    with pytest.raises(OSError):
        compiled.write(_sample(), path)
    assert not path.exists()
    assert _leftovers(tmp_path) == []


def test_failed_write_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.ctxt"
    old = _trace(_session(5, 2))
    compiled.write(old, path)
    before = path.read_bytes()
    real_fsync = os.fsync

    def fail_after_partial_write(fd: int) -> None:
        os.write(fd, b"garbage")  # the temporary file is half-written when it fails
        real_fsync(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail_after_partial_write)
    with pytest.raises(OSError):
        compiled.write(_sample(), path)
    assert path.read_bytes() == before
    _assert_same(compiled.read(path), old)
    assert _leftovers(tmp_path) == []


def test_serialisation_failure_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("writer crashed")

    monkeypatch.setattr(compiled, "_frame", boom)
    with pytest.raises(RuntimeError):
        compiled.write(_sample(), tmp_path / "t.ctxt")
    assert list(tmp_path.iterdir()) == []


def test_unserialisable_metadata_is_a_value_error(tmp_path: Path) -> None:
    trace = _sample()
    trace.stats = {"too-big": 2**70}
    with pytest.raises(ValueError, match="JSON"):
        compiled.to_bytes(trace)
    trace = _sample()
    trace.sessions[0].tools = ["Read", None]  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"sessions\[0\]\.tools must be a list of strings"):
        compiled.write(trace, tmp_path / "t.ctxt")
    assert list(tmp_path.iterdir()) == []


# -- errors -------------------------------------------------------------------------------


def test_newer_version_is_refused() -> None:
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    meta["version"] = compiled.FORMAT_VERSION + 1
    bad = _rezip(data, {"meta.json": orjson.dumps(meta)})
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(bad, "new.ctxt")
    assert info.value.category == "compiled-version"
    assert f"version {compiled.FORMAT_VERSION + 1} is newer" in info.value.message
    assert "upgrade ctxsim" in info.value.message


@pytest.mark.parametrize(
    "data",
    [b"", b"hello world", b'{"type": "user"}\n', b"\x1f\x8b\x08\x00gzip"],
    ids=["empty", "text", "jsonl", "gzip"],
)
def test_not_a_zip(data: bytes) -> None:
    assert _category(data) == "not-compiled"


def test_foreign_zip() -> None:
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    meta["format"] = "something else"
    assert _category(_rezip(data, {"meta.json": orjson.dumps(meta)})) == "not-compiled"


def test_truncated_file() -> None:
    data = compiled.to_bytes(_sample())
    assert _category(data[: len(data) // 2]) == "compiled-corrupt"


def test_crc_mismatch() -> None:
    data = bytearray(compiled.to_bytes(_sample()))
    offset = data.index(b"\x28\xb5\x2f\xfd") + 10  # inside columns.zst's stored bytes
    data[offset] ^= 0xFF
    assert _category(bytes(data)) == "compiled-corrupt"


@pytest.mark.parametrize(
    ("version", "entry"),
    [(5, "meta.json"), (5, "columns.zst"), (4, "blocks.parquet"), (4, "requests.parquet")],
)
def test_missing_entry(version: int, entry: str) -> None:
    whole = compiled.to_bytes(_sample()) if version == 5 else _v4(_sample())
    data = _rezip(whole, drop=entry)
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(data, "x.ctxt")
    assert info.value.category == "compiled-missing-entry"
    assert entry in info.value.message


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue())


def _blocks_table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(zipfile.ZipFile(io.BytesIO(data)).read("blocks.parquet")))


def test_schema_wrong_type() -> None:
    data = _v4(_sample())
    table = _blocks_table(data)
    i = table.schema.get_field_index("tokens")
    table = table.set_column(i, "tokens", table.column("tokens").cast(pa.int64()))
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"blocks.parquet": _parquet(table)}), "x.ctxt")
    assert info.value.category == "compiled-schema"
    assert "'tokens' is int64, expected int32" in info.value.message


def test_schema_missing_and_extra_columns() -> None:
    data = _v4(_sample())
    table = _blocks_table(data).drop_columns(["origin"]).append_column("x", pa.array([0] * 52))
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"blocks.parquet": _parquet(table)}), "x.ctxt")
    assert info.value.category == "compiled-schema"
    assert "missing column 'origin'" in info.value.message
    assert "unexpected columns ['x']" in info.value.message


def test_a_version_2_file_reads_with_unknown_file_sizes() -> None:
    """Version 2 had no `file_tokens`: such a file reads, with -1 (unknown) for every block."""
    trace = _sample()
    data = _v4(trace)
    meta = _meta(data)
    meta["version"] = 2
    table = _blocks_table(data).drop_columns(["file_tokens"])
    raw = zipfile.ZipFile(io.BytesIO(data)).read("requests.parquet")
    requests = pq.read_table(pa.BufferReader(raw)).drop_columns(["prefix"])
    old = _rezip(
        data,
        {
            "meta.json": orjson.dumps(meta, option=orjson.OPT_SORT_KEYS),
            "blocks.parquet": _parquet(table),
            "requests.parquet": _parquet(requests),
        },
    )
    back = compiled.from_bytes(old, "x.ctxt")
    for before, after in zip(trace.sessions, back.sessions, strict=True):
        assert (after.blocks["file_tokens"] == -1).all()
        for name in BLOCK_COLUMNS:
            if name != "file_tokens":
                assert np.array_equal(after.blocks[name], before.blocks[name])
    # A current file without the column is damaged, not old.
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"blocks.parquet": _parquet(table)}), "x.ctxt")
    assert "missing column 'file_tokens'" in info.value.message


def test_a_version_3_file_reads_with_the_session_prefix() -> None:
    """Version 3 had one prefix per session: its requests read with `prefix` -1, which
    `prefix_at` resolves to the session's `prefix_tokens`."""
    trace = _sample()
    data = _v4(trace)
    meta = _meta(data)
    meta["version"] = 3
    raw = zipfile.ZipFile(io.BytesIO(data)).read("requests.parquet")
    table = pq.read_table(pa.BufferReader(raw)).drop_columns(["prefix"])
    old = _rezip(
        data,
        {
            "meta.json": orjson.dumps(meta, option=orjson.OPT_SORT_KEYS),
            "requests.parquet": _parquet(table),
        },
    )
    back = compiled.from_bytes(old, "x.ctxt")
    for before, after in zip(trace.sessions, back.sessions, strict=True):
        assert (after.requests["prefix"] == -1).all()
        assert (after.prefix_at() == before.prefix_tokens).all()
        for name in REQUEST_COLUMNS:
            if name != "prefix":
                assert np.array_equal(after.requests[name], before.requests[name])
    assert not np.array_equal(back.sessions[0].prefix_at(), trace.sessions[0].prefix_at())
    # A version 4 file without the column is damaged, not old.
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"requests.parquet": _parquet(table)}), "x.ctxt")
    assert "missing column 'prefix'" in info.value.message


def test_nulls_are_refused() -> None:
    data = _v4(_sample())
    table = _blocks_table(data)
    i = table.schema.get_field_index("chars")
    chars = pa.array([None] + [1] * 51, type=pa.int32())
    table = table.set_column(i, pa.field("chars", pa.int32()), chars)
    bad = _rezip(data, {"blocks.parquet": _parquet(table)})
    assert _category(bad) == "compiled-schema"


def test_columns_in_other_order_are_accepted() -> None:
    """Column order is not part of the schema: a table rewritten by another tool still reads."""
    trace = _sample()
    data = _v4(trace)
    table = _blocks_table(data)
    table = table.select(list(reversed(table.column_names)))
    _assert_same(trace, compiled.from_bytes(_rezip(data, {"blocks.parquet": _parquet(table)})))


def test_deflated_archive_with_extra_entries_is_accepted() -> None:
    """A file re-zipped by another tool (deflate, an extra README) still reads."""
    trace = _sample()
    src = zipfile.ZipFile(io.BytesIO(compiled.to_bytes(trace)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("README.txt", "shared by someone")
        for name in reversed(src.namelist()):
            zf.writestr(name, src.read(name))
    _assert_same(trace, compiled.from_bytes(out.getvalue()))


@pytest.mark.parametrize("version", [5, 4])
def test_row_count_mismatch(version: int) -> None:
    data = compiled.to_bytes(_sample()) if version == 5 else _v4(_sample())
    meta = _meta(data)
    meta["sessions"][0]["n_blocks"] += 1
    assert _category(_rezip(data, {"meta.json": orjson.dumps(meta)})) == "compiled-corrupt"


def test_session_column_out_of_order() -> None:
    data = _v4(_sample())
    table = _blocks_table(data)
    table = table.take(pa.array(np.arange(table.num_rows)[::-1]))
    assert _category(_rezip(data, {"blocks.parquet": _parquet(table)})) == "compiled-corrupt"


def test_damaged_parquet() -> None:
    data = _v4(_sample())
    assert _category(_rezip(data, {"blocks.parquet": b"PAR1 nope PAR1"})) == "compiled-corrupt"


def test_a_version_4_file_still_reads() -> None:
    """Files shared before version 5 (two Parquet tables) read as they did."""
    trace = _sample()
    _assert_same(trace, compiled.from_bytes(_v4(trace)))


@pytest.mark.parametrize("frame", [b"", b"not zstd at all", b"\x28\xb5\x2f\xfd" + bytes(20)])
def test_damaged_frame(frame: bytes) -> None:
    data = _rezip(compiled.to_bytes(_sample()), {"columns.zst": frame})
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(data, "bad.ctxt")
    assert info.value.category == "compiled-corrupt"
    assert info.value.message.startswith("columns.zst does not decode to the ")


@pytest.mark.parametrize("change", [8, -8], ids=["longer", "shorter"])
def test_a_frame_of_another_size_than_announced_is_refused(change: int) -> None:
    """The frame must decode to exactly the bytes meta.json's row counts imply: a frame one
    column row longer or shorter is damaged, never read in part or past its end."""
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    rows = [sum(s[k] for s in meta["sessions"]) for k in ("n_blocks", "n_requests")]
    _, size = compiled._layout(*rows)
    frame = zipfile.ZipFile(io.BytesIO(data)).read("columns.zst")
    raw = pa.Codec("zstd").decompress(frame, decompressed_size=size, asbytes=True)
    raw = raw + bytes(change) if change > 0 else raw[:change]
    other = _rezip(data, {"columns.zst": pa.Codec("zstd").compress(raw, asbytes=True)})
    assert _category(other) == "compiled-corrupt"


def test_a_boolean_that_is_neither_0_nor_1_is_refused() -> None:
    data = compiled.to_bytes(_sample())
    arrays = _frame_arrays(data)
    arrays[("requests", "has_usage")].view(np.uint8)[4] = 2
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_with_frame(data, arrays), "crafted.ctxt")
    assert info.value.category == "compiled-corrupt"
    assert "'has_usage' holds a value other than 0 and 1" in info.value.message


def test_meta_not_json() -> None:
    data = _rezip(compiled.to_bytes(_sample()), {"meta.json": b"{not json"})
    assert _category(data) == "compiled-corrupt"


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.pop("source_digest"), "source_digest is missing"),
        (lambda m: m.update(version="1"), "version must be an integer"),
        (lambda m: m.update(version=0), "not a valid format version"),
        (lambda m: m.update(stats={"a": 1.5}), "stats must map names to integers"),
        (lambda m: m.update(sessions={}), "sessions must be a list of objects"),
        (lambda m: m["sessions"][0].update(tools=[1]), "sessions[0].tools must be a list"),
        (lambda m: m["sessions"][0]["events"][0].pop("ts"), "sessions[0].events[0].ts"),
        (lambda m: m["sessions"][1].update(parent=True), "sessions[1].parent must be an int"),
        (lambda m: m["sessions"][2].update(n_requests=-1), "must not be negative"),
        (lambda m: m.clear() or m.update(format="ctxsim compiled trace"), "version is missing"),
    ],
)
def test_meta_schema_errors(edit: Any, needle: str) -> None:
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    edit(meta)
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"meta.json": orjson.dumps(meta)}), "x.ctxt")
    assert info.value.category == "compiled-schema"
    assert needle in info.value.message


def test_meta_not_an_object() -> None:
    data = _rezip(compiled.to_bytes(_sample()), {"meta.json": b"[1, 2]"})
    assert _category(data) == "compiled-schema"


def test_unreadable_path_names_only_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as info:
        compiled.read(tmp_path / "absent.ctxt")
    assert info.value.category == "unreadable"
    assert info.value.file == "absent.ctxt"
    assert str(tmp_path) not in str(info.value)


# -- compile cache ------------------------------------------------------------------------


def test_cache_miss_put_hit(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    trace = _sample()
    assert cache.get(DIGEST) is None
    path = cache.put(trace)
    assert path == tmp_path / CURRENT_DIR / DIGEST[:2] / f"{DIGEST}.ctxt"
    hit = cache.get(DIGEST)
    assert hit is not None
    _assert_same(trace, hit)
    assert cache.get("ab" * 32) is None


def test_cache_put_overwrites(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    cache.put(_trace(_session(3, 1)))
    newer = _sample()
    cache.put(newer)
    hit = cache.get(DIGEST)
    assert hit is not None
    _assert_same(newer, hit)


@pytest.mark.parametrize(
    "damage",
    [b"", b"garbage", b"PK\x03\x04truncated"],
    ids=["empty", "garbage", "truncated-zip"],
)
def test_cache_corrupt_entry_is_a_miss_and_removed(tmp_path: Path, damage: bytes) -> None:
    cache = CompileCache(tmp_path)
    path = cache.put(_sample())
    path.write_bytes(damage)
    assert cache.get(DIGEST) is None
    assert not path.exists()
    cache.put(_sample())
    assert cache.get(DIGEST) is not None


def test_cache_entry_of_another_source_is_a_miss(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    other = "ab" * 32
    wrong = cache.path_for(other)
    wrong.parent.mkdir(parents=True)
    compiled.write(_sample(), wrong)  # holds DIGEST's trace under another digest
    assert cache.get(other) is None
    assert not wrong.exists()


def test_cache_invalidated_by_compiler_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CompileCache(tmp_path)
    old_path = cache.put(_sample())
    monkeypatch.setattr(cache_mod, "COMPILER_VERSION", cache_mod.COMPILER_VERSION + "-next")
    assert cache.get(DIGEST) is None
    new_path = cache.put(_sample())
    assert new_path != old_path
    assert cache.get(DIGEST) is not None
    assert cache.prune() == 1
    assert not old_path.exists()
    assert new_path.exists()


def test_cache_invalidated_by_format_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CompileCache(tmp_path)
    cache.put(_sample())
    monkeypatch.setattr(compiled, "FORMAT_VERSION", compiled.FORMAT_VERSION + 1)
    assert cache.get(DIGEST) is None


def test_cache_prune_leaves_other_files(tmp_path: Path) -> None:
    (tmp_path / "compiled-f0-c9").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "compiled-f0-c9.txt").write_text("x")
    cache = CompileCache(tmp_path)
    cache.put(_sample())
    assert cache.prune() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "compiled-f0-c9.txt",
        CURRENT_DIR,
        "notes",
    ]
    assert CompileCache(tmp_path / "absent").prune() == 0


@pytest.mark.parametrize("digest", ["", "../etc", "a/b", ".hidden", "x" * 129])
def test_cache_rejects_digests_that_are_not_file_names(tmp_path: Path, digest: str) -> None:
    with pytest.raises(ValueError):
        CompileCache(tmp_path).get(digest)


def test_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CTXSIM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_root() == tmp_path / "home" / ".cache" / "ctxsim"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_root() == tmp_path / "home" / ".cache" / "ctxsim"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "ctxsim"
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "mine"))
    assert default_root() == tmp_path / "mine"


# -- speed --------------------------------------------------------------------------------


def test_benchmark_read_100k_blocks(benchmark: Any, tmp_path: Path) -> None:
    path = tmp_path / "big.ctxt"
    trace = _trace(_session(100_000, 5_000))
    compiled.write(trace, path)
    back = benchmark(compiled.read, path)
    assert back.equals(trace)


# -- crafted values (issue 17: 76 tracebacks, 23 silently wrong results) ------------------


def _with_value(data: bytes, table: str, column: str, value: int) -> bytes:
    """The archive with row 0 (session 0) of `column` in `table` set to `value`."""
    arrays = _frame_arrays(data)
    arrays[(table, column)][0] = value
    return _with_frame(data, arrays)


@pytest.mark.parametrize(
    ("table", "column", "value", "name"),
    [
        ("blocks", "tokens", -1, "block tokens"),
        ("blocks", "tokens", 2**31 - 1, "block tokens"),  # R10: a wrapped count
        ("blocks", "tokens_raw", -5, "block tokens_raw"),
        ("blocks", "tool", 3, "block tool"),  # _sample has 3 tools
        ("blocks", "link", 40, "block link"),  # session 0 has 40 blocks
        ("blocks", "first_request", 9, "block first_request"),  # 8 requests
        ("blocks", "hidden_from", -3, "block hidden_from"),
        ("blocks", "origin", 8, "block origin"),
        ("blocks", "ts", -62_135_596_800_000, "block ts"),  # year 0001
        ("requests", "input", -1, "request input"),
        ("requests", "cache_write_5m", -1_000_000, "request cache_write_5m"),  # R03b
        ("requests", "cache_read", 2**62, "request cache_read"),  # R05b
        ("requests", "output", 10**12, "request output"),  # R07
        ("requests", "model", 1, "request model"),  # one model
        ("requests", "ts", 32_503_680_000_000, "request ts"),  # year 3000
        ("requests", "prefix", -2, "request prefix"),
    ],
)
def test_crafted_out_of_range_values_are_refused(
    table: str, column: str, value: int, name: str
) -> None:
    data = _with_value(compiled.to_bytes(_sample()), table, column, value)
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(data, "crafted.ctxt")
    assert info.value.category == "compiled-corrupt"
    assert str(info.value) == f"crafted.ctxt: session 0: {name} out of range [compiled-corrupt]"


def test_a_context_split_above_the_bound_is_refused() -> None:
    """Each split within 10M, their sum above it: no request sent that."""
    data = compiled.to_bytes(_sample())
    for column in ("input", "cache_read", "cache_write_5m"):
        data = _with_value(data, "requests", column, 4_000_000)
    with pytest.raises(TraceError, match="request context out of range"):
        compiled.from_bytes(data, "crafted.ctxt")


def test_an_event_past_the_requests_is_refused() -> None:
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    meta["sessions"][0]["events"][0]["request"] = 9
    raw = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
    with pytest.raises(TraceError, match="compaction event index out of range"):
        compiled.from_bytes(_rezip(data, {"meta.json": raw}), "crafted.ctxt")


def test_a_count_beyond_int64_in_meta_is_a_schema_error() -> None:
    data = compiled.to_bytes(_sample())
    meta = _meta(data)
    meta["sessions"][0]["n_requests"] = 2**64
    raw = json.dumps(meta, sort_keys=True).encode()  # orjson cannot write 2^64
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(_rezip(data, {"meta.json": raw}), "crafted.ctxt")
    assert info.value.category == "compiled-schema"


def test_a_table_that_decodes_far_beyond_its_size_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crafted 1 MB file decoded to 2.1 GB. 200,000 blocks of constant columns store in
    a few KB; with the free allowance lowered to 1 MiB their 14 MB decode is refused."""
    monkeypatch.setattr(compiled, "_DECODE_FREE", 1 << 20)
    n = 200_000
    blocks = {name: np.zeros(n, dtype=dtype) for name, dtype in BLOCK_COLUMNS.items()}
    blocks["ts"][:] = 1_700_000_000_000
    session = Session("s", "main", -1, "c", 0, [], [], blocks=block_columns(blocks))
    data = compiled.to_bytes(_trace(session))
    assert len(data) * 64 < n * 60
    with pytest.raises(TraceError, match="would decode to"):
        compiled.from_bytes(data, "bomb.ctxt")


def test_a_string_column_bomb_is_refused_before_it_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows times the schema's width bounds a table only when its columns are the schema's:
    a `tokens` column of strings, 200 rows of one 64 KiB value, stores in a few KB and
    would decode to 13 MB. The column types are checked before anything is decoded."""
    monkeypatch.setattr(compiled, "_DECODE_FREE", 1 << 20)
    data = _v4(_sample())
    table = pq.read_table(io.BytesIO(zipfile.ZipFile(io.BytesIO(data)).read("blocks.parquet")))
    n = 200
    columns = {name: pa.array(np.zeros(n, dtype=np.int64)) for name in table.schema.names}
    columns["tokens"] = pa.array(["9" * 65_536] * n)
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, compression="zstd")
    assert len(sink.getvalue()) * 64 < n * 65_536
    crafted = _rezip(data, {"blocks.parquet": sink.getvalue()})

    def no_decoding(*_: object, **__: object) -> None:
        raise AssertionError("the table was decoded")

    monkeypatch.setattr(pq.ParquetFile, "read", no_decoding)
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(crafted, "bomb.ctxt")
    assert info.value.category == "compiled-schema"
    assert str(info.value).startswith("bomb.ctxt: blocks.parquet: ")


def test_a_zip_member_that_would_extract_far_beyond_the_file_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deflated meta.json padded with 8 MB of spaces (deflate shrinks it to 8 KB) is
    refused from its declared size, before it is extracted."""
    monkeypatch.setattr(compiled, "_DECODE_FREE", 1 << 20)
    data = compiled.to_bytes(_sample())
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in src.namelist():
            raw = src.read(name)
            zf.writestr(name, raw + b" " * (8 << 20) if name == "meta.json" else raw)
    assert len(out.getvalue()) * 64 < 8 << 20
    with pytest.raises(TraceError) as info:
        compiled.from_bytes(out.getvalue(), "bomb.ctxt")
    assert info.value.category == "compiled-corrupt"
    assert "meta.json would extract to" in str(info.value)
