"""The Codex rollout reader: hand-computed expectations on tiny fixtures, bad input, and every
real rollout in ../shared/traces/codex checked against counts taken straight from the raw JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.model import NEVER, CompactionEvent, Flag, Kind, Role, Session, Trace
from tests import support
from tests.support import SHARED
from tests.support.compiled_meta import ABSENT, with_session_meta
from tests.support.leak_words import content_words, trace_strings
from traces import codex, compiled
from traces.builder import RecordedUsage
from traces.errors import Problems, TraceError
from traces.source import ImportUnit, SourceFile

FIXTURES = support.FIXTURES / "codex"


def _read_bytes(data: bytes, label: str = "rollout.jsonl", *, lenient: bool = False) -> Trace:
    unit = ImportUnit("codex", [SourceFile(Path(label), label)])
    return codex.read(unit, [data], Problems(lenient=lenient))


def _read(path: Path, *, lenient: bool = False) -> Trace:
    unit = ImportUnit("codex", [SourceFile(path, path.name)])
    return codex.read(unit, [path.read_bytes()], Problems(lenient=lenient))


def _ms(second: int) -> int:
    """Fixture timestamps are 2025-01-02T03:04:SS.000Z."""
    return 1_735_787_040_000 + second * 1000


def _usage(s: Session, k: int) -> RecordedUsage:
    r = s.requests
    return RecordedUsage(
        int(r["input"][k]),
        int(r["cache_read"][k]),
        int(r["cache_write_5m"][k]),
        int(r["cache_write_1h"][k]),
        int(r["output_recorded"][k]),
    )


def _col(s: Session, name: str) -> list[int]:
    return [int(v) for v in s.blocks[name]]


def _assert_anchored(s: Session) -> None:
    """Every request with usage: prefix + anchored blocks sent == recorded context."""
    context = s.recorded_context()
    prefix = s.prefix_at()  # per request: re-inferred per model and after a compaction
    for k in range(s.n_requests):
        if s.requests["has_usage"][k]:
            sent = int(s.blocks["tokens"][s.view_mask(k, as_recorded=True)].sum())
            assert int(prefix[k]) + sent == int(context[k]), k


# -- usage conversion -----------------------------------------------------------------------


def test_openai_input_includes_cached_tokens() -> None:
    u = codex.usage_from_openai(
        {
            "input_tokens": 1000,
            "cached_input_tokens": 800,
            "output_tokens": 50,
            "reasoning_output_tokens": 30,
            "total_tokens": 1050,
        }
    )
    assert u == RecordedUsage(
        input=200, cache_read=800, cache_write_5m=0, cache_write_1h=0, output=50
    )
    assert u.context == 1000  # the context size is OpenAI's input_tokens


def test_openai_usage_without_cached_field() -> None:
    u = codex.usage_from_openai({"input_tokens": 70, "output_tokens": 5})
    assert u == RecordedUsage(70, 0, 0, 0, 5)


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": 10, "cached_input_tokens": 11, "output_tokens": 1},
        {"input_tokens": -1, "output_tokens": 1},
        {"input_tokens": "12", "output_tokens": 1},
        {"input_tokens": True, "output_tokens": 1},
        {"output_tokens": 1},
    ],
)
def test_openai_usage_rejects_bad_counts(usage: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        codex.usage_from_openai(usage)


def test_timestamps_are_utc_milliseconds() -> None:
    assert codex.parse_ts("2025-01-02T03:04:05.000Z") == _ms(5)
    assert codex.parse_ts("2025-01-02T03:04:05.250+00:00") == _ms(5) + 250
    assert codex.parse_ts("2025-01-02T03:04:05") == _ms(5)  # naive: UTC, not local time
    assert codex.parse_ts("2025-01-02T05:04:05+02:00") == _ms(5)
    assert codex.parse_ts("yesterday") is None
    assert codex.parse_ts(12) is None


# -- orderings --------------------------------------------------------------------------------


def test_old_ordering_token_count_before_items() -> None:
    """Codex <= 0.42: token_count first, then the response's items and tool outputs."""
    trace = _read(FIXTURES / "old_order.jsonl")
    (s,) = trace.sessions
    assert (s.id, s.kind, s.client) == ("fixture-old-order", "main", "codex 0.42.0")
    assert s.n_requests == 3
    assert [_usage(s, k) for k in range(3)] == [
        RecordedUsage(1000, 0, 0, 0, 50),
        RecordedUsage(300, 1000, 0, 0, 30),
        RecordedUsage(120, 1280, 0, 0, 10),
    ]
    assert list(s.requests["has_usage"]) == [True, True, True]
    assert [int(t) for t in s.requests["ts"]] == [_ms(4), _ms(6), _ms(8)]
    assert [s.models[m] for m in s.requests["model"]] == [
        "gpt-5-codex",
        "gpt-5-codex",
        "gpt-5-codex-mini",
    ]
    T, TH, TU, TR = Kind.TEXT, Kind.THINKING, Kind.TOOL_USE, Kind.TOOL_RESULT
    assert _col(s, "kind") == [T, T, TH, TU, TR, T, T, T]
    assert _col(s, "role") == [0, 0, 1, 1, 0, 1, 0, 1]
    assert _col(s, "first_request") == [0, 0, 1, 1, 1, 2, 2, 3]
    assert _col(s, "origin") == [-1, -1, 0, 0, -1, 1, -1, 2]
    assert _col(s, "msg") == [0, 1, 2, 2, 3, 4, 5, 6]
    assert _col(s, "link") == [-1, -1, -1, 4, 3, -1, -1, -1]
    assert _col(s, "flags") == [
        Flag.NONE,  # <environment_context> is the client's, not the human's
        Flag.HUMAN,
        Flag.NONE,
        Flag.PATH_READ,
        Flag.PATH_READ | Flag.REGENERABLE,
        Flag.NONE,
        Flag.HUMAN,
        Flag.NONE,
    ]
    paths = _col(s, "path_hash")
    assert paths[3] == paths[4] != 0
    assert s.tools == ["shell"]
    assert s.blocks["tool"][3] == s.blocks["tool"][4] == 0
    # The reasoning item is sized from reasoning_output_tokens (not from its short summary)
    # and the API stops counting it at the next user turn (request 2).
    assert int(s.blocks["tokens_raw"][2]) == 20
    assert _col(s, "hidden_from") == [NEVER, NEVER, 2, NEVER, NEVER, NEVER, NEVER, NEVER]
    assert list(s.blocks["ts"][:3]) == [_ms(0), _ms(1), _ms(4)]
    stats = trace.stats
    assert stats["lines"] == 20
    assert stats["token_counts"] == 3
    assert stats["token_counts_repeated"] == 1
    assert stats["token_counts_empty"] == 1
    assert stats["lines_ignored"] == 3  # user_message, agent_reasoning, turn_aborted
    assert stats["requests_without_usage"] == 0
    assert trace.skipped == {} and trace.skipped_at == []
    _assert_anchored(s)


