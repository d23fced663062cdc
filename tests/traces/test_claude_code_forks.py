"""Forked, resumed and compaction-call files: every API call counted once (issue 12).

Each test writes tiny 2.1.x-style transcripts by hand (`Transcript`), lays them out as
Claude Code does (`<project>/<session>.jsonl`, `<project>/<session>/subagents/agent-*.jsonl`)
and checks the compiled sessions against counts worked out from what was written.
"""

from __future__ import annotations

import copy
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.trace_stats import session_stats
from simulator.model import Kind, Trace
from simulator.pricing import PriceBook
from traces import compiled
from traces.discover import discover
from traces.errors import TraceError
from traces.load import load_unit

MODEL = "claude-opus-4-5-20251101"


@dataclass
class Call:
    """One API call as the transcript logs it: (input, cache read, write 5m, output)."""

    mid: str
    usage: tuple[int, int, int, int]


@dataclass
class Transcript:
    """A 2.1.x transcript: lines, each the child of the previous conversation line."""

    session: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    parent: str | None = None
    minute: int = 0
    agent: str | None = None

    def _ts(self) -> str:
        self.minute += 1
        return f"2026-03-01T{10 + self.minute // 60:02d}:{self.minute % 60:02d}:00.000Z"

    def _add(self, entry: dict[str, Any], uuid: str) -> None:
        line = {
            "parentUuid": self.parent,
            "isSidechain": self.agent is not None,
            "sessionId": self.session,
            "version": "2.1.90",
            "uuid": uuid,
            "timestamp": self._ts(),
            **entry,
        }
        if self.agent is not None:
            line["agentId"] = self.agent
        self.lines.append(line)
        self.parent = uuid

    def user(self, uuid: str, text: str) -> None:
        self._add({"type": "user", "message": {"role": "user", "content": text}}, uuid)

    def call(self, uuid: str, call: Call, text: str = "done") -> None:
        i, read, write, out = call.usage
        usage = {
            "input_tokens": i,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": write,
            "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
            "output_tokens": out,
        }
        message = {
            "model": MODEL,
            "id": call.mid,
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "usage": usage,
        }
        self._add({"type": "assistant", "message": message, "requestId": "r" + call.mid}, uuid)

    def compaction(self, uuid: str, pre: int) -> None:
        """A 2.x compact boundary and its summary line."""
        logical = self.parent
        self.parent = None
        self._add(
            {
                "type": "system",
                "subtype": "compact_boundary",
                "logicalParentUuid": logical,
                "compactMetadata": {"trigger": "auto", "preTokens": pre},
                "content": "Conversation compacted",
            },
            uuid,
        )
        summary = {"role": "user", "content": "summary of the work so far"}
        self._add({"type": "user", "message": summary, "isCompactSummary": True}, uuid + "-s")

    def minutes(self, n: int) -> None:
        self.minute += n

    def copy(self, *, session: str | None = None, agent: str | None = None) -> Transcript:
        """A new file beginning with a copy of these lines, as a resume or a fork writes."""
        lines = copy.deepcopy(self.lines)
        for line in lines:
            if session is not None:
                line["sessionId"] = session
            if agent is not None:
                line["isSidechain"] = True
                line["agentId"] = agent
        return Transcript(session or self.session, lines, self.parent, self.minute, agent)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in self.lines), encoding="utf-8")
        return path


A1 = Call("msg_a1", (3, 0, 10_000, 40))
A2 = Call("msg_a2", (4, 10_000, 600, 50))
A3 = Call("msg_a3", (5, 10_600, 700, 60))


def conversation(session: str = "sess-a") -> Transcript:
    t = Transcript(session)
    t.user("u1", "first question")
    t.call("a1", A1)
    t.user("u2", "second question")
    t.call("a2", A2)
    return t


def only_trace(root: Path) -> Trace:
    (unit,) = discover([root])
    return load_unit(unit).trace


def totals(trace: Trace) -> dict[str, int]:
    df = session_stats([("t", trace)], PriceBook())
    names = ("requests", "input", "cache_read", "cache_write_5m", "output_recorded")
    return {c: int(df[c].sum()) for c in (*names, "compaction_calls")}


