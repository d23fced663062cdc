"""The skill listing a 2.1.2xx transcript logs (`Session.skill_listing`): the size of the
first whole listing the client announced, which claude-code@2.1.221 leaves out after a
compaction (policies/claude_code/autocompact.py `_listing_size`). Hand-written transcripts
(tests/traces/test_claude_code_forks.py `Transcript`), the listing as an attachment line
chained into the conversation as the client writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.compiled_meta import with_session_meta
from tests.traces.test_claude_code_forks import A1, A2, Transcript, only_trace
from traces import compiled
from traces.errors import TraceError
from traces.tokens import count_tokens

LISTING = "- commit: write a commit message\n" * 40


def _attachment(t: Transcript, uuid: str, **attachment: Any) -> None:
    t._add({"type": "attachment", "attachment": attachment}, uuid)


def _conversation(tmp_path: Path, *listings: dict[str, Any]) -> Transcript:
    t = Transcript("sess-l")
    for i, listing in enumerate(listings):
        _attachment(t, f"l{i}", type="skill_listing", **listing)
    t.user("u1", "first question")
    t.call("a1", A1)
    t.user("u2", "second question")
    t.call("a2", A2)
    t.write(tmp_path / "proj" / "sess-l.jsonl")
    return t


def test_the_first_whole_listing_is_counted(tmp_path: Path) -> None:
    _conversation(
        tmp_path,
        {"isInitial": True, "content": LISTING, "skillCount": 40},
        {"isInitial": True, "content": LISTING * 2},  # a restarted process's: not the first
    )
    (session,) = only_trace(tmp_path).sessions
    assert session.skill_listing == count_tokens(LISTING) > 300
    assert session.n_requests == 2  # the attachment lines are no messages


@pytest.mark.parametrize(
    "listing",
    [
        {"isInitial": False, "content": LISTING},  # a delta, not the listing
        {"isInitial": True},  # no text
        {"isInitial": "yes", "content": LISTING},
        {"isInitial": True, "content": ["not", "text"]},
    ],
)
def test_no_whole_listing_counts_none(tmp_path: Path, listing: dict[str, Any]) -> None:
    _conversation(tmp_path, listing)
    (session,) = only_trace(tmp_path).sessions
    assert session.skill_listing == -1
    assert session.n_requests == 2


def test_the_count_round_trips_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    _conversation(tmp_path, {"isInitial": True, "content": LISTING})
    trace = only_trace(tmp_path)
    data = compiled.to_bytes(trace)
    back = compiled.from_bytes(data)
    assert back.equals(trace) and back.sessions[0].skill_listing == count_tokens(LISTING)
    trace.sessions[0].skill_listing = -1
    plain = compiled.to_bytes(trace)
    assert b"skill_listing" not in plain
    assert compiled.from_bytes(plain).sessions[0].skill_listing == -1
    for bad in (-1, True, "x", 2**40):
        with pytest.raises(TraceError) as err:
            compiled.from_bytes(with_session_meta(data, "skill_listing", bad))
        assert err.value.category == "compiled-schema"
        assert "skill_listing" in str(err.value)