def test_new_ordering_items_before_token_count() -> None:
    """Newer Codex: items stream first, token_count follows, tool outputs come after it."""
    trace = _read(FIXTURES / "new_order.jsonl")
    (s,) = trace.sessions
    assert s.client == "codex 0.77.0"
    assert s.n_requests == 3
    assert [_usage(s, k) for k in range(3)] == [
        RecordedUsage(1500, 500, 0, 0, 40),
        RecordedUsage(400, 1900, 0, 0, 20),
        RecordedUsage(400, 2100, 0, 0, 30),
    ]
    # A request's time is its first line: here its first output item.
    assert [int(t) for t in s.requests["ts"]] == [_ms(12), _ms(16), _ms(19)]
    T, TH, TU, TR = Kind.TEXT, Kind.THINKING, Kind.TOOL_USE, Kind.TOOL_RESULT
    assert _col(s, "kind") == [T, TH, TU, TR, TU, TR, T]
    assert _col(s, "first_request") == [0, 1, 1, 1, 2, 2, 3]
    assert _col(s, "origin") == [-1, 0, 0, -1, 1, -1, 2]
    assert _col(s, "link") == [-1, -1, 3, 2, 5, 4, -1]
    assert [s.tools[t] if t >= 0 else None for t in s.blocks["tool"]] == [
        None,
        None,
        "apply_patch",
        "apply_patch",
        "shell",
        "shell",
        None,
    ]
    assert _col(s, "flags") == [
        Flag.HUMAN,
        Flag.NONE,
        Flag.PATH_WRITE,
        Flag.PATH_WRITE,  # a write's output is not regenerable
        Flag.NONE,
        Flag.REGENERABLE | Flag.ERROR,  # exit_code 1
        Flag.NONE,
    ]
    assert int(s.blocks["tokens_raw"][1]) == 16
    assert trace.stats["token_counts"] == 3
    assert trace.stats["token_counts_repeated"] == 1
    _assert_anchored(s)


