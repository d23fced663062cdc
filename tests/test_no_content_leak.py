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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simulator.model import BLOCK_COLUMNS, REQUEST_COLUMNS, Trace
from tests.support import Named, source_folders
from traces import compiled, swe_agent
from traces.load import TOOL_NAMES_ENV, load_unit, units

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


def _every_unit(shared: Path, shared_corpus: Callable[[str], Named]) -> Iterator[tuple[Any, Trace]]:
    """Every import unit of ../shared/traces with its trace, compiled once per test session
    (the `shared_corpus` fixture: this test compiled them again, two thirds of its time)."""
    for folder in source_folders(shared):
        found = units([shared / folder])
        traces = shared_corpus(folder)
        for unit, (name, trace) in zip(found, traces, strict=True):
            assert name.startswith(Path(unit.label).name.split(".")[0]), (unit.label, name)
            yield unit, trace


def test_compiled_traces_hold_no_content(
    shared: Path, shared_corpus: Callable[[str], Named]
) -> None:
    checked = 0
    every = list(_every_unit(shared, shared_corpus))
    assert len(every) == len(units([shared]))  # the source folders hold every unit
    for unit, trace in every:
        blob_bytes = compiled.to_bytes(trace)
        decoded = _decoded_bytes(blob_bytes)
        content: list[str] = []
        allowed: set[str] = set()
        for f in unit.files:
            for obj in _source_objects(f.path):
                _content_strings(obj, content)
                _metadata_strings(obj, allowed)
        allowed |= _schema_names(blob_bytes)
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
        for session in trace.sessions:
            assert not [t for t in session.tools if not _private_tool(t, unit.format)], unit.label
        checked += 1
    assert checked > 80


def _private_tool(name: str, fmt: str) -> bool:
    """A tool name an output may carry: no MCP server name, no shell command word."""
    if name.startswith("mcp__"):
        return re.fullmatch(r"mcp__[0-9a-f]{8}", name) is not None
    return fmt != "swe-agent" or name in swe_agent.OWN_COMMANDS


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


def _claude_with_tools(path: Path, tools: list[str]) -> Path:
    """A two-line Claude Code session whose one call uses each of `tools` in turn."""
    lines: list[dict[str, Any]] = [
        {
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "sessionId": "s1",
            "timestamp": "2026-01-01T00:00:00Z",
            "message": {"role": "user", "content": "go"},
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
                    {"type": "tool_use", "id": f"t{i}", "name": name, "input": {}}
                    for i, name in enumerate(tools)
                ],
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        },
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _tool_of_each_block(path: Path) -> tuple[list[str], list[str | None]]:
    (unit,) = units([path])
    (session, *_) = load_unit(unit).trace.sessions
    tools = session.tools
    return tools, [tools[t] if t >= 0 else None for t in session.blocks["tool"].tolist()]


def test_mcp_tool_names_leave_no_server_name(tmp_path: Path) -> None:
    """`mcp__<server>__<tool>` names the user's MCP server (issue 17): compiled, it is
    `mcp__` + a keyed hash, distinct per tool, and the built-in names stay."""
    server = "mcp__acme-payroll-prod__run_query"
    other = "mcp__acme-payroll-prod__list_tables"
    src = _claude_with_tools(tmp_path / "s1.jsonl", [server, "Read", other, server])
    tools, per_block = _tool_of_each_block(src)
    assert len(tools) == 3 and tools[1] == "Read"
    assert all(re.fullmatch(r"mcp__[0-9a-f]{8}", t) for t in (tools[0], tools[2]))
    assert per_block[-4:] == [tools[0], "Read", tools[2], tools[0]]
    (unit,) = units([src])
    decoded = _decoded_bytes(compiled.to_bytes(load_unit(unit).trace))
    assert b"acme" not in decoded and b"payroll" not in decoded


def test_tool_names_are_kept_when_the_user_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOOL_NAMES_ENV, "clear")
    server = "mcp__acme-payroll-prod__run_query"
    tools, _ = _tool_of_each_block(_claude_with_tools(tmp_path / "s1.jsonl", [server, "Read"]))
    assert tools == [server, "Read"]


def test_swe_agent_shell_words_are_classed_as_bash(tmp_path: Path) -> None:
    """A SWE-agent "tool" was the first word of each shell command (`acme-deploy`, `curl`):
    compiled, a shell command is `bash` and SWE-agent's own commands keep their names; the
    blocks of merged names point at the one `bash`."""
    doc = {
        "history": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "a", "action": "acme-deploy --prod\n"},
            {"role": "user", "content": "done"},
            {"role": "assistant", "content": "b", "action": "open src/x.py\n"},
            {"role": "user", "content": "shown"},
            {"role": "assistant", "content": "c", "action": "curl http://x\n"},
            {"role": "user", "content": "ok"},
            {"role": "assistant", "content": "d", "action": "submit\n"},
        ]
    }
    src = tmp_path / "run.traj"
    src.write_text(json.dumps(doc))
    tools, per_block = _tool_of_each_block(src)
    assert tools == ["bash", "open", "submit"]
    # each action's tool_use, then its observation's tool_result; `submit` has none
    uses = ["bash", "bash", "open", "open", "bash", "bash", "submit"]
    assert [t for t in per_block if t is not None] == uses
    decoded = _decoded_bytes(compiled.to_bytes(load_unit(units([src])[0]).trace))
    assert b"acme-deploy" not in decoded and b"curl" not in decoded


if __name__ == "__main__":
    pytest.main([__file__])
