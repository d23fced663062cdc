"""The Claude Code reader marks the requests a new client process sent first
(`Session.restarted_at`): a version change between lines, a `SessionStart:resume` hook, a
resumed file. Hand-written 2.1.x transcripts (tests/traces/test_claude_code_forks.py's
`Transcript`); each expectation is the request index worked out from what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.model import Session
from tests.support.compiled_meta import with_session_meta
from tests.traces.test_claude_code_forks import Call, Transcript, only_trace, resumed_pair
from traces import compiled
from traces.errors import TraceError


def _versions(t: Transcript, version: str, start: int) -> None:
    """Lines from `start` on written by a process of `version`."""
    for line in t.lines[start:]:
        line["version"] = version


def _four_calls() -> Transcript:
    """Requests 0-3, one user line and one call each (lines 2k and 2k + 1)."""
    t = Transcript("sess-r")
    for i in range(4):
        t.user(f"u{i}", f"question {i}")
        t.call(f"a{i}", Call(f"msg_{i}", (3, 1_000 * i, 100, 10)))
    return t


def _hook(t: Transcript, uuid: str, source: str, at: int) -> None:
    """A `SessionStart` hook's attachment line (as 2.1.2xx logs it) inserted at `at`."""
    line: dict[str, Any] = {
        "type": "attachment",
        "uuid": uuid,
        "parentUuid": t.lines[at - 1]["uuid"],
        "sessionId": t.session,
        "version": t.lines[at - 1]["version"],
        "timestamp": t.lines[at - 1]["timestamp"],
        "attachment": {
            "type": "hook_success",
            "hookName": f"SessionStart:{source}",
            "hookEvent": "SessionStart",
            "exitCode": 0,
        },
    }
    t.lines.insert(at, line)


def _session(t: Transcript, tmp_path: Path) -> Session:
    t.write(tmp_path / "proj" / f"{t.session}.jsonl")
    (session,) = only_trace(tmp_path).sessions
    return session


def test_a_new_version_mid_session_marks_the_first_request_it_sent(tmp_path: Path) -> None:
    """Lines 0-3 by 2.1.226, lines 4-7 by 2.1.228 (the user line of request 2 first): the
    process that sent request 2 is not the one that sent request 1."""
    t = _four_calls()
    _versions(t, "2.1.226", 0)
    _versions(t, "2.1.228", 4)
    session = _session(t, tmp_path)
    assert session.n_requests == 4
    assert session.restarted_at == [2]
    assert session.client == "claude-code 2.1.228"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(["2.1.226", "2.1.228", "2.1.232"]), min_size=1, max_size=6))
def test_every_version_change_between_requests_is_a_restart(
    tmp_path_factory: pytest.TempPathFactory, versions: list[str]
) -> None:
    """Request k's user line and call written by a process of `versions[k]`: the restarts
    are the requests whose version is not the one before (a repeat is the same process)."""
    t = Transcript("sess-v")
    for i, version in enumerate(versions):
        t.user(f"u{i}", f"question {i}")
        t.call(f"a{i}", Call(f"msg_{i}", (3, 1_000 * i, 100, 10)))
        _versions(t, version, 2 * i)
    session = _session(t, tmp_path_factory.mktemp("v"))
    expected = [k for k in range(1, len(versions)) if versions[k] != versions[k - 1]]
    assert session.n_requests == len(versions)
    assert session.restarted_at == expected


def test_lines_without_a_version_are_no_evidence(tmp_path: Path) -> None:
    """Metadata lines that carry no version (`last-prompt`, `mode`: written at every turn)
    between requests 1 and 2, and one version throughout: no restart."""
    t = _four_calls()
    t.lines.insert(4, {"type": "last-prompt", "sessionId": t.session})
    t.lines.insert(5, {"type": "mode", "mode": "normal", "sessionId": t.session})
    assert _session(t, tmp_path).restarted_at == []