def test_compaction_and_responses_without_token_count() -> None:
    trace = _read(FIXTURES / "compaction.jsonl")
    (s,) = trace.sessions
    assert s.n_requests == 3
    assert list(s.requests["has_usage"]) == [False, False, True]
    assert _usage(s, 2) == RecordedUsage(600, 300, 0, 0, 25)
    assert [int(t) for t in s.requests["ts"]] == [_ms(32), _ms(34), _ms(37)]
    T, S = Kind.TEXT, Kind.SUMMARY
    assert _col(s, "kind") == [T, T, T, T, S, T, T]
    assert _col(s, "first_request") == [0, 1, 1, 2, 2, 2, 3]
    assert _col(s, "compacted_at") == [2, 2, 2, 2, NEVER, NEVER, NEVER]
    assert int(s.blocks["flags"][4]) == Flag.ARTIFACT
    assert s.events == [
        CompactionEvent(request=2, trigger="unknown", pre_tokens=-1, summary_block=4, ts=_ms(35))
    ]
    # The logical history keeps everything; what the recording sent stops at the summary.
    assert list(np.nonzero(s.view_mask(2))[0]) == [0, 1, 2, 3, 5]
    assert list(np.nonzero(s.view_mask(2, as_recorded=True))[0]) == [4, 5]
    assert trace.stats["requests_without_usage"] == 2
    assert trace.stats["compactions"] == 1
    _assert_anchored(s)


def test_rollout_of_2026_clients() -> None:
    """cli 0.118-0.147: metadata entries, joined lines, every tool-output shape, compactions."""
    trace = _read(FIXTURES / "rollout_2026.jsonl")
    (s,) = trace.sessions
    assert s.client == "codex 0.142.5"
    assert [_usage(s, k) for k in range(s.n_requests)] == [
        RecordedUsage(1000, 0, 0, 0, 50),
        RecordedUsage(400, 900, 0, 0, 30),
        RecordedUsage(400, 1200, 0, 0, 20),
        RecordedUsage(900, 100, 0, 0, 10),
        RecordedUsage(1100, 0, 0, 0, 5),
    ]
    stats = trace.stats
    # world_state and inter_agent_communication_metadata: counted, never blocks.
    assert stats["entries_not_context"] == 2
    # Line 15 holds a custom_tool_call and a metadata entry back to back: both are read.
    assert stats["lines_joined"] == 1
    assert stats["lines"] == 35
    # The compaction's own token_count (zero last usage, totals unchanged) is a repeat.
    assert stats["token_counts"] == 5 and stats["token_counts_repeated"] == 1
    assert stats["compactions"] == 2
    assert trace.skipped == {}
    T, TH, TU, TR, S = Kind.TEXT, Kind.THINKING, Kind.TOOL_USE, Kind.TOOL_RESULT, Kind.SUMMARY
    kinds = [T, T, T, TH, T, TU, TR, TU, TR, TU, TR, T, T, S, T, T, S, T, Kind.INJECTED, T]
    assert _col(s, "kind") == kinds
    assert _col(s, "first_request") == [0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5]
    assert _col(s, "link")[5:11] == [6, 5, 8, 7, 10, 9]
    assert [s.tools[t] for t in s.blocks["tool"][5:11]] == [
        "exec_command",
        "exec_command",
        "apply_patch",
        "apply_patch",
        "tool_search_call",
        "tool_search_call",
    ]
    flags = _col(s, "flags")
    assert flags[2] == Flag.HUMAN  # the developer and <environment_context> messages are not
    # "Process exited with code 1" in the exec_command header: a failure.
    assert flags[6] == Flag.PATH_READ | Flag.REGENERABLE | Flag.ERROR
    # "Exit code: 0" in a list-shaped custom tool output: no failure; a write.
    assert flags[8] == Flag.PATH_WRITE
    assert flags[10] == Flag.REGENERABLE  # tool_search_output: the tools it loaded
    assert all(f == Flag.ARTIFACT for f in flags[11:14]) and flags[15:17] == [Flag.ARTIFACT] * 2
    assert flags[17] == Flag.HUMAN
    # Request 4's context exceeds what the kept messages' text explains: the rest is the
    # unlogged summary, an INJECTED artifact (as for Claude Code's compactions).
    assert flags[18] == Flag.ARTIFACT and int(s.blocks["tokens"][18]) > 0
    # The first compaction (inside the user's task, after its tool calls) replaces blocks
    # 0-10 at request 3; its summary is the remote "compaction" item, sized 0 from its
    # opaque handle. The second is a task of its own with no input: a manual /compact.
    assert _col(s, "compacted_at") == [3] * 11 + [4] * 4 + [NEVER] * 5
    assert int(s.blocks["tokens_raw"][13]) == 0
    assert s.events == [
        CompactionEvent(request=3, trigger="auto", pre_tokens=1600, summary_block=13, ts=_ms(72)),
        CompactionEvent(request=4, trigger="manual", pre_tokens=1000, summary_block=16, ts=_ms(81)),
    ]
    _assert_anchored(s)


