"""The prompt suggestion Claude Code sends when a turn ends writes the cache through the
end of the response (policies/prompt_suggestion.py `post_turn_writes`): the user's next prompt
reads into the previous response, which no logged request wrote.

Every session: Sonnet 5 (cache minimum 1,024 tokens; entries live their TTL from a
request's send), a 5,000-token prefix inferred from the first request, nothing cached
before it. Request 0 sends a 1,000-token message and writes 6,000 (prefix and message); its
response (200 tokens) ends at `END`; request 1 adds an 800-token user prompt.
"""

from __future__ import annotations

import polars as pl

from policies.prompt_suggestion import POST_TURN_SINCE, post_turn_writes
from simulator import policy as registry
from simulator.model import Flag, Kind, Role, Trace, version_tuple
from simulator.replay import replay
from traces.builder import Hasher, RecordedUsage, SessionBuilder

SONNET_5 = "claude-sonnet-5"
T0 = 1_760_000_000_000
SECOND = 1_000
#: Request 0's response ends a minute after it was sent.
END = T0 + 60 * SECOND
NEW_CLIENT = "claude-code 2.1.220"


def session(
    read: int,
    *,
    at: int = T0 + 120 * SECOND,
    client: str = NEW_CLIENT,
    tool_use: bool = False,
) -> Trace:
    """Request 0 as above; request 1 sent at `at` with the recorded cache read `read` (the
    rest of its 6,000 + 200 + 800 tokens written). `tool_use`: request 0's response is a
    tool use and request 1 adds its result (no end of turn)."""
    b = SessionBuilder(Hasher(b"post-turn"), id="s", kind="main", client=client)
    b.add_block(
        msg=0, kind=Kind.TEXT, role=Role.USER, text="ask", ts=T0 - 1, first_request=0,
        tokens=1_000, flags=Flag.HUMAN,
    )  # fmt: skip
    b.add_request(ts=T0, model=SONNET_5, usage=RecordedUsage(0, 0, 6_000, 0, 200), ts_end=END)
    kind = Kind.TOOL_USE if tool_use else Kind.TEXT
    b.add_block(
        msg=1, kind=kind, role=Role.ASSISTANT, text="answer", ts=END, first_request=1,
        tokens=200, origin=0,
    )  # fmt: skip
    b.add_block(
        msg=2, kind=Kind.TOOL_RESULT if tool_use else Kind.TEXT, role=Role.USER, text="next",
        ts=at - 1, first_request=1, tokens=800, flags=Flag.NONE if tool_use else Flag.HUMAN,
    )  # fmt: skip
    usage = RecordedUsage(0, read, 7_000 - read, 0, 50)
    b.add_request(ts=at, model=SONNET_5, usage=usage, ts_end=at + 10 * SECOND)
    return Trace(format="claude-code", source_digest="cd" * 32, sessions=[b.finish()])


def replayed(
    trace: Trace, policy: str = "as-recorded", params: dict[str, object] | None = None
) -> pl.DataFrame:
    """A replay's request rows (as-recorded unless `policy` says otherwise)."""
    frame = replay([("post-turn", trace)], registry.build(policy, params))
    return frame.filter(pl.col("kind") == "request").sort("request")


def request_1(
    trace: Trace, policy: str = "as-recorded", params: dict[str, object] | None = None
) -> tuple[int, int]:
    """Request 1's (cache read, 5-minute writes)."""
    row = replayed(trace, policy, params).row(1, named=True)
    return row["cache_read"], row["cache_write_5m"]


def test_the_next_prompt_reads_the_response_the_suggestion_wrote() -> None:
    # Without the post-turn entry the read would stop at request 0's 6,000 and write 1,000.
    assert request_1(session(6_200)) == (6_200, 800)
    # Request 0 is priced as before: the suggestion itself is not.
    first = replayed(session(6_200)).row(0, named=True)
    assert (first["cache_read"], first["cache_write_5m"]) == (0, 6_000)
    assert replayed(session(6_200)).height == 2


def test_the_entry_lives_its_ttl_from_the_end_of_the_turn() -> None:
    # 330 s after request 0 was sent its own entry is gone (5 minutes from the send), the
    # suggestion's, written when the response ended 60 s later, is not: 6,200 are read.
    assert request_1(session(6_200, at=T0 + 330 * SECOND)) == (6_200, 800)
    # 370 s after the send, 310 s after the end, both are gone: nothing is read (a read
    # beyond the prefix after the TTL is no warm prefix either: simulator/prefix.py).
    assert request_1(session(6_200, at=T0 + 370 * SECOND)) == (0, 7_000)


def test_the_version_gate() -> None:
    assert version_tuple(NEW_CLIENT) == (2, 1, 220)
    assert version_tuple("claude-code 2.0.71") == POST_TURN_SINCE
    assert version_tuple("codex") == ()
    assert version_tuple("0.126.0-alpha.8") == (0, 126, 0)  # a Codex cli pre-release
    assert version_tuple("") == ()
    assert version_tuple("claude-code 2.1.x") == (2, 1)  # up to the first part not a number
    old = session(6_200, client="claude-code 2.0.50")  # before prompt suggestions
    assert post_turn_writes(old.sessions[0]) == {}
    assert request_1(old) == (6_000, 1_000)
    new = session(6_200).sessions[0]
    response = int((new.blocks["origin"] == 0).nonzero()[0][0])
    assert post_turn_writes(new) == {1: response}


def test_no_post_turn_entry_within_a_turn_or_without_the_read() -> None:
    # A response with a tool use does not end the turn: no suggestion is sent.
    assert request_1(session(6_200, tool_use=True)) == (6_000, 1_000)
    # A read less than half into the response, or beyond it (into the new prompt, which
    # no suggestion wrote), is no evidence of one.
    assert post_turn_writes(session(6_050).sessions[0]) == {}
    assert post_turn_writes(session(6_700).sessions[0]) == {}
    assert request_1(session(6_000)) == (6_000, 1_000)


def test_the_claude_code_pipeline_keeps_the_suggestions_entry() -> None:
    """The client sends the suggestion whatever its context policy: the claude-code
    pipeline (each session's own version's preset) reads the response too, unless
    `prompt_suggestion` is off; claude-code@1.0 predates the feature."""
    trace = session(6_200)
    assert request_1(trace, "claude-code") == (6_200, 800)
    assert request_1(trace, "claude-code@latest") == (6_200, 800)
    assert request_1(trace, "claude-code", {"prompt_suggestion": False}) == (6_000, 1_000)
    assert request_1(trace, "claude-code@1.0") == (6_000, 1_000)
    # No read into the response recorded: no entry, as under as-recorded.
    assert request_1(session(6_000), "claude-code") == (6_000, 1_000)
    # Not priced: the policy sends what it sent before, and nothing more.
    assert replayed(trace, "claude-code").height == 2
