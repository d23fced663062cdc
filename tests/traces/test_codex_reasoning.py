"""Reasoning before a user turn (traces/codex.py `REASONING_AT_USER_TURN`): dropped from the
context by most OpenAI models, kept by gpt-5.6, and for a model the table does not know
decided by what the session's recorded contexts did at its user turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.model import NEVER, Kind, Session
from traces import codex
from traces.errors import Problems
from traces.source import ImportUnit, SourceFile


def _line(second: int, kind: str, payload: dict[str, Any]) -> bytes:
    ts = f"2025-01-02T03:{second // 60:02d}:{second % 60:02d}.000Z"
    return json.dumps({"timestamp": ts, "type": kind, "payload": payload}).encode()


def _user(second: int, text: str) -> bytes:
    content = [{"type": "input_text", "text": text}]
    return _line(second, "response_item", {"type": "message", "role": "user", "content": content})


def _reply(second: int) -> bytes:
    content = [{"type": "output_text", "text": "ok"}]
    item = {"type": "message", "role": "assistant", "content": content}
    return _line(second, "response_item", item)


def _reasoning(second: int) -> bytes:
    return _line(second, "response_item", {"type": "reasoning", "summary": []})


def _tc(second: int, total: int, context: int, output: int, reasoning: int) -> bytes:
    last = {
        "input_tokens": context,
        "cached_input_tokens": 0,
        "output_tokens": output,
        "reasoning_output_tokens": reasoning,
    }
    info = {"total_token_usage": {"total_tokens": total}, "last_token_usage": last}
    return _line(second, "event_msg", {"type": "token_count", "info": info})


def _session(model: str, contexts: list[int]) -> Session:
    """Turns of one user message and one reasoned reply (400 tokens of reasoning and the
    1-token answer: 401 of output); request k's recorded context is contexts[k]."""
    lines = [
        _line(0, "session_meta", {"id": "s", "cli_version": "0.150.0"}),
        _line(0, "turn_context", {"model": model}),
    ]
    total = 0
    for k, context in enumerate(contexts):
        t = 10 * k
        total += context + 401
        lines += [
            _user(t + 1, "go"),
            _reasoning(t + 2),
            _reply(t + 3),
            _tc(t + 4, total, context, 401, 400),
        ]
    unit = ImportUnit("codex", [SourceFile(Path("r.jsonl"), "r.jsonl")])
    (session,) = codex.read(unit, [b"\n".join(lines) + b"\n"], Problems()).sessions
    return session


def _hidden(s: Session) -> list[int]:
    """hidden_from of each THINKING block (the reasoning of request 0, 1, ...)."""
    thinking = np.nonzero(s.blocks["kind"] == Kind.THINKING)[0]
    return [int(s.blocks["hidden_from"][b]) for b in thinking]


#: Each turn adds the user message (1 token) to the previous context and response (401):
#: a context that drops the reasoning is 400 below that, one that keeps it is not.
DROPPED = [1000, 1002, 1004]
KEPT = [1000, 1402, 1804]


@pytest.mark.parametrize("model", ["gpt-5.5", "gpt-5.4", "gpt-5.3-codex-spark", "gpt-5-codex"])
def test_most_models_drop_reasoning_at_a_user_turn(model: str) -> None:
    # whatever the usage says: the table knows these models
    for contexts in (DROPPED, KEPT):
        assert _hidden(_session(model, contexts)) == [1, 2, NEVER]


def test_gpt_5_6_keeps_reasoning_across_user_turns() -> None:
    for contexts in (KEPT, DROPPED):
        assert _hidden(_session("gpt-5.6-sol", contexts)) == [NEVER, NEVER, NEVER]


def test_an_unknown_model_follows_its_recorded_contexts() -> None:
    assert _hidden(_session("o9-mini", DROPPED)) == [1, 2, NEVER]
    assert _hidden(_session("o9-mini", KEPT)) == [NEVER, NEVER, NEVER]
    # the turns vote: one turn that shrank against two that did not keeps it all
    assert _hidden(_session("o9-mini", [1000, 1002, 1404, 1806])) == [NEVER] * 4


@pytest.mark.parametrize(("model", "contexts"), [("gpt-5.6-sol", KEPT), ("gpt-5.5", DROPPED)])
def test_reasoning_is_sized_and_anchored_either_way(model: str, contexts: list[int]) -> None:
    """The reasoning keeps its recorded 400 tokens, and the blocks each request sends plus
    the inferred prefix make up its recorded context exactly (no unexplained shrink)."""
    s = _session(model, contexts)
    thinking = s.blocks["kind"] == Kind.THINKING
    assert s.blocks["tokens"][thinking].tolist() == [400] * len(contexts)
    context, prefix = s.recorded_context(), s.prefix_at()
    for k in range(s.n_requests):
        sent = int(s.blocks["tokens"][s.view_mask(k, as_recorded=True)].sum())
        assert int(prefix[k]) + sent == int(context[k]) == contexts[k], k


def test_the_table() -> None:
    assert codex.reasoning_kept("gpt-5.6-sol") is True
    assert codex.reasoning_kept("gpt-5.5") is False
    assert codex.reasoning_kept("gpt-5.10") is None  # not gpt-5.1: unknown, usage decides
    assert codex.reasoning_kept("o9-mini") is None


def _task_event(second: int, kind: str) -> bytes:
    return _line(second, "event_msg", {"type": kind})


def _mid_turn_session(version: str) -> Session:
    """gpt-5.5: a task whose first response reasons and calls a tool; the user types a
    steer before its output reaches the model; the next response reasons and answers;
    then a new task's user message."""
    call = {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "c0"}
    output = {"type": "function_call_output", "call_id": "c0", "output": "done"}
    lines = [
        _line(0, "session_meta", {"id": "s", "cli_version": version}),
        _task_event(0, "task_started"),
        _line(0, "turn_context", {"model": "gpt-5.5"}),
        _user(1, "first task"),
        _reasoning(2),
        _line(3, "response_item", call),
        _tc(4, 2450, 2000, 450, 400),
        _line(5, "response_item", output),
        _user(6, "a steer"),
        _reasoning(7),
        _reply(8),
        _tc(9, 5350, 2440, 460, 400),
        _task_event(10, "task_complete"),
        _task_event(20, "task_started"),
        _user(21, "second task"),
        _reply(22),
        _tc(23, 7750, 2050, 2, 0),
    ]
    unit = ImportUnit("codex", [SourceFile(Path("r.jsonl"), "r.jsonl")])
    trace = codex.read(unit, [b"\n".join(lines) + b"\n"], Problems())
    return trace.sessions[0]


@pytest.mark.parametrize(("version", "first_dropped_at"), [("0.140.0", 2), ("0.141.0", 1)])
def test_a_mid_turn_user_message_keeps_the_reasoning_before_0_141(
    version: str, first_dropped_at: int
) -> None:
    """Before 0.141 (`MID_TURN_KEEPS_REASONING`) the steer after the tool output leaves the
    first response's reasoning in the context until the next task's user message (request
    2); from 0.141 the steer drops it (request 1). The second response's reasoning goes at
    the new task either way."""
    s = _mid_turn_session(version)
    b = s.blocks
    thinking = np.flatnonzero(b["kind"] == Kind.THINKING)
    assert b["origin"][thinking].tolist() == [0, 1]
    assert b["hidden_from"][thinking].tolist() == [first_dropped_at, 2]