def test_compaction_trigger_unknown_without_task_events() -> None:
    """Before task_started existed (the 0.77 fixture) a compaction's trigger is unknown."""
    (s,) = _read(FIXTURES / "compaction.jsonl").sessions
    assert [e.trigger for e in s.events] == ["unknown"]


@pytest.mark.parametrize(
    ("line", "joined"),
    [
        (b'{"a":1}{"b":2}', [{"a": 1}, {"b": 2}]),
        (b'{"a":1} {"b":[2]}  ', [{"a": 1}, {"b": [2]}]),
        (b'{"a":1}', None),  # one entry: not a joined line
        (b'{"a":1}{"b":', None),  # the second entry is cut off
        (b'{"a":1}[2]', None),  # an entry is always an object
        (b'{"a":1}\xff', None),
    ],
)
def test_joined_entries(line: bytes, joined: list[dict[str, Any]] | None) -> None:
    assert codex.joined_entries(line) == joined


def test_unknown_entry_types_are_counted_not_refused() -> None:
    """A new metadata entry type is skipped and counted, in strict mode too."""
    meta = b'{"timestamp":"2025-01-02T03:04:00Z","type":"mystery_state","payload":{"x":1}}'
    data = b"\n".join([GOOD_META, meta, GOOD_USER, meta, GOOD_TC, GOOD_REPLY]) + b"\n"
    trace = _read_bytes(data)
    assert trace.stats["entries_not_context"] == 2
    assert trace.skipped == {}
    (s,) = trace.sessions
    assert s.n_requests == 1 and _usage(s, 0) == RecordedUsage(9, 0, 0, 0, 1)


@pytest.mark.parametrize(
    ("output", "failed"),
    [
        ("Chunk ID: x\nWall time: 1 seconds\nProcess exited with code 2\nOutput:\nboom", True),
        ("Chunk ID: x\nProcess exited with code 0\nOutput:\nfine", False),
        ("Exit code: 1\nWall time: 0 seconds\nOutput:\nbad", True),
        ("Output:\nProcess exited with code 3", False),  # printed by the command: not a header
        ([{"type": "input_text", "text": "Exit code: 4\nOutput:\n"}], True),
        ("plain text", False),
    ],
)
def test_tool_output_failure_from_header(output: Any, failed: bool) -> None:
    call = {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "k"}
    result = {"type": "function_call_output", "call_id": "k", "output": output}
    lines = [GOOD_META, GOOD_USER]
    for payload in (call, result):
        lines.append(
            json.dumps(
                {"timestamp": "2025-01-02T03:04:02Z", "type": "response_item", "payload": payload}
            ).encode()
        )
    (s,) = _read_bytes(b"\n".join(lines) + b"\n").sessions
    (i,) = np.nonzero(s.blocks["kind"] == Kind.TOOL_RESULT)[0]
    assert bool(int(s.blocks["flags"][i]) & Flag.ERROR) == failed


def _line(second: int, kind: str, payload: dict[str, Any]) -> bytes:
    ts = f"2025-01-02T03:04:{second:02d}.000Z"
    return json.dumps({"timestamp": ts, "type": kind, "payload": payload}).encode()


def _tc(second: int, total: int, last: tuple[int, int, int]) -> bytes:
    usage = {"input_tokens": last[0], "cached_input_tokens": last[1], "output_tokens": last[2]}
    info = {"total_token_usage": {"total_tokens": total}, "last_token_usage": usage}
    return _line(second, "event_msg", {"type": "token_count", "info": info})


def _user(second: int, text: str) -> bytes:
    content = [{"type": "input_text", "text": text}]
    return _line(second, "response_item", {"type": "message", "role": "user", "content": content})


def test_tool_outputs_written_before_their_token_count() -> None:
    """0.14x: a response's calls, their outputs, then its token_count: still one request."""
    call = {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "a"}
    out = {"type": "function_call_output", "call_id": "a", "output": "done"}
    reply = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    lines = [
        GOOD_META,
        _user(1, "go"),
        _line(2, "response_item", call),
        _line(3, "response_item", out),
        _tc(4, 110, (100, 0, 10)),
        _line(5, "response_item", reply),
        _tc(6, 250, (130, 100, 10)),
    ]
    trace = _read_bytes(b"\n".join(lines) + b"\n")
    (s,) = trace.sessions
    assert [_usage(s, k) for k in range(2)] == [
        RecordedUsage(100, 0, 0, 0, 10),
        RecordedUsage(30, 100, 0, 0, 10),
    ]
    assert trace.stats["requests_without_usage"] == 0
    assert _col(s, "kind") == [Kind.TEXT, Kind.TOOL_USE, Kind.TOOL_RESULT, Kind.TEXT]
    assert _col(s, "first_request") == [0, 1, 1, 2]
    assert _col(s, "link") == [-1, 2, 1, -1]


