"""The lines of a JSONL source, parsed, with each unreadable line reported and located.

Claude Code transcripts and Codex rollouts are both JSONL; what makes a line unreadable, and
what the report calls it, is the same for both readers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson

#: Longest line accepted; longer lines are reported (`line-too-long`) rather than parsed.
MAX_LINE_BYTES = 256 * 1024 * 1024

#: The value `json_lines` yields for a line it reported as unreadable.
UNREADABLE = object()

Report = Callable[[int, str, str], None]


def json_lines(data: bytes, report: Report) -> Iterator[tuple[int, bytes, Any]]:
    """(line number, raw bytes, parsed value) of every non-blank line. An empty file is
    reported (`empty-file`) and yields nothing; a line too long, cut off at the end of the
    file, binary or invalid JSON is reported with `report(line, category, message)` and
    yielded with UNREADABLE, so that a reader can still count it or keep its place."""
    if not data.strip():
        report(1, "empty-file", "file is empty")
        return
    lines = data.split(b"\n")
    last = len(lines) - (1 if lines[-1] == b"" else 0)
    for i in range(last):
        raw = lines[i]
        if not raw.strip():
            continue
        lineno = i + 1
        if len(raw) > MAX_LINE_BYTES:
            report(lineno, "line-too-long", f"line of {len(raw)} bytes exceeds limit")
            yield lineno, raw, UNREADABLE
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if i == last - 1 and not data.endswith(b"\n"):
                report(lineno, "truncated-line", "last line is cut off")
            elif b"\x00" in raw or _mostly_binary(raw):
                report(lineno, "binary-garbage", "line is not text")
            else:
                report(lineno, "invalid-json", f"invalid JSON ({exc})")
            yield lineno, raw, UNREADABLE
            continue
        yield lineno, raw, obj


def _mostly_binary(raw: bytes) -> bool:
    sample = raw[:512]
    bad = sum(1 for c in sample if c < 9 or 13 < c < 32)
    return bad > len(sample) // 10