@pytest.mark.parametrize(
    ("source", "restarted"),
    [("resume", [3]), ("fork", [3]), ("compact", []), ("clear", []), ("startup", [])],
)
def test_a_process_start_hook_marks_the_request_after_it(
    tmp_path: Path, source: str, restarted: list[int]
) -> None:
    """A `SessionStart` hook between requests 2 and 3 (before line 6, request 3's user
    line), same version: `resume` and `fork` fire when a process starts on the session
    (or a copy of it), the others inside a running one or at a session's start."""
    t = _four_calls()
    _hook(t, "h1", source, 6)
    t.lines[7]["parentUuid"] = "h1"
    assert _session(t, tmp_path).restarted_at == restarted


@pytest.mark.parametrize("attachment", [["SessionStart:resume"], {"hookName": ["x"]}, "resume"])
def test_a_malformed_hook_line_is_no_evidence_and_no_error(tmp_path: Path, attachment: Any) -> None:
    """An `attachment` that is not an object, or a `hookName` that is not a string: read
    as metadata, no restart."""
    t = _four_calls()
    _hook(t, "h1", "resume", 6)
    t.lines[6]["attachment"] = attachment
    t.lines[7]["parentUuid"] = "h1"
    assert _session(t, tmp_path).restarted_at == []


def test_two_restarts_and_one_hook_beside_a_version_change(tmp_path: Path) -> None:
    """2.1.226 -> 2.1.228 before request 1 with a resume hook on the same line range, and
    a resume on 2.1.228 before request 3: requests 1 and 3."""
    t = _four_calls()
    _versions(t, "2.1.226", 0)
    _versions(t, "2.1.228", 2)
    _hook(t, "h1", "resume", 2)
    t.lines[3]["parentUuid"] = "h1"
    _hook(t, "h2", "resume", 7)
    t.lines[8]["parentUuid"] = "h2"
    session = _session(t, tmp_path)
    assert session.n_requests == 4
    assert session.restarted_at == [1, 3]


def test_a_resumed_file_marks_its_first_own_call(tmp_path: Path) -> None:
    """`resumed_pair`: the resumed file copies msg_a1 and msg_a2 (requests 0, 1) on the same
    version and adds msg_a3 (request 2), made by the process that resumed."""
    resumed_pair(tmp_path, zero_copy=False)
    (session,) = only_trace(tmp_path).sessions
    assert session.n_requests == 3
    assert session.restarted_at == [2]


def test_the_mark_round_trips_and_older_files_read_without_it(tmp_path: Path) -> None:
    """Compiled and read back, the marks are kept; a compiled file that has no
    `restarted_at` (written before the field, or a session with none) reads as []."""
    t = _four_calls()
    _versions(t, "2.1.228", 4)
    t.write(tmp_path / "proj" / "sess-r.jsonl")
    trace = only_trace(tmp_path)
    data = compiled.to_bytes(trace)
    back = compiled.from_bytes(data)
    assert back.equals(trace) and back.sessions[0].restarted_at == [2]
    trace.sessions[0].restarted_at = []
    plain = compiled.to_bytes(trace)
    assert b"restarted_at" not in plain
    assert compiled.from_bytes(plain).sessions[0].restarted_at == []
    assert not compiled.from_bytes(plain).equals(back)


@pytest.mark.parametrize("restarted", [[4], [-1], [2, 1], [2, 2], [True], "x"])
def test_bad_restarts_in_a_compiled_file_are_refused(tmp_path: Path, restarted: Any) -> None:
    """Out of the session's 4 requests, not ascending, not integers: refused, naming the
    field."""
    t = _four_calls()
    t.write(tmp_path / "proj" / "sess-r.jsonl")
    data = compiled.to_bytes(only_trace(tmp_path))
    assert compiled.from_bytes(with_session_meta(data, "restarted_at", [1, 3])).sessions[
        0
    ].restarted_at == [1, 3]
    with pytest.raises(TraceError) as err:
        compiled.from_bytes(with_session_meta(data, "restarted_at", restarted))
    assert err.value.category == "compiled-schema"
    assert "restarted_at" in str(err.value)