def test_web_search_results_count_in_their_request_only() -> None:
    """A hosted web search's results: in the request that ran it, gone from the next."""
    search = {"type": "web_search_call", "status": "completed", "action": {"type": "search"}}
    reply = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    lines = [
        GOOD_META,
        _user(1, "look it up"),
        _line(2, "response_item", reply),
        _tc(3, 1005, (1000, 0, 5)),
        _user(4, "more"),
        _line(5, "response_item", search),
        _line(6, "response_item", reply),
        _tc(7, 5010, (4000, 1000, 5)),  # +3,000: the results
        _user(8, "thanks"),
        _line(9, "response_item", reply),
        _tc(10, 6215, (1200, 1100, 5)),  # back down: the results are not resent
    ]
    trace = _read_bytes(b"\n".join(lines) + b"\n")
    (s,) = trace.sessions
    assert trace.stats["web_search_results"] == 1
    (i,) = np.nonzero(s.blocks["kind"] == Kind.INJECTED)[0]
    assert (int(s.blocks["first_request"][i]), int(s.blocks["hidden_from"][i])) == (1, 2)
    _assert_anchored(s)  # request 2 falls back by the results' share: explained, not a shrink
    assert trace.stats["unexplained_shrinks"] == 0


def test_reading_is_deterministic() -> None:
    a = _read(FIXTURES / "old_order.jsonl")
    b = _read(FIXTURES / "old_order.jsonl")
    assert a.equals(b)


# -- files a tool call reads or writes --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("shell", {"command": ["bash", "-lc", "cat notes.txt"]}, (Flag.PATH_READ, "notes.txt")),
        (
            "shell",
            {"command": ["bash", "-lc", "sed -n '1,80p' a/b.md"]},
            (Flag.PATH_READ, "a/b.md"),
        ),
        (
            "shell",
            {"command": ["bash", "-lc", "head -n 20 x.py | wc -l"]},
            (Flag.PATH_READ, "x.py"),
        ),
        ("shell", {"command": ["bash", "-lc", "sed -i 's/a/b/' x.py"]}, (Flag.PATH_WRITE, "x.py")),
        ("shell", {"command": "cat > out.txt << EOF\nhi\nEOF"}, (Flag.PATH_WRITE, "out.txt")),
        ("shell", {"command": ["bash", "-lc", "echo hi >> log.txt"]}, (Flag.PATH_WRITE, "log.txt")),
        (
            "shell",
            {"command": ["powershell.exe", "-Command", "Get-Content -Path 'C:\\r\\a.md' -First 5"]},
            (Flag.PATH_READ, "C:\\r\\a.md"),
        ),
        ("shell", {"command": ["bash", "-lc", "ls -la"]}, (Flag.NONE, None)),
        ("shell", {"command": ["bash", "-lc", "cat a.txt b.txt"]}, (Flag.NONE, None)),
        ("shell", {"command": ["bash", "-lc", "cd x && cat a.txt"]}, (Flag.NONE, None)),
        (
            "shell",
            {"command": ["apply_patch", "*** Begin Patch\n*** Add File: n.py\n+x\n*** End Patch"]},
            (Flag.PATH_WRITE, "n.py"),
        ),
        (
            "apply_patch",
            "*** Begin Patch\n*** Update File: m.py\n@@\n-a\n+b\n*** End Patch",
            (Flag.PATH_WRITE, "m.py"),
        ),
        ("read_file", {"path": "r.txt"}, (Flag.PATH_READ, "r.txt")),
        ("exec_command", {"cmd": "cat e.txt"}, (Flag.PATH_READ, "e.txt")),
        ("update_plan", {"plan": []}, (Flag.NONE, None)),
        ("shell", {"command": ["bash", "-lc", "cat 'unbalanced"]}, (Flag.NONE, None)),
    ],
)
def test_call_file_access(name: str, arguments: Any, expected: tuple[Flag, str | None]) -> None:
    assert codex.call_file_access(name, arguments) == expected


# -- bad input --------------------------------------------------------------------------------

GOOD_META = b'{"timestamp":"2025-01-02T03:04:00Z","type":"session_meta","payload":{"id":"s"}}'
GOOD_USER = (
    b'{"timestamp":"2025-01-02T03:04:01Z","type":"response_item","payload":'
    b'{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}}'
)
GOOD_TC = (
    b'{"timestamp":"2025-01-02T03:04:02Z","type":"event_msg","payload":{"type":"token_count",'
    b'"info":{"total_token_usage":{"input_tokens":9,"output_tokens":1,"total_tokens":10},'
    b'"last_token_usage":{"input_tokens":9,"output_tokens":1,"total_tokens":10}}}}'
)
GOOD_REPLY = (
    b'{"timestamp":"2025-01-02T03:04:02Z","type":"response_item","payload":'
    b'{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}}'
)


