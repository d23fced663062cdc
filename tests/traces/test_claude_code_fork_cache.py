"""A fork shares its parent's prompt cache (`Session.fork`): Claude Code's /btw and
compaction files send their first call with the parent's context, whose entries the
parent's last copied call wrote (a forked session file does not: its system prompt names
the new session) (../shared/repro/fidelity/fork:
the compaction call read 35,371 of its 36,271 tokens where the replay, which started the
fork cold, wrote 25,668 of them: +199% on that session, +31% on the reproduction's bill).

Each test writes tiny transcripts by hand (tests/traces/test_claude_code_forks.py
`Transcript`) and checks the compiled fork, and what the replay reads at its first request,
against figures worked out from what was written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator import policy
from simulator.model import ForkContext, Kind, Session, Trace
from simulator.replay import replay
from simulator.view import FIVE_MINUTES
from tests.support.compiled_meta import with_session_meta
from tests.traces.test_claude_code_forks import Call, Transcript, only_trace
from traces import compiled
from traces.errors import TraceError

MINUTE = 60_000
#: Transcript's clock: line i of a file is written at 10:00 + i minutes of 2026-03-01.
T0 = 1_772_359_200_000  # 2026-03-01T10:00:00Z


#: The parent's calls, sized like a real conversation's (texts of thousands of tokens, so
#: that the blocks, not the system prompt, hold most of the context): a1 writes the 5k
#: system prompt and u1 (3,001 tokens), a2 reads that and writes a1's reply (501) and u2
#: (2,001): its context is 10,505.
B1 = Call("msg_b1", (3, 0, 8_000, 501))
B2 = Call("msg_b2", (4, 8_003, 2_498, 301))


def _conversation(session: str = "sess-a") -> Transcript:
    t = Transcript(session)
    t.user("u1", "alpha " * 3000)
    t.call("a1", B1, "beta " * 500)
    t.user("u2", "gamma " * 2000)
    t.call("a2", B2, "delta " * 300)
    return t


def _aside(tmp_path: Path, wait: int = 0) -> Trace:
    """The conversation and a /btw fork of it, asked `wait` minutes after the parent's
    last call; the fork reads the parent's last context (10,505) and writes a2's reply
    and the question."""
    main = _conversation()
    aside = main.copy(agent="aside_question-1")
    aside.minutes(wait)
    aside.user("q1", "by the way, which file was it?")
    aside.call("c1", Call("msg_q1", (7, 10_505, 303, 30)))
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    aside.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-aside_question-1.jsonl")
    return only_trace(tmp_path)


def _first_row(trace: Trace, index: int, name: str = "as-recorded") -> dict[str, Any]:
    frame = replay([("t", trace)], policy.build(name))
    rows = frame.filter((frame["session_index"] == index) & (frame["kind"] == "request"))
    return rows.row(0, named=True)


def _through(session: Session, block: int) -> int:
    """Tokens of the fork's first view through `block`: the inferred prefix, then its
    history blocks in order (every one enters at its first request)."""
    tokens = session.blocks["tokens"]
    assert (session.blocks["first_request"][: block + 1] == 0).all()
    return session.prefix_tokens + int(np.sum(tokens[: block + 1]))


def test_an_aside_question_is_a_fork_of_the_context_its_parent_cached(tmp_path: Path) -> None:
    trace = _aside(tmp_path)
    parent, side = trace.sessions
    assert side.fork is not None
    # The parent's last call (a2) was sent when u2 was written (10:03) and ended at 10:04;
    # its input is u1, a1, u2: the fork's blocks 0-2 (its a2 reply is block 3, q1 block 4).
    kinds = side.blocks["kind"].tolist()
    assert kinds[:5] == [Kind.TEXT] * 5
    assert side.fork == ForkContext(2, T0 + 3 * MINUTE, T0 + 4 * MINUTE, FIVE_MINUTES)
    assert parent.fork is None
    assert trace.stats["forks_of_a_cached_context"] == 1


@pytest.mark.parametrize("name", ["as-recorded", "claude-code"])
def test_the_fork_reads_what_its_parent_cached(tmp_path: Path, name: str) -> None:
    """Asked a minute after the parent's last call: its first request reads the parent's
    entry, through block 2, as the recording did; every policy seeds it (claude-code's
    first request sends the context as it is)."""
    trace = _aside(tmp_path)
    side = trace.sessions[1]
    row = _first_row(trace, 1, name)
    assert row["cache_read"] == _through(side, 2)
    assert row["cache_read"] == 10_505  # the recording's read: the parent's a2 context
    assert row["cache_write_5m"] + row["uncached_input"] == 303 + 7
    cold = _first_row(Trace(trace.format, trace.source_digest, [replace(side, fork=None)]), 0)
    # started cold, only the system prompt is read (warm from other sessions, as the
    # recording's first read shows for any session: simulator/prefix.py `shared`)
    assert cold["cache_read"] == side.prefix_tokens < 5_100


def test_a_fork_asked_after_the_parents_entries_expired_reads_them_no_more(
    tmp_path: Path,
) -> None:
    """Asked 7 minutes after the parent's last call (a 5-minute TTL): cold, as if no fork."""
    trace = _aside(tmp_path, wait=7)
    side = trace.sessions[1]
    assert side.fork is not None
    row = _first_row(trace, 1)
    cold = _first_row(Trace(trace.format, trace.source_digest, [replace(side, fork=None)]), 0)
    assert row["cache_read"] == cold["cache_read"] < _through(side, 2)