# -- compaction calls (agent-acompact-*) ----------------------------------------------------


def test_acompact_call_is_the_parents_compaction_event(tmp_path: Path) -> None:
    main = conversation()
    fork = main.copy(agent="acompact-1")
    fork.user("p1", "summarise the conversation")
    summary_call = Call("msg_c1", (900, 10_600, 0, 2_000))
    fork.call("c1", summary_call, "the summary")
    main.compaction("b1", pre=10_654)
    main.user("u3", "third question")
    main.call("a3", A3)
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-acompact-1.jsonl")

    trace = only_trace(tmp_path)
    (session,) = trace.sessions  # no session for the copy
    assert session.n_requests == 3
    (event,) = session.events
    assert event.request == 2
    assert event.call_usage == (900, 10_600, 0, 0, 2_000)
    assert trace.stats["compaction_calls_attached"] == 1
    assert trace.stats["calls_copied"] == 2
    # every call once: three requests plus the compaction call
    assert totals(trace) == {
        "requests": 3,
        "input": 3 + 4 + 5 + 900,
        "cache_read": 10_000 + 10_600 + 10_600,
        "cache_write_5m": 10_000 + 600 + 700,
        "output_recorded": 40 + 50 + 60 + 2_000,
        "compaction_calls": 1,
    }


def test_acompact_without_a_logged_compaction_keeps_only_its_own_call(tmp_path: Path) -> None:
    """The shape of ../shared/repro/fidelity/fork: the parent logged no boundary (the
    recording ended first), so the call stays a compaction session, of one request."""
    main = conversation()
    fork = main.copy(agent="acompact-2")
    fork.user("p1", "summarise the conversation")
    fork.call("c1", Call("msg_c2", (900, 10_600, 0, 2_000)))
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-acompact-2.jsonl")

    trace = only_trace(tmp_path)
    assert [(s.kind, s.parent, s.n_requests) for s in trace.sessions] == [
        ("main", -1, 2),
        ("compaction", 0, 1),
    ]
    assert trace.sessions[0].events == []
    assert trace.stats["compaction_calls_unattached"] == 1
    assert totals(trace)["requests"] == 3  # 2 real calls of the parent + the summary call


def test_aside_question_has_only_its_own_call_with_the_copied_context(tmp_path: Path) -> None:
    main = conversation()
    aside = main.copy(agent="aside_question-1")
    aside.user("q1", "by the way, which file was it?")
    aside.call("c1", Call("msg_q1", (7, 0, 10_700, 30)))
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    aside.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-aside_question-1.jsonl")

    trace = only_trace(tmp_path)
    parent, side = trace.sessions
    assert (parent.n_requests, side.kind, side.parent, side.n_requests) == (2, "subagent", 0, 1)
    # its one request is sent with the copied history: 3 user texts, 2 assistant texts
    visible = side.view_mask(0)
    kinds = side.blocks["kind"][visible]
    assert int((kinds == Kind.TEXT).sum()) == 5
    assert side.requests["cache_write_5m"].tolist() == [10_700]
    assert totals(trace)["requests"] == 3


# -- resumed files --------------------------------------------------------------------------


def resumed_pair(root: Path, *, zero_copy: bool) -> tuple[Path, Path]:
    """An original and the file that resumes it an hour later, its copied lines carrying
    the new session id (as 2.1.2xx writes them); the resumed file sorts first by name."""
    original = conversation("sess-b")
    resumed = original.copy(session="sess-0")
    if zero_copy:  # the copy of the last call was written while it streamed
        resumed.lines[-1]["message"]["usage"] = {"input_tokens": 0, "output_tokens": 0}
    resumed.minutes(60)
    resumed.user("u3", "back again")
    resumed.call("a3", Call("msg_a3", (5, 0, 10_800, 60)))
    return (
        original.write(root / "proj" / "sess-b.jsonl"),
        resumed.write(root / "proj" / "sess-0.jsonl"),
    )