@pytest.mark.parametrize(
    ("bad", "category"),
    [
        (b'{"timestamp": "2025-01-02T03:04:00Z", "type": ', "invalid-json"),
        (b"[1, 2, 3]", "wrong-type"),
        (b'{"timestamp":"2025-01-02T03:04:00Z","payload":{}}', "missing-field"),
        (b'{"timestamp":"2025-01-02T03:04:00Z","type":7,"payload":{}}', "wrong-type"),
        (b'{"timestamp":"2025-01-02T03:04:00Z","type":"response_item","payload":[]}', "wrong-type"),
        (b'{"type":"response_item","payload":{"type":"reasoning"}}', "missing-field"),
        (b'{"timestamp":"soon","type":"turn_context","payload":{}}', "wrong-type"),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"response_item","payload":{"type":"x"}}',
            "unknown-type",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"response_item",'
            b'"payload":{"type":"message","role":"user","content":"not a list"}}',
            "wrong-type",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"response_item",'
            b'"payload":{"type":"function_call_output","output":"x"}}',
            "missing-field",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"response_item",'
            b'"payload":{"type":"function_call_output","call_id":"nope","output":"x"}}',
            "orphan-tool-result",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"event_msg","payload":{"type":'
            b'"token_count","info":{"total_token_usage":{"input_tokens":"9"},'
            b'"last_token_usage":{"input_tokens":9,"output_tokens":1}}}}',
            "wrong-type",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"event_msg","payload":{"type":'
            b'"token_count","info":{"last_token_usage":{"input_tokens":9,"output_tokens":1}}}}',
            "missing-field",
        ),
        (
            b'{"timestamp":"2025-01-02T03:04:00Z","type":"event_msg","payload":{"type":'
            b'"token_count","info":{"total_token_usage":{"input_tokens":5},'
            b'"last_token_usage":{"input_tokens":5,"cached_input_tokens":6,"output_tokens":1}}}}',
            "wrong-type",
        ),
        (b"\x00\x01\x02\xff\xfe garbage \x03\x04", "binary-garbage"),
    ],
)
def test_bad_line_strict_names_file_and_line(bad: bytes, category: str) -> None:
    data = b"\n".join([GOOD_META, GOOD_USER, bad, GOOD_TC, GOOD_REPLY]) + b"\n"
    with pytest.raises(TraceError) as err:
        _read_bytes(data, "dir/some-rollout.jsonl")
    assert (err.value.file, err.value.line, err.value.category) == (
        "dir/some-rollout.jsonl",
        3,
        category,
    )
    assert "dir/some-rollout.jsonl:3" in str(err.value)


@pytest.mark.parametrize("bad", [b"{not json", b'{"type":"response_item","payload":{}}', b"[]"])
def test_bad_line_lenient_skips_and_counts(bad: bytes) -> None:
    data = b"\n".join([GOOD_META, GOOD_USER, bad, bad, GOOD_TC, GOOD_REPLY]) + b"\n"
    trace = _read_bytes(data, "dir/some-rollout.jsonl", lenient=True)
    assert sum(trace.skipped.values()) == 2
    assert trace.skipped_at == ["file#0:3", "file#0:4"]  # labels never reach the trace
    (s,) = trace.sessions
    assert s.n_requests == 1 and bool(s.requests["has_usage"][0])
    assert _usage(s, 0) == RecordedUsage(9, 0, 0, 0, 1)


def test_empty_file() -> None:
    with pytest.raises(TraceError) as err:
        _read_bytes(b"  \n\n", "empty.jsonl")
    assert (err.value.line, err.value.category) == (1, "empty-file")
    trace = _read_bytes(b"", "empty.jsonl", lenient=True)
    assert trace.skipped == {"empty-file": 1}
    assert trace.sessions[0].n_requests == 0


def test_truncated_last_line() -> None:
    data = b"\n".join([GOOD_META, GOOD_USER, GOOD_TC, GOOD_REPLY[:40]])
    with pytest.raises(TraceError) as err:
        _read_bytes(data)
    assert (err.value.line, err.value.category) == (4, "truncated-line")
    trace = _read_bytes(data, lenient=True)
    assert trace.skipped == {"truncated-line": 1}
    assert trace.sessions[0].n_requests == 1  # the token_count still made its request


