"""No message text, tool input or path survives compilation.

For every real trace: decode the compiled file completely (meta.json as text, Parquet tables
as uncompressed Arrow bytes), take every printable run of 8 or more characters, and check
that none of them occurs in the source's content (message text, thinking, tool inputs, tool
results, file paths, working directories). The only runs allowed to occur there are values
of the source's own metadata fields (model ids, tool names, session ids, client versions),
which are not content and which a reader of results needs.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simulator.model import BLOCK_COLUMNS, REQUEST_COLUMNS
from traces import compiled
from traces.load import load_unit, units

PRINTABLE_RUN = re.compile(rb"[\x20-\x7e]{8,}")
CONTENT_KEYS = {"content", "text", "thinking", "input", "cwd", "output", "arguments", "data"}


def _content_strings(obj: Any, out: list[str], inside: bool = False) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            _content_strings(value, out, inside or key in CONTENT_KEYS)
    elif isinstance(obj, list):
        for value in obj:
            _content_strings(value, out, inside)
    elif isinstance(obj, str) and inside:
        out.append(obj)


def _metadata_strings(obj: Any, out: set[str]) -> None:
    """Values of non-content fields that a compiled trace may legitimately repeat."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            metadata = ("model", "name", "sessionId", "version", "agentId", "cli_version")
            if key in metadata and isinstance(value, str):
                out.add(value)
            if key not in CONTENT_KEYS or key == "input":
                _metadata_strings(value, out)
    elif isinstance(obj, list):
        for value in obj:
            _metadata_strings(value, out)


def _schema_names(blob: bytes) -> set[str]:
    """Column names, meta.json keys and enumerated values: the format's own vocabulary."""
    names: set[str] = set(BLOCK_COLUMNS) | set(REQUEST_COLUMNS) | {"session"}
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        names.update(zf.namelist())

        def keys(obj: Any) -> None:
            if isinstance(obj, dict):
                names.update(obj)
                for value in obj.values():
                    keys(value)
            elif isinstance(obj, list):
                for value in obj:
                    keys(value)

        meta = json.loads(zf.read("meta.json"))
        keys(meta)
        names.add(str(meta.get("format", "")))
    return names


def _source_objects(path: Path) -> list[Any]:
    data = path.read_bytes()
    try:
        return [json.loads(data)]
    except ValueError:
        pass
    objs = []
    for line in data.splitlines():
        try:
            objs.append(json.loads(line))
        except ValueError:
            continue
    return objs


def _decoded_bytes(blob: bytes) -> bytes:
    parts = []
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        for name in zf.namelist():
            raw = zf.read(name)
            if name.endswith(".parquet"):
                table = pq.read_table(io.BytesIO(raw))
                for column in table.schema:
                    assert not pa.types.is_string(column.type), column
                    assert not pa.types.is_binary(column.type), column
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table)
                raw = sink.getvalue().to_pybytes()
            parts.append(raw)
    return b"\n".join(parts)


def test_compiled_traces_hold_no_content(shared: Path) -> None:
    checked = 0
    for unit in units([shared]):
        if unit.format == "compiled":
            continue
        item = load_unit(unit, lenient=True)
        decoded = _decoded_bytes(compiled.to_bytes(item.trace))
        content: list[str] = []
        allowed: set[str] = set()
        for f in unit.files:
            for obj in _source_objects(f.path):
                _content_strings(obj, content)
                _metadata_strings(obj, allowed)
        allowed |= _schema_names(compiled.to_bytes(item.trace))
        blob = "\x00".join(content)
        # Runs of one or two distinct bytes are binary padding or numbers, not text.
        runs = {m.group().decode() for m in PRINTABLE_RUN.finditer(decoded)}
        runs = {r for r in runs if len(set(r)) > 2}
        leaks = [
            r
            for r in runs
            if r in blob and not any(r in a or a in r for a in allowed if len(a) >= 4)
        ]
        assert not leaks, (unit.label, sorted(leaks)[:5])
        checked += 1
    assert checked > 80


def test_planted_secret_does_not_survive(tmp_path: Path) -> None:
    """A hand-made transcript whose every field holds a marker: only the hashes remain."""
    secret = "hunter2-TOPSECRET-path/home/alice/project"
    lines = [
        {
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "sessionId": "s1",
            "timestamp": "2026-01-01T00:00:00Z",
            "cwd": secret,
            "message": {"role": "user", "content": f"please read {secret}"},
        },
        {
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "sessionId": "s1",
            "timestamp": "2026-01-01T00:00:05Z",
            "message": {
                "id": "m1",
                "model": "claude-sonnet-4-5-20250929",
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "Read",
                        "input": {"file_path": secret},
                    }
                ],
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        },
    ]
    src = tmp_path / "s1.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (unit,) = units([src])
    blob = compiled.to_bytes(load_unit(unit).trace)
    decoded = _decoded_bytes(blob)
    for i in range(len(secret) - 7):
        assert secret[i : i + 8].encode() not in decoded


if __name__ == "__main__":
    pytest.main([__file__])