def test_resumed_file_continues_its_original_counted_once(tmp_path: Path) -> None:
    resumed_pair(tmp_path, zero_copy=True)
    (unit,) = discover([tmp_path])
    assert [f.path.name for f in unit.files] == ["sess-0.jsonl", "sess-b.jsonl"]
    assert unit.roles == ["resume"]
    trace = load_unit(unit).trace
    (session,) = trace.sessions
    assert session.id == "sess-b"  # the conversation began there
    assert session.n_requests == 3
    # the copy's zero usage of msg_a2 gives way to the original's
    assert session.requests["input"].tolist() == [3, 4, 5]
    assert session.requests["cache_read"].tolist() == [0, 10_000, 0]
    assert trace.stats["calls_copied"] == 2
    assert trace.stats["files_resumed"] == 1


def test_resumed_file_in_another_directory_is_the_same_unit(tmp_path: Path) -> None:
    original, resumed = resumed_pair(tmp_path, zero_copy=False)
    other = tmp_path / "elsewhere"
    other.mkdir()
    resumed.rename(other / resumed.name)
    units = discover([original.parent, other])
    (unit,) = units
    assert sorted(f.path.name for f in unit.files) == ["sess-0.jsonl", "sess-b.jsonl"]
    assert load_unit(unit).trace.sessions[0].n_requests == 3


def test_fork_is_a_session_of_its_own_calls_linked_to_its_origin(tmp_path: Path) -> None:
    """Both files go on after the shared calls: the fork keeps only its own calls."""
    original = conversation("sess-a")
    fork = original.copy(session="sess-f")
    fork.user("f3", "try it the other way")
    fork.call("fa3", Call("msg_f3", (6, 10_600, 90, 70)))
    original.minutes(30)
    original.user("u3", "third question")
    original.call("a3", A3)
    original.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-f.jsonl")

    trace = only_trace(tmp_path)
    assert [(s.id, s.kind, s.parent, s.n_requests) for s in trace.sessions] == [
        ("sess-f", "main", -1, 3),  # diverged first (its own call came 30 minutes earlier)
        ("sess-a", "main", 0, 1),
    ]
    assert trace.stats["sessions_forked"] == 1
    assert totals(trace)["requests"] == 4


def test_a_compaction_copied_into_a_fork_is_not_its_own(tmp_path: Path) -> None:
    original = conversation("sess-a")
    original.compaction("b1", pre=10_654)
    original.user("u3", "third question")
    original.call("a3", A3)
    fork = original.copy(session="sess-f")
    original.user("u4", "fourth question")
    original.call("a4", Call("msg_a4", (2, 11_300, 50, 20)))
    fork.minutes(10)
    fork.user("f4", "something else")
    fork.call("fa4", Call("msg_f4", (2, 11_300, 80, 20)))
    original.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-f.jsonl")

    trace = only_trace(tmp_path)
    first, second = trace.sessions
    assert (first.id, first.n_requests, len(first.events)) == ("sess-a", 4, 1)
    assert (second.id, second.n_requests, second.events) == ("sess-f", 1, [])
    assert trace.stats["compactions_copied"] == 1


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(min_value=1, max_value=6),
    copied=st.integers(min_value=1, max_value=6),
    own=st.integers(min_value=0, max_value=3),
    goes_on=st.integers(min_value=0, max_value=3),
)
def test_calls_are_counted_once_however_the_history_is_copied(
    tmp_path_factory: pytest.TempPathFactory, n: int, copied: int, own: int, goes_on: int
) -> None:
    """A file copying the first `copied` of `n` calls, then making `own` calls, while the
    original makes `goes_on` more: the unit holds n + own + goes_on requests (only when
    `own` is 0 and the copy is whole may the copy hold nothing new)."""
    copied = min(copied, n)
    root = tmp_path_factory.mktemp("fork")
    original = Transcript("sess-a")
    calls = [Call(f"msg_{i}", (i + 1, 100 * i, 10, 5)) for i in range(n + goes_on)]
    for i in range(n):
        original.user(f"u{i}", f"question {i}")
        original.call(f"a{i}", calls[i])
    prefix = Transcript("sess-a", original.lines[: 2 * copied], f"a{copied - 1}", original.minute)
    fork = prefix.copy(session="sess-f")
    fork.minutes(5)
    for j in range(own):
        fork.user(f"f{j}", f"fork question {j}")
        fork.call(f"fa{j}", Call(f"msg_f{j}", (1, 2, 3, 4)))
    original.minutes(7)
    for i in range(n, n + goes_on):
        original.user(f"u{i}", f"question {i}")
        original.call(f"a{i}", calls[i])
    original.write(root / "proj" / "sess-a.jsonl")
    fork.write(root / "proj" / "sess-f.jsonl")
    trace = only_trace(root)
    got = totals(trace)
    assert got["requests"] == n + own + goes_on
    assert got["input"] == sum(c.usage[0] for c in calls) + own
    assert got["cache_read"] == sum(c.usage[1] for c in calls) + 2 * own
    # The file whose calls came later is the fork: it sent its first call with the copied
    # context (Session.fork), which ends inside its blocks; a session with no call of its
    # own has none.
    forks = [s for s in trace.sessions if s.fork is not None]
    assert len(forks) <= 1
    for s in forks:
        assert s.n_requests and 0 <= s.fork.block < len(s.blocks)
        assert s.fork.sent_ms <= s.fork.end_ms <= int(s.requests["ts"][0])  # used before