def test_whole_binary_file_never_raises_anything_but_trace_error() -> None:
    data = bytes(range(256)) * 8
    trace = _read_bytes(data, lenient=True)
    assert sum(trace.skipped.values()) >= 1
    with pytest.raises(TraceError):
        _read_bytes(data)


# -- no content in the trace ------------------------------------------------------------------

CONTENT_KEYS = {"text", "arguments", "input", "output", "cwd", "message", "encrypted_content"}


@pytest.mark.parametrize(
    "name", ["old_order.jsonl", "new_order.jsonl", "compaction.jsonl", "rollout_2026.jsonl"]
)
def test_no_content_reaches_the_trace(name: str) -> None:
    path = FIXTURES / name
    words: set[str] = set()
    for entry in _raw_entries(path):
        content_words(entry, CONTENT_KEYS, words, quotes="\"'")
    assert len(words) > 10
    strings = trace_strings(_read(path))
    leaks = [w for w in words for s in strings if w in s]
    assert not leaks


# -- every real rollout -----------------------------------------------------------------------


def _real_files() -> list[Path]:
    return sorted((SHARED / "codex").rglob("*.jsonl")) if SHARED.is_dir() else []


#: Every item type that returns a tool's output (0.118+ adds the freeform-tool and the
#: tool-search outputs to the function outputs of 0.4x).
TOOL_OUTPUTS = {"function_call_output", "custom_tool_call_output", "tool_search_output"}


def _raw_entries(path: Path) -> list[dict[str, Any]]:
    """Every entry of a rollout, stdlib only; a line can hold two entries back to back."""
    decoder = json.JSONDecoder()
    entries = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        i = 0
        raw = raw.strip()
        while i < len(raw):
            entry, i = decoder.raw_decode(raw, i)
            entries.append(entry)
    return entries


def _independent_usage(path: Path) -> tuple[int, int, int, int, int]:
    """(requests, input incl. cached, cached, output, calls) from the raw lines, stdlib only."""
    requests = input_tokens = cached = output = calls = 0
    previous = None
    for line in _raw_entries(path):
        payload = line["payload"]
        if line["type"] == "response_item" and payload.get("type") in TOOL_OUTPUTS:
            calls += 1
        if line["type"] != "event_msg" or payload.get("type") != "token_count":
            continue
        info = payload.get("info")
        if not info or info["total_token_usage"] == previous:
            continue
        previous = info["total_token_usage"]
        last = info["last_token_usage"]
        requests += 1
        input_tokens += last["input_tokens"]
        cached += last.get("cached_input_tokens", 0)
        output += last["output_tokens"]
    return requests, input_tokens, cached, output, calls


@pytest.mark.shared
@pytest.mark.parametrize(
    "path", _real_files() or [None], ids=lambda p: p.name[-20:] if p else "none"
)
def test_real_rollout(path: Path | None) -> None:
    if path is None:
        pytest.skip("../shared/traces is absent")
    trace = _read(path)  # strict: real rollouts import without a single problem
    (s,) = trace.sessions
    requests, input_tokens, cached, output, calls = _independent_usage(path)
    r = s.requests
    assert int(r["has_usage"].sum()) == requests == trace.stats["token_counts"]
    assert int((r["input"] + r["cache_read"]).sum()) == input_tokens
    assert int(r["cache_read"].sum()) == cached
    assert int(r["output_recorded"].sum()) == output
    assert int((r["cache_write_5m"] + r["cache_write_1h"]).sum()) == 0
    assert bool((np.diff(r["ts"]) >= 0).all())
    # Every tool output is linked to its call, and back.
    results = np.nonzero(s.blocks["kind"] == Kind.TOOL_RESULT)[0]
    assert len(results) == calls
    for i in results:
        use = int(s.blocks["link"][i])
        assert s.blocks["kind"][use] == Kind.TOOL_USE and s.blocks["link"][use] == i
        assert s.blocks["tool"][use] == s.blocks["tool"][i]
        assert s.blocks["role"][i] == Role.USER
    # Outputs of request k enter at k + 1.
    out = s.blocks["origin"] >= 0
    assert bool((s.blocks["first_request"][out] == s.blocks["origin"][out] + 1).all())
    assert bool((np.diff(s.blocks["first_request"]) >= 0).all())
    if requests:
        _assert_anchored(s)
        assert (s.blocks["flags"] & Flag.HUMAN).any()


