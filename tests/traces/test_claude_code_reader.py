"""The Claude Code reader on small hand-written transcripts: what a compaction's trigger is
when 1.0.x does not log it, and what tool results tell about their files' whole sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.model import Kind, Session
from traces.claude_code import LINE_PREFIX_CHARS, NUMBERED_CHARS_PER_TOKEN
from traces.load import load_unit, units

MODEL = "claude-sonnet-4-20250514"


class Transcript:
    """A 1.0.x-style transcript: one line per entry, each the child of the previous."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.parent: str | None = None
        self.second = 0

    def _add(self, entry: dict[str, Any], *, root: bool = False) -> None:
        uid = f"00000000-0000-4000-8000-{len(self.lines):012d}"
        self.second += 1
        entry = {
            "uuid": uid,
            "parentUuid": None if root else self.parent,
            "sessionId": "s",
            "version": "1.0.53",
            "timestamp": f"2025-07-16T20:{self.second // 60:02d}:{self.second % 60:02d}.000Z",
            **entry,
        }
        self.lines.append(entry)
        self.parent = uid

    def user(self, content: Any, *, root: bool = False, **extra: Any) -> None:
        self._add(
            {"type": "user", "message": {"role": "user", "content": content}, **extra}, root=root
        )

    def assistant(self, content: list[dict[str, Any]], context: int) -> None:
        mid = f"msg_{len(self.lines)}"
        usage = {
            "input_tokens": 4,
            "cache_read_input_tokens": context - 4,
            "cache_creation_input_tokens": 0,
            "output_tokens": 10,
        }
        self._add(
            {
                "type": "assistant",
                "message": {
                    "id": mid,
                    "role": "assistant",
                    "model": MODEL,
                    "content": content,
                    "usage": usage,
                },
            }
        )

    def tool(
        self,
        name: str,
        tool_input: dict[str, Any],
        text: str,
        result: Any,
        context: int,
        *,
        error: bool = False,
    ) -> None:
        """A tool_use in one assistant line and its result (with `toolUseResult`)."""
        uid = f"toolu_{len(self.lines)}"
        self.assistant(
            [{"type": "tool_use", "id": uid, "name": name, "input": tool_input}], context
        )
        block = {"type": "tool_result", "tool_use_id": uid, "content": text}
        if error:
            block["is_error"] = True
        self.user([block], toolUseResult=result)

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        return path


def _load(path: Path) -> Session:
    (unit,) = units([path])
    return load_unit(unit).trace.sessions[0]


def _numbered(chars: int, lines: int) -> int:
    return round((chars + LINE_PREFIX_CHARS * lines) / NUMBERED_CHARS_PER_TOKEN)


# -- compaction triggers ------------------------------------------------------------------


def _compacted(manual: bool) -> Transcript:
    t = Transcript()
    t.user("fix the parser")
    t.assistant([{"type": "text", "text": "on it"}], 20_000)
    t.user(
        "This session is being continued from a previous conversation. Summary: x",
        root=True,
        isCompactSummary=True,
    )
    if manual:
        t.user("Caveat: local commands below.", isMeta=True)
        t.user("<command-name>/compact</command-name>\n<command-message>compact</command-message>")
        t.user("<local-command-stdout>Compacted.</local-command-stdout>")
    t.user("go on")
    t.assistant([{"type": "text", "text": "continuing"}], 6_000)
    return t


@pytest.mark.parametrize(("manual", "trigger"), [(True, "manual"), (False, "unknown")])
def test_a_1_0_compaction_is_manual_when_a_compact_command_follows_its_summary(
    tmp_path: Path, manual: bool, trigger: str
) -> None:
    session = _load(_compacted(manual).write(tmp_path / "s.jsonl"))
    assert [(e.request, e.trigger) for e in session.events] == [(1, trigger)]


# -- whole-file sizes ---------------------------------------------------------------------


def test_tool_results_carry_their_files_whole_size(tmp_path: Path) -> None:
    t = Transcript()
    t.user("look at the files")
    body = "\n".join(f"line {i}" for i in range(1, 41))  # 40 lines
    shown = "".join(f"{i:6d}\u2192line {i}\n" for i in range(11, 21))
    # A Read of lines 11-20 of a 40-line file: the file is 4x what the result shows.
    t.tool(
        "Read",
        {"file_path": "/p/a.py", "offset": 11, "limit": 10},
        shown,
        {
            "type": "text",
            "file": {
                "filePath": "/p/a.py",
                "content": "x",
                "numLines": 10,
                "startLine": 11,
                "totalLines": 40,
            },
        },
        1_000,
    )
    # A Write: the content's length, numbered as the Read tool would show it.
    t.tool(
        "Write",
        {"file_path": "/p/b.py", "content": body},
        "File created",
        {"type": "create", "filePath": "/p/b.py", "content": body},
        1_100,
    )
    # An Edit replacing "line 1\n" by "first\nline\n" once: +4 chars, +1 line.
    t.tool(
        "Edit",
        {"file_path": "/p/b.py", "old_string": "line 1\n", "new_string": "first\nline\n"},
        "The file has been updated",
        {
            "filePath": "/p/b.py",
            "oldString": "line 1\n",
            "newString": "first\nline\n",
            "originalFile": body,
            "replaceAll": False,
        },
        1_200,
    )
    # A MultiEdit: "line 2" -> "L2" everywhere (line 2, and lines 20-29 start with it),
    # then "line 3" -> "line three" once.
    t.tool(
        "MultiEdit",
        {"file_path": "/p/b.py", "edits": []},
        "Applied 2 edits",
        {
            "filePath": "/p/b.py",
            "originalFileContents": body,
            "edits": [
                {"old_string": "line 2", "new_string": "L2", "replace_all": True},
                {"old_string": "line 3", "new_string": "line three"},
            ],
        },
        1_300,
    )
    # A failed Read tells nothing about its file.
    t.tool(
        "Read",
        {"file_path": "/p/c.py"},
        "File does not exist.",
        {"type": "text", "file": {"numLines": 1, "totalLines": 1}},
        1_400,
        error=True,
    )
    t.assistant([{"type": "text", "text": "done"}], 1_500)
    session = _load(t.write(tmp_path / "s.jsonl"))
    b = session.blocks
    results = np.nonzero(b["kind"] == Kind.TOOL_RESULT)[0]
    sizes = b["file_tokens"][results].tolist()
    read_raw = int(b["tokens_raw"][results[0]])
    chars, lines = len(body), 40
    assert sizes == [
        4 * read_raw,
        _numbered(chars, lines),
        _numbered(chars + 4, lines + 1),
        _numbered(chars - 4 * 11 + 4, lines),
        -1,
    ]
    # Blocks other than tool results hold no file size.
    assert (b["file_tokens"][np.setdiff1d(np.arange(len(b)), results)] == -1).all()