def test_the_parents_next_request_keeps_the_entry_alive(tmp_path: Path) -> None:
    """The parent goes on while the question is asked: its next request (a3, sent at 10:05
    when u3 was written, ended 10:06; the question copied nothing past a2) reads a2's entry
    and so keeps it: the question's call at 10:10 still finds it, where a2 alone (ended
    10:04: the fixture's model is a 2025 one, whose entries live from the response's end)
    left it alive until 10:09 only."""
    main = _conversation()
    aside = main.copy(agent="aside_question-2")
    main.user("u3", "third question")
    main.call("a3", Call("msg_a3", (5, 10_505, 310, 60)))
    aside.minutes(5)
    aside.user("q1", "by the way, which file was it?")  # 10:10
    aside.call("c1", Call("msg_q1", (7, 10_505, 303, 30)))
    main.write(tmp_path / "proj" / "sess-a.jsonl")
    aside.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-aside_question-2.jsonl")
    trace = only_trace(tmp_path)
    parent, side = trace.sessions
    assert side.fork is not None
    assert (side.fork.sent_ms, side.fork.end_ms) == (T0 + 5 * MINUTE, T0 + 6 * MINUTE)
    assert int(parent.requests["ts"][2]) == side.fork.sent_ms  # a3's send
    assert _first_row(trace, 1)["cache_read"] == _through(side, side.fork.block) == 10_505
    # Without the refresh (a2's own times), the entry was gone at 10:09.
    own = replace(side.fork, sent_ms=T0 + 3 * MINUTE, end_ms=T0 + 4 * MINUTE)
    alone = Trace(trace.format, trace.source_digest, [parent, replace(side, fork=own)])
    assert _first_row(alone, 1)["cache_read"] < 10_505


def test_a_forked_session_file_starts_cold(tmp_path: Path) -> None:
    """`--fork-session` / `/branch`: the new file's system prompt names the new session,
    so nothing of the parent's conversation is read (claude-code#77306): no fork context,
    the first call reads only what any new session finds warm."""
    original = _conversation()
    fork = original.copy(session="sess-f")
    original.user("u3", "third question")
    original.call("a3", Call("msg_a3", (5, 10_505, 310, 60)))
    fork.user("f3", "try it the other way")
    fork.call("fa3", Call("msg_f3", (6, 5_000, 5_900, 70)))
    original.write(tmp_path / "proj" / "sess-a.jsonl")
    fork.write(tmp_path / "proj" / "sess-f.jsonl")
    trace = only_trace(tmp_path)
    assert trace.stats["sessions_forked"] == 1
    assert all(s.fork is None for s in trace.sessions)
    assert "forks_of_a_cached_context" not in trace.stats


def test_the_fork_round_trips_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    trace = _aside(tmp_path)
    data = compiled.to_bytes(trace)
    back = compiled.from_bytes(data)
    assert back.equals(trace) and back.sessions[1].fork == trace.sessions[1].fork
    trace.sessions[1].fork = None
    assert not compiled.from_bytes(compiled.to_bytes(trace)).equals(back)
    # session 0 (the parent) has no fork: one written by hand for it must make sense
    n_blocks = len(trace.sessions[0].blocks)
    good = [n_blocks - 1, T0, T0 + MINUTE, FIVE_MINUTES]
    assert compiled.from_bytes(with_session_meta(data, "fork", good)).sessions[0].fork
    for bad in (
        [n_blocks, T0, T0, FIVE_MINUTES],  # no such block
        [-1, T0, T0, FIVE_MINUTES],
        [0, T0 + 1, T0, FIVE_MINUTES],  # ended before it was sent
        [0, T0, T0, 123],  # no TTL the API has
        [0, T0, T0],
        [0, T0, True, FIVE_MINUTES],
        "x",
    ):
        with pytest.raises(TraceError) as err:
            compiled.from_bytes(with_session_meta(data, "fork", bad))
        assert err.value.category == "compiled-schema"
        assert "fork" in str(err.value)