@pytest.mark.shared
def test_shared_codex_fixtures_import() -> None:
    """The synthetic Codex references beside the real traces import cleanly too."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is absent")
    paths = [p for p in (SHARED / "fixtures").rglob("*.jsonl") if "codex" in str(p)]
    paths = [p for p in paths if '"session_meta"' in p.read_text()[:2000]]
    assert paths
    for path in paths:
        trace = _read(path)
        assert trace.sessions[0].n_requests >= 1
        assert trace.stats["token_counts"] >= 1


# -- the logged window ----------------------------------------------------------------------


def _tcw(second: int, total: int, last: tuple[int, int, int], window: int | None) -> bytes:
    """A token_count that logs `window` as model_context_window (None: the key is absent)."""
    usage = {"input_tokens": last[0], "cached_input_tokens": last[1], "output_tokens": last[2]}
    info: dict[str, Any] = {"total_token_usage": {"total_tokens": total}, "last_token_usage": usage}
    if window is not None:
        info["model_context_window"] = window
    return _line(second, "event_msg", {"type": "token_count", "info": info})


def _reply(second: int) -> bytes:
    content = [{"type": "output_text", "text": "ok"}]
    return _line(
        second, "response_item", {"type": "message", "role": "assistant", "content": content}
    )


def _window_rollout() -> bytes:
    """Model a (121,600 logged, then 100,000: one change), then model b (258,400). A
    task_started logging 999,999 before b's turn_context is not read as b's or a's."""
    lines = [
        GOOD_META,
        _line(1, "turn_context", {"model": "a"}),
        _user(2, "go"),
        _reply(3),
        _tcw(4, 110, (100, 0, 10), 121_600),
        _user(5, "more"),
        _reply(6),
        _tcw(7, 250, (130, 100, 10), 100_000),
        _line(8, "event_msg", {"type": "task_started", "model_context_window": 999_999}),
        _line(9, "turn_context", {"model": "b"}),
        _user(10, "again"),
        _reply(11),
        _tcw(12, 400, (140, 0, 10), 258_400),
    ]
    return b"\n".join(lines) + b"\n"


def test_logged_window_is_kept_per_model() -> None:
    trace = _read_bytes(_window_rollout())
    (s,) = trace.sessions
    assert s.models == ["a", "b"]
    assert s.context_windows == [121_600, 258_400]  # the first one logged per model
    assert [s.logged_window(k) for k in range(s.n_requests)] == [121_600, 121_600, 258_400]
    assert trace.stats["context_window_changes"] == 1


def test_no_logged_window_leaves_the_list_empty() -> None:
    lines = [GOOD_META, _user(1, "go"), _reply(2), _tcw(3, 110, (100, 0, 10), None)]
    (s,) = _read_bytes(b"\n".join(lines) + b"\n").sessions
    assert s.context_windows == []
    assert s.logged_window(0) == -1


def test_logged_window_survives_the_compiled_form_and_old_files_read_without_it() -> None:
    trace = _read_bytes(_window_rollout())
    data = compiled.to_bytes(trace)
    back = compiled.from_bytes(data)
    assert back.equals(trace) and back.sessions[0].context_windows == [121_600, 258_400]
    # The same file without the key (as written before it was added): read as unlogged.
    old = compiled.from_bytes(with_session_meta(data, "context_windows", ABSENT))
    assert old.sessions[0].context_windows == [] and old.sessions[0].logged_window(2) == -1


@pytest.mark.parametrize("windows", [[121_600], [0, 5], [-2, 5], [True, 5], "x"])
def test_bad_logged_windows_in_a_compiled_file_are_refused(windows: Any) -> None:
    data = compiled.to_bytes(_read_bytes(_window_rollout()))
    with pytest.raises(TraceError) as err:
        compiled.from_bytes(with_session_meta(data, "context_windows", windows))
    assert err.value.category == "compiled-schema"


def test_subagent_notifications_are_not_the_human() -> None:
    """Codex 0.118 writes a spawned agent's report as a user message; compaction drops it
    like other client context, so it is not HUMAN."""
    lines = [GOOD_META, _user(1, "go"), _user(2, "<subagent_notification>\n{}"), _reply(3)]
    (s,) = _read_bytes(b"\n".join(lines) + b"\n").sessions
    assert _col(s, "flags")[:2] == [Flag.HUMAN, Flag.NONE]


def test_an_item_of_a_newer_client_is_named_as_such_in_the_summary(tmp_path: Path) -> None:
    """A response item of a type this reader does not know is skipped and counted by its
    category, so the summary does not call a newer client's line a broken one."""
    from click.testing import CliRunner

    from simulator.app.cli import main

    lines = [
        GOOD_META,
        _user(1, "go"),
        _line(2, "response_item", {"type": "hologram_call", "id": "h1"}),
        _reply(3),
        _tc(4, 110, (100, 0, 10)),
        b"{not json",
    ]
    (tmp_path / "rollout-2025-01-02T03-04-00-a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = CliRunner().invoke(main, ["traces", "stats", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "2 damaged line(s) skipped (1 invalid-json, 1 unknown-type): " in result.output