def test_call_usage_round_trips_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    main = conversation()
    fork = main.copy(agent="acompact-3")
    fork.user("p1", "summarise the conversation")
    fork.call("c1", Call("msg_c3", (900, 10_600, 0, 2_000)))
    main.compaction("b1", pre=10_654)
    main.user("u3", "third question")
    main.call("a3", A3)
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-acompact-3.jsonl")
    trace = only_trace(tmp_path)
    data = compiled.to_bytes(trace)
    back = compiled.from_bytes(data)
    assert back.equals(trace)
    event = back.sessions[0].events[0]
    assert event.call_usage == (900, 10_600, 0, 0, 2_000)
    # the fork's prompt line (its 5th) and the call's response (its 6th), a minute apart
    start = int(back.sessions[0].requests["ts"][0]) - 60_000
    assert event.call_ms == (start + 5 * 60_000, start + 6 * 60_000)
    assert event.call_ms is not None

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    for key, bad in (
        ("call_usage", [900, -1, 0, 0, 2_000]),
        ("call_ms", [event.call_ms[1], event.call_ms[0]]),  # done before it was sent
        ("call_ms", [event.call_ms[0]]),
    ):
        meta = json.loads(entries["meta.json"])
        meta["sessions"][0]["events"][0][key] = bad
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, raw in entries.items():
                zf.writestr(name, json.dumps(meta).encode() if name == "meta.json" else raw)
        with pytest.raises(TraceError) as info:
            compiled.from_bytes(buf.getvalue())
        assert info.value.category == "compiled-schema"
        assert key in str(info.value)


def test_a_subagents_compaction_call_goes_to_the_subagent(tmp_path: Path) -> None:
    """The acompact file sorts before the subagent it copies (`agent-acompact-...` before
    `agent-ad9`): it is still read after it, so the copied calls are the subagent's."""
    main = conversation()
    sub = Transcript("sess-a", agent="ad9")
    sub.user("s1", "look into it")
    sub.call("sa1", Call("msg_s1", (3, 0, 5_000, 20)))
    sub.user("s2", "and then")
    sub.call("sa2", Call("msg_s2", (4, 5_000, 300, 30)))
    fork = sub.copy(agent="acompact-9")
    fork.user("p1", "summarise the conversation")
    fork.call("c1", Call("msg_c9", (800, 5_300, 0, 1_500)))
    sub.compaction("b1", pre=5_354)
    sub.user("s3", "go on")
    sub.call("sa3", Call("msg_s3", (5, 0, 2_000, 40)))
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    agents = tmp_path / "proj" / "sess-a" / "subagents"
    sub.write(agents / "agent-ad9.jsonl")
    fork.write(agents / "agent-acompact-9.jsonl")

    trace = only_trace(tmp_path)
    assert [(s.kind, s.n_requests) for s in trace.sessions] == [("main", 2), ("subagent", 3)]
    (event,) = trace.sessions[1].events
    assert event.call_usage == (800, 5_300, 0, 0, 1_500)
    assert totals(trace)["requests"] == 5


