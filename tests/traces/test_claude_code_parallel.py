"""Parallel tool calls in Claude Code transcripts (traces/claude_code.py
`_SessionAssembler._with_parallel_calls`): every call and result of one response is in
the next request's context, whichever branch the parent chain follows, laid in the order of
the tool_use blocks; as-recorded's message marker then lands after the result that finished
last, where the recorded uncached input puts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from simulator import policy
from simulator.model import NEVER, Kind, Session, Trace
from simulator.replay import replay
from traces.load import load_unit, units
from traces.tokens import count_tokens

MODEL = "claude-opus-4-5-20251101"
PREFIX = 10_000


class Lines:
    """2.1.x-style lines; each names its parent explicitly."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def add(self, kind: str, parent: str | None, message: dict[str, Any], **extra: Any) -> str:
        uid = f"00000000-0000-4000-8000-{len(self.lines):012d}"
        second = len(self.lines)
        self.lines.append(
            {
                "uuid": uid,
                "parentUuid": parent,
                "sessionId": "s",
                "version": "2.1.31",
                "type": kind,
                "timestamp": f"2026-02-05T01:00:{second:02d}.000Z",
                "message": message,
                **extra,
            }
        )
        return uid

    def assistant(self, parent: str, mid: str, block: dict[str, Any], usage: dict[str, int]) -> str:
        message = {"id": mid, "role": "assistant", "model": MODEL, "content": [block]}
        return self.add("assistant", parent, {**message, "usage": usage})

    def result(self, parent: str, use_id: str, text: str) -> str:
        block = {"type": "tool_result", "tool_use_id": use_id, "content": text}
        return self.add("user", parent, {"role": "user", "content": [block]})

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        return path


def _usage(context: int, uncached: int = 4) -> dict[str, int]:
    return {
        "input_tokens": uncached,
        "cache_read_input_tokens": context - uncached,
        "cache_creation_input_tokens": 0,
        "output_tokens": 10,
    }


A_TEXT = "alpha result line\n" * 200
B_TEXT = "bravo output row\n" * 100


def _transcript(path: Path, uncached: int) -> Path:
    """Request 0 sends two Read calls in one response (message m0): tool_use A, then B.
    B's result is written first, A's last; each result hangs from its own tool_use line,
    so the chain from request 1 (parent: A's result) never passes B's line or result.
    Request 1's recorded context is the whole turn; `uncached` of it was sent uncached."""
    t = Lines()
    prompt = t.add("user", None, {"role": "user", "content": "read both"})
    use_a = {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {"file_path": "/a"}}
    use_b = {"type": "tool_use", "id": "toolu_b", "name": "Read", "input": {"file_path": "/b"}}
    line_a = t.assistant(prompt, "m0", use_a, _usage(PREFIX))
    line_b = t.assistant(line_a, "m0", use_b, _usage(PREFIX))
    t.result(line_b, "toolu_b", B_TEXT)
    result_a = t.result(line_a, "toolu_a", A_TEXT)
    grown = PREFIX + 10 + count_tokens(A_TEXT) + count_tokens(B_TEXT)
    answer = t.assistant(result_a, "m1", {"type": "text", "text": "done"}, _usage(grown, uncached))
    prompt2 = t.add("user", answer, {"role": "user", "content": "thanks"})
    t.assistant(prompt2, "m2", {"type": "text", "text": "ok"}, _usage(grown + 10 + 5))
    return t.write(path)


def _load(path: Path) -> tuple[Session, dict[str, int]]:
    (unit,) = units([path])
    trace = load_unit(unit).trace
    return trace.sessions[0], trace.stats


def test_every_parallel_call_and_result_is_in_the_next_context(tmp_path: Path) -> None:
    session, stats = _load(_transcript(tmp_path / "s.jsonl", 4))
    b = session.blocks
    entering = [i for i in range(len(b)) if b["first_request"][i] == 1]
    kinds = [int(b["kind"][i]) for i in entering]
    assert kinds == [Kind.TOOL_USE, Kind.TOOL_USE, Kind.TOOL_RESULT, Kind.TOOL_RESULT]
    use_a, use_b, first, second = entering
    # Laid in tool_use order: A's result first although B's was written first.
    assert (int(b["link"][first]), int(b["link"][second])) == (use_a, use_b)
    assert int(b["tokens"][first]) > int(b["tokens"][second]) > 0
    # The later request hangs from A's result: B's result stays (no rewind).
    assert all(int(b["hidden_from"][i]) == NEVER for i in entering)
    assert stats["parallel_lines_recovered"] == 2  # B's tool_use line and its result
    assert stats["parallel_results_reordered"] == 1


def test_as_recorded_sends_the_results_after_the_last_to_finish_uncached(
    tmp_path: Path,
) -> None:
    """The recording sent B's result (after A's, the last to finish) uncached: the replay
    marks the boundary after A's result, so request 1 sends exactly B's tokens uncached and
    request 2 reads up to that marker and writes B's result and what followed."""
    probe, _ = _load(_transcript(tmp_path / "probe.jsonl", 4))
    b = probe.blocks
    results = [i for i in range(len(b)) if b["kind"][i] == Kind.TOOL_RESULT]
    b_tokens = int(b["tokens"][results[1]])
    session, _ = _load(_transcript(tmp_path / "s.jsonl", b_tokens))
    frame = replay([("s", Trace("claude-code", "t", [session]))], policy.build("as-recorded"))
    rows = frame.filter(pl.col("kind") == "request").sort("request")
    uncached = rows["uncached_input"].to_list()
    assert uncached[1] == b_tokens
    context = session.recorded_context()
    assert rows["cache_read"].to_list()[2] == int(context[1]) - b_tokens
