"""The SWE-agent trajectory reader: hand-computed expectations on tiny fixtures, bad input,
and every real trajectory in ../shared/traces/swe-agent checked against the raw JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.model import Flag, Kind, Role, Session, Trace
from tests import support
from tests.support import SHARED
from tests.support.leak_words import content_words, trace_strings
from traces import swe_agent
from traces.errors import Problems, TraceError
from traces.source import ImportUnit, SourceFile
from traces.tokens import count_tokens

FIXTURES = support.FIXTURES / "swe_agent"
SYSTEM = (
    "SETTING: you are a careful programmer working in a sandboxed terminal with custom commands."
)


def _read_bytes(data: bytes, label: str = "run.traj", *, lenient: bool = False) -> Trace:
    unit = ImportUnit("swe-agent", [SourceFile(Path(label), label)])
    return swe_agent.read(unit, [data], Problems(lenient=lenient))


def _read_doc(doc: Any, *, lenient: bool = False) -> Trace:
    return _read_bytes(json.dumps(doc).encode(), lenient=lenient)


def _read(path: Path, *, lenient: bool = False) -> Trace:
    unit = ImportUnit("swe-agent", [SourceFile(path, path.name)])
    return swe_agent.read(unit, [path.read_bytes()], Problems(lenient=lenient))


def _col(s: Session, name: str) -> list[int]:
    return [int(v) for v in s.blocks[name]]


def _tools(s: Session) -> list[str | None]:
    return [s.tools[t] if t >= 0 else None for t in s.blocks["tool"]]


# -- fixtures ---------------------------------------------------------------------------------


def test_text_actions_shape() -> None:
    """Older shape: observations are user messages, the action is written in the content."""
    trace = _read(FIXTURES / "text_actions.traj")
    (s,) = trace.sessions
    assert (s.id, s.kind, s.client) == ("text_actions", "main", "swe-agent")
    assert s.prefix_tokens == count_tokens(SYSTEM)  # the system prompt is the prefix
    assert s.n_requests == 4
    assert s.models == ["unknown"]
    assert not s.requests["has_usage"].any()
    # Synthetic clock: request k at k * 10 s.
    assert swe_agent.STEP_MS == 10_000
    assert [int(t) for t in s.requests["ts"]] == [0, 10_000, 20_000, 30_000]
    T, TU, TR = Kind.TEXT, Kind.TOOL_USE, Kind.TOOL_RESULT
    assert _col(s, "kind") == [T, T, T, TU, TR, T, TU, TR, T, TU, TR, T, TU]
    assert _col(s, "first_request") == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert _col(s, "origin") == [-1, -1, 0, 0, -1, 1, 1, -1, 2, 2, -1, 3, 3]
    step = swe_agent.STEP_MS  # inputs: the request that first sees them; outputs: their own
    assert _col(s, "ts") == [0, 0, 0, 0] + [step] * 3 + [2 * step] * 3 + [3 * step] * 3
    assert _col(s, "link") == [-1, -1, -1, 4, 3, -1, 7, 6, -1, 10, 9, -1, -1]
    tools = [None, None, None, "open", "open", None, "edit", "edit", None, "python", "python"]
    assert _tools(s) == [*tools, None, "submit"]
    R, W, G, H = Flag.PATH_READ, Flag.PATH_WRITE, Flag.REGENERABLE, Flag.HUMAN
    assert _col(s, "flags") == [0, H, 0, R, R | G, 0, W, W, 0, 0, G, 0, 0]
    paths = _col(s, "path_hash")
    assert paths[3] == paths[4] == paths[6] == paths[7] != 0  # edit writes the open file
    # The action is split off the content: the two blocks hold all of it, nothing twice.
    content = "Inspecting the narwhal module first.\n```\nopen src/narwhal_math.py\n```"
    assert int(s.blocks["chars"][2]) + int(s.blocks["chars"][3]) == len(content)
    assert trace.stats["model_api_calls"] == 4
    assert trace.stats["model_tokens_sent"] == 4321
    assert trace.stats["model_tokens_received"] == 123
    assert trace.stats["messages"] == 10
    assert trace.stats["messages_demo"] == 1
    assert trace.stats["requests"] == 4
    assert trace.skipped == {}


def test_function_call_shape() -> None:
    """Newer shape: tool_calls and tool messages linked by ids (which can repeat)."""
    trace = _read(FIXTURES / "function_calls.traj")
    (s,) = trace.sessions
    assert s.client == "swe-agent 1.2.3"
    assert s.models == ["fixture-model-7"]
    assert s.prefix_tokens == count_tokens(SYSTEM)  # content given as a list of text items
    assert s.n_requests == 2
    T, TU, TR = Kind.TEXT, Kind.TOOL_USE, Kind.TOOL_RESULT
    assert _col(s, "kind") == [T, T, T, T, TU, TR, T, TU, TU, TR, TR]
    assert _col(s, "role") == [
        Role.USER,
        Role.ASSISTANT,  # a demonstration's assistant turn: input text, not a request
        Role.USER,
        Role.ASSISTANT,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.ASSISTANT,
        Role.ASSISTANT,
        Role.USER,
        Role.USER,
    ]
    assert _col(s, "first_request") == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    assert _col(s, "origin") == [-1, -1, -1, 0, 0, -1, 1, 1, 1, -1, -1]
    # "call_same" is used twice: the second observation links to the second use.
    assert _col(s, "link") == [-1, -1, -1, -1, 5, 4, -1, 10, 9, 8, 7]
    assert _tools(s)[4:] == [
        "str_replace_editor",
        "str_replace_editor",
        None,
        "cat",
        "python",
        "python",
        "cat",
    ]
    R, G, H = Flag.PATH_READ, Flag.REGENERABLE, Flag.HUMAN
    assert _col(s, "flags") == [0, 0, H, 0, R, R | G, 0, R, 0, G, R | G]
    assert trace.stats["messages_demo"] == 2


def test_trajectory_without_history() -> None:
    doc = {
        "trajectory": [
            {"response": "look around", "action": "ls -la", "observation": "a b c"},
            {"response": "read it", "action": "cat b", "observation": "bee"},
        ]
    }
    (s,) = _read_doc(doc).sessions
    assert s.n_requests == 2
    assert s.prefix_tokens == 0
    assert _col(s, "kind") == [Kind.TEXT, Kind.TOOL_USE, Kind.TOOL_RESULT] * 2
    assert _col(s, "first_request") == [1, 1, 1, 2, 2, 2]
    assert _tools(s) == [None, "ls", "ls", None, "cat", "cat"]
    assert _col(s, "flags")[4:] == [Flag.PATH_READ, Flag.PATH_READ | Flag.REGENERABLE]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("open src/a.py 40", "open"),
        ("python -m pytest", "python"),
        ("  edit 3:4\nx\nend_of_edit", "edit"),
        ("./reproduce_bug.sh", "bash"),
        ("/usr/bin/env python3", "bash"),
        ("FOO=1 make", "bash"),
        ("", "bash"),
        ("x" * 25, "bash"),
    ],
)
def test_tool_name(command: str, expected: str) -> None:
    assert swe_agent.tool_name(command) == expected


@pytest.mark.parametrize(
    ("command", "open_file", "expected"),
    [
        ("open src/a.py 40", None, (Flag.PATH_READ, "src/a.py")),
        ('open "src/b c.py"', None, (Flag.PATH_READ, "src/b c.py")),
        ("create new.py", None, (Flag.PATH_WRITE, "new.py")),
        ("edit 1:2\nx\nend_of_edit", "a.py", (Flag.PATH_WRITE, "a.py")),
        ("edit 1:2\nx\nend_of_edit", None, (Flag.NONE, None)),
        ("scroll_down", "a.py", (Flag.PATH_READ, "a.py")),
        ("str_replace_editor view /r/x.py", None, (Flag.PATH_READ, "/r/x.py")),
        ("str_replace_editor str_replace /r/x.py --old_str a", None, (Flag.PATH_WRITE, "/r/x.py")),
        ("cat notes.md", None, (Flag.PATH_READ, "notes.md")),
        ("python x.py > out.txt", None, (Flag.PATH_WRITE, "out.txt")),
        ("find_file a.py", None, (Flag.NONE, None)),
    ],
)
def test_command_file_access(
    command: str, open_file: str | None, expected: tuple[Flag, str | None]
) -> None:
    assert swe_agent.command_file_access(command, open_file) == expected


# -- bad input --------------------------------------------------------------------------------


def _doc_with(message: Any) -> dict[str, Any]:
    return {
        "history": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            message,
            {"role": "assistant", "content": "x", "action": "ls"},
        ]
    }


@pytest.mark.parametrize(
    ("message", "category"),
    [
        ("not an object", "wrong-type"),
        ({"content": "no role"}, "missing-field"),
        ({"role": 5, "content": "x"}, "wrong-type"),
        ({"role": "wizard", "content": "x"}, "unknown-type"),
        ({"role": "user"}, "missing-field"),
        ({"role": "user", "content": 17}, "wrong-type"),
        ({"role": "user", "content": [{"type": "text", "text": 3}]}, "wrong-type"),
        ({"role": "assistant", "content": "x", "action": ["ls"]}, "wrong-type"),
        ({"role": "assistant", "content": "x", "tool_calls": "ls"}, "wrong-type"),
        ({"role": "assistant", "content": "x", "tool_calls": [{"function": {}}]}, "missing-field"),
    ],
)
def test_bad_message(message: Any, category: str) -> None:
    with pytest.raises(TraceError) as err:
        _read_bytes(json.dumps(_doc_with(message)).encode(), "runs/bad.traj")
    assert (err.value.file, err.value.line, err.value.category) == ("runs/bad.traj", 1, category)
    trace = _read_doc(_doc_with(message), lenient=True)
    assert trace.skipped == {category: 1}
    assert trace.skipped_at == ["file#0:1"]
    (s,) = trace.sessions
    assert s.n_requests == 1  # the good messages around it still count
    assert trace.stats["messages_ignored"] == 1


@pytest.mark.parametrize(
    ("data", "line", "category"),
    [
        (b"", 1, "empty-file"),
        (b"   \n  ", 1, "empty-file"),
        (b'{\n  "history": [\n    {"role": "user",, }\n  ]\n}\n', 3, "invalid-json"),
        (b'{\n  "history": [\n', 3, "invalid-json"),
        (b"\x00\x01\x02\x03\xff\xfe\x00\x00 binary", 1, "binary-garbage"),
        (b"[1, 2]", 1, "wrong-type"),
        (b'{"history": {"role": "user"}}', 1, "wrong-type"),
        (b'{"info": {}}', 1, "missing-field"),
        (b'{"history": [], "info": []}', 1, "wrong-type"),
        (b'{"history": [], "info": {"model_stats": 3}}', 1, "wrong-type"),
    ],
)
def test_bad_document(data: bytes, line: int, category: str) -> None:
    with pytest.raises(TraceError) as err:
        _read_bytes(data, "runs/bad.traj")
    assert (err.value.file, err.value.line, err.value.category) == ("runs/bad.traj", line, category)
    trace = _read_bytes(data, "runs/bad.traj", lenient=True)
    assert trace.skipped == {category: 1}
    assert trace.sessions[0].n_requests == 0


# -- no content in the trace ------------------------------------------------------------------

CONTENT_KEYS = {"content", "text", "thought", "action", "arguments", "observation", "response"}


@pytest.mark.parametrize("name", ["text_actions.traj", "function_calls.traj"])
def test_no_content_reaches_the_trace(name: str) -> None:
    path = FIXTURES / name
    words: set[str] = set()
    content_words(json.loads(path.read_text()), CONTENT_KEYS, words)
    assert len(words) > 10
    strings = trace_strings(_read(path))
    # Tool names are command names the action starts with; they are metadata, not content.
    leaks = [w for w in words for s in strings if w in s and w not in ("str_replace_editor",)]
    assert not leaks


# -- every real trajectory --------------------------------------------------------------------


def _real_files() -> list[Path]:
    return sorted((SHARED / "swe-agent").rglob("*.traj")) if SHARED.is_dir() else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(c["text"] for c in content if c.get("type") == "text")


@pytest.mark.shared
@pytest.mark.parametrize(
    "path", _real_files() or [None], ids=lambda p: "/".join(p.parts[-2:])[-40:] if p else "none"
)
def test_real_trajectory(path: Path | None) -> None:
    if path is None:
        pytest.skip("../shared/traces is absent")
    trace = _read(path)  # strict: every trajectory imports without a problem
    (s,) = trace.sessions
    history = json.loads(path.read_text(encoding="utf-8"))["history"]
    assistant = [m for m in history if m["role"] == "assistant" and not m.get("is_demo")]
    assert s.n_requests == len(assistant)
    system = next(m for m in history if m["role"] == "system")
    assert s.prefix_tokens == count_tokens(_text(system["content"]))
    assert [int(t) for t in s.requests["ts"]] == [
        k * swe_agent.STEP_MS for k in range(s.n_requests)
    ]
    assert not s.requests["has_usage"].any()
    b = s.blocks
    assert int(((b["flags"] & Flag.HUMAN) != 0).sum()) == 1  # the task statement only
    out = b["origin"] >= 0
    assert bool((b["first_request"][out] == b["origin"][out] + 1).all())
    assert bool((np.diff(b["first_request"]) >= 0).all())
    results = np.nonzero(b["kind"] == Kind.TOOL_RESULT)[0]
    assert len(results) > 0
    for i in results:
        use = int(b["link"][i])
        assert b["kind"][use] == Kind.TOOL_USE and b["link"][use] == i
        assert b["tool"][use] == b["tool"][i]
        assert b["flags"][i] & (Flag.REGENERABLE | Flag.PATH_WRITE)
    # Each non-demo message made at least one block; demonstrations are never HUMAN.
    demo = sum(1 for m in history if m.get("is_demo"))
    assert trace.stats["messages_demo"] == demo
    assert trace.stats["messages_ignored"] == 0
    api_calls = trace.stats.get("model_api_calls", 0)
    assert api_calls in (0, s.n_requests, s.n_requests + 1)


# -- problems located on their line (issue 17: every SWE-agent error said line 1) -------------


@pytest.mark.parametrize(
    ("message", "category"),
    [
        ("not an object", "wrong-type"),
        ({"role": "wizard", "content": "x, [y]: {z}"}, "unknown-type"),
        ({"role": "user", "content": 17}, "wrong-type"),
    ],
)
def test_a_bad_message_of_an_indented_trajectory_names_its_line(
    message: Any, category: str
) -> None:
    """json.dumps(indent=2) of _doc_with: `{`, `"history": [`, then the system message
    (4 lines: `{`, role, content, `},`) and the user message (4 more) put the third
    element, an object or a bare string, on line 11."""
    data = json.dumps(_doc_with(message), indent=2).encode()
    with pytest.raises(TraceError) as err:
        _read_bytes(data, "runs/bad.traj")
    assert (err.value.line, err.value.category) == (11, category)
    trace = _read_bytes(data, "runs/bad.traj", lenient=True)
    assert trace.skipped_at == ["file#0:11"]


def test_lines_of_keys_and_elements_survive_brackets_and_quotes_in_strings() -> None:
    data = (
        b'{\n "note": "a [ { , \\" ] }",\n "history": [\n  "s1",\n'
        b'  {"content": "],[,{"},\n\n  [1, [2, 3]],\n  4\n ],\n "info": {"x": [1]}\n}\n'
    )
    lines = swe_agent._Lines(data)
    assert [lines.element("history", i) for i in range(4)] == [4, 5, 7, 8]
    assert (lines.key("note"), lines.key("history"), lines.key("info")) == (2, 3, 10)
    assert lines.element("history", 4) == 3  # no such element: the array's own line
    assert lines.key("absent") == 1
    empty = swe_agent._Lines(b'{\n "history": [\n ]\n}')
    assert empty.element("history", 0) == 2


def test_a_bad_info_names_its_line() -> None:
    data = b'{\n  "history": [],\n  "info": []\n}\n'
    with pytest.raises(TraceError) as err:
        _read_bytes(data, "runs/bad.traj")
    assert (err.value.line, err.value.category) == (3, "wrong-type")


def test_a_bad_step_of_an_indented_trajectory_names_its_line() -> None:
    steps = [{"action": "ls", "observation": "x", "response": "y"}, {"action": 3}]
    data = json.dumps({"trajectory": steps}, indent=1).encode()
    # `{`, `"trajectory": [`, the first step on lines 3-7, the second's `{` on line 8
    with pytest.raises(TraceError) as err:
        _read_bytes(data, "runs/bad.traj")
    assert (err.value.line, err.value.category) == (8, "wrong-type")