def compacted_on_resume(root: Path, *, with_original: bool = True) -> None:
    """An original whose last call (msg_a2) and its tool result were logged, and the file
    that resumes it and compacts at once, as 2.1.226 writes it (../shared flutter-docker
    aba9151e): the copied history, then the boundary (its logical parent the preserved
    segment's tail), the summary, and the preserved segment copied again under the summary
    (msg_a2's copy logged with zero usage), then the first call after the compaction."""
    original = conversation("sess-b")
    original.user("t2", "result of the last step")
    resumed = original.copy(session="sess-0")
    segment = resumed.lines[-2:]
    del resumed.lines[-2:]
    segment[0]["message"]["usage"] = {"input_tokens": 0, "output_tokens": 0}
    resumed.minutes(5)
    resumed.parent = "t2"
    resumed.compaction("b1", pre=10_700)
    boundary = resumed.lines[-2]
    boundary["compactMetadata"]["preservedSegment"] = {
        "headUuid": "a2",
        "anchorUuid": "b1-s",
        "tailUuid": "t2",
    }
    segment[0]["parentUuid"] = "b1-s"
    resumed.lines.extend(segment)
    resumed.parent = "t2"
    resumed.user("u3", "third question")
    resumed.call("a3", Call("msg_a3", (5, 0, 1_500, 60)))
    if with_original:
        original.write(root / "proj" / "sess-b.jsonl")
    resumed.write(root / "proj" / "sess-0.jsonl")


def test_a_compaction_written_on_resume_starts_at_the_first_call_sent_after_it(
    tmp_path: Path,
) -> None:
    """msg_a2 was sent before the compaction (the compaction preserved its response), so
    its context is the history before the boundary and the event is at the next request;
    the preserved response and tool result stay in the compacted context, the earlier
    history does not."""
    compacted_on_resume(tmp_path)
    trace = only_trace(tmp_path)
    (session,) = trace.sessions
    assert session.recorded_context().tolist() == [10_003, 10_604, 1_505]
    assert [(e.request, e.trigger, e.pre_tokens) for e in session.events] == [(2, "auto", 10_700)]
    assert trace.stats["compactions_relinked"] == 1
    b = session.blocks
    kinds = b["kind"]
    laid = b["first_request"]
    sent_1 = session.view_mask(1, as_recorded=True)
    assert not (sent_1 & (kinds == Kind.SUMMARY)).any()
    # request 1 saw u1, a1's answer and u2: the three blocks laid for requests 0 and 1
    assert int(sent_1.sum()) == 3 and set(laid[sent_1].tolist()) == {0, 1}
    sent_2 = session.view_mask(2, as_recorded=True)
    # request 2: the summary, a2's answer, the tool result and u3, all laid at request 2
    assert int(sent_2.sum()) == 4 and set(laid[sent_2].tolist()) == {2}
    assert int((sent_2 & (kinds == Kind.SUMMARY)).sum()) == 1


def test_the_resumed_file_alone_places_its_compaction_the_same_way(tmp_path: Path) -> None:
    """The rule reads the resumed file's own structure (its boundary's logical parent
    descends from the boundary), not the original: without it, msg_a2 keeps the copy's
    zero usage but is still sent before the compaction."""
    compacted_on_resume(tmp_path, with_original=False)
    (session,) = only_trace(tmp_path).sessions
    assert session.id == "sess-0"
    assert session.recorded_context().tolist() == [10_003, 0, 1_505]
    assert [e.request for e in session.events] == [2]
    assert not (
        session.view_mask(1, as_recorded=True) & (session.blocks["kind"] == Kind.SUMMARY)
    ).any()
