"""A compaction call the recording logged (Claude Code's `agent-acompact-*.jsonl`, attached to
its parent's compaction as `CompactionEvent.call_usage`) is in the recording's bill and is
replayed by `as-recorded` as a call of its own (issue 12: that file's usage is the ground
truth for the price of the compaction call). Hand-written transcripts of
tests/traces/test_claude_code_forks.py: requests 0-1, the compaction call (900 uncached,
10,600 read, 2,000 out), the compacted request 2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from simulator import policy
from simulator.frames import recorded_cost
from simulator.model import Trace, request_columns
from simulator.pricing import PriceBook
from simulator.replay import replay
from tests.traces.test_claude_code_forks import A3, MODEL, Call, conversation, only_trace


def _trace(root: Path, *, logged: bool, request_after: bool = True, late: bool = False) -> Trace:
    """With `late`, the user comes back 3 minutes after request 1's response (the call goes
    out then) and the summary takes 3 more before the boundary is written."""
    main = conversation()
    fork = main.copy(agent="acompact-1")
    if late:
        fork.minutes(2)
        main.minutes(6)
    fork.user("p1", "summarise the conversation")
    fork.call("c1", Call("msg_c1", (900, 10_600, 0, 2_000)), "the summary")
    main.compaction("b1", pre=10_654)
    if request_after:
        main.user("u3", "third question")
        main.call("a3", A3)
    main.write(root / "proj" / "sess-a.jsonl")
    if logged:
        fork.write(root / "proj" / "sess-a" / "subagents" / "agent-acompact-1.jsonl")
    return only_trace(root)


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Trace, Trace]:
    return _trace(tmp_path / "logged", logged=True), _trace(tmp_path / "not", logged=False)


def test_as_recorded_sends_the_logged_compaction_call(traces: tuple[Trace, Trace]) -> None:
    """Before request 2: request 1's context (4 + 10,000 + 600 = 10,604), then the 896 the
    call added (11,500 logged in all); marked on the parent's last item (skipCacheWrite),
    so it writes nothing, reads the entry request 1 wrote and sends the rest uncached.
    Request 1's 4 uncached tokens are no item of their own (`_message_mark` puts its
    marker on its last item), so that entry holds all 10,604: the call reads 4 more than
    the log's 10,600 and sends 896 uncached against 900."""
    logged, _ = traces
    frame = replay([("t", logged)], policy.build("as-recorded"))
    calls = frame.filter(pl.col("kind") == "compaction")
    assert calls.select("request", "stage").rows() == [(2, "recorded")]
    row = calls.row(0, named=True)
    got = (row["context_tokens"], row["uncached_input"], row["cache_read"], row["output"])
    assert got == (11_500, 896, 10_604, 2_000)
    assert row["cache_write_5m"] + row["cache_write_1h"] == 0
    requests = frame.filter(pl.col("kind") == "request")
    assert requests["request"].to_list() == [0, 1, 2]


def test_without_the_logged_call_nothing_is_sent(traces: tuple[Trace, Trace]) -> None:
    _, unlogged = traces
    frame = replay([("t", unlogged)], policy.build("as-recorded"))
    assert frame.filter(pl.col("kind") == "compaction").is_empty()


def test_the_recordings_bill_counts_the_logged_compaction_call(
    traces: tuple[Trace, Trace],
) -> None:
    """The call at the session's model (Opus 4.5: $5 / M input, $0.50 / M cache read,
    $25 / M output): 900 x 5 + 10,600 x 0.5 + 2,000 x 25 = 59,800 micro-dollars more."""
    logged, unlogged = traces
    book = PriceBook()
    with_call = recorded_cost([("t", logged)], book)
    without = recorded_cost([("t", unlogged)], book)
    assert with_call is not None and without is not None
    assert logged.sessions[0].models == [MODEL]
    assert with_call - without == pytest.approx(0.0598, abs=1e-9)


def test_as_recorded_and_the_bill_agree_on_the_call(traces: tuple[Trace, Trace]) -> None:
    """Replayed, the call costs 896 x 5 + 10,604 x 0.5 + 2,000 x 25 = 59,782 micro-dollars,
    18 short of the bill's 59,800 (the 4 tokens read that the log sent uncached); the
    requests cost the same with it or without."""
    logged, unlogged = traces
    book = PriceBook()
    with_call = replay([("t", logged)], policy.build("as-recorded"))
    without = replay([("t", unlogged)], policy.build("as-recorded"))
    call = with_call.filter(pl.col("kind") == "compaction")["cost_total"].sum()
    assert call == pytest.approx(0.059782, abs=1e-9)
    bill = recorded_cost([("t", logged)], book)
    unbilled = recorded_cost([("t", unlogged)], book)
    assert bill is not None and unbilled is not None
    assert bill - unbilled - call == pytest.approx(0.000018, abs=1e-9)
    assert without["cost_total"].sum() == pytest.approx(
        with_call.filter(pl.col("kind") == "request")["cost_total"].sum(), abs=1e-9
    )


def test_fidelity_compares_the_logged_compaction_call(traces: tuple[Trace, Trace]) -> None:
    """The call is compared like a request, before the request it precedes: read 4 over
    the log's (within 1% of its 11,500), so matched; the unlogged file has no such row."""
    from simulator.app.fidelity import compare, summarize
    from simulator.app.fidelity_report import render

    logged, unlogged = traces
    named = [("t", logged)]
    per = compare(replay(named, policy.build("as-recorded")), named)
    assert per.select("request", "kind").rows()[2:] == [(2, "compaction"), (2, "request")]
    call = per.row(2, named=True)
    assert (call["rec_cache_read"], call["sim_cache_read"], call["err_cache_read"]) == (
        10_600,
        10_604,
        4,
    )
    assert call["recorded_context"] == 11_500 and call["matched"]
    sessions, overall = summarize(per)
    assert (overall["requests"], overall["compaction_calls"]) == (4, 1)
    assert "4 in 1 session(s) (1 of them the recording's compaction calls)" in render(
        sessions, overall
    )
    plain = [("t", unlogged)]
    other = compare(replay(plain, policy.build("as-recorded")), plain)
    assert other["kind"].to_list() == ["request"] * 3


def test_a_call_with_no_request_after_it_is_left_out_of_both(tmp_path: Path) -> None:
    """A session that ends compacting: its call has no request to go out before, so the
    replay cannot send it and the bill leaves it out too (`Session.logged_calls`): both
    as without the acompact file."""
    trace = _trace(tmp_path / "logged", logged=True, request_after=False)
    plain = _trace(tmp_path / "not", logged=False, request_after=False)
    (session,) = trace.sessions
    (event,) = session.events
    assert event.call_usage is not None and event.request == session.n_requests == 2
    assert session.logged_calls() == {}
    frame = replay([("t", trace)], policy.build("as-recorded"))
    assert frame.filter(pl.col("kind") == "compaction").is_empty()
    without = replay([("t", plain)], policy.build("as-recorded"))
    assert frame["cost_total"].sum() == without["cost_total"].sum()
    book = PriceBook()
    assert recorded_cost([("t", trace)], book) == recorded_cost([("t", plain)], book)


def test_the_logged_calls_of_a_session(traces: tuple[Trace, Trace]) -> None:
    """Timed from the acompact file: sent when its prompt line was written (minute 5 of
    the transcript), done at its response's line (minute 6)."""
    logged, unlogged = traces
    minute = 60_000
    start = int(logged.sessions[0].requests["ts"][0]) - minute  # u1, the first line
    sent, done = start + 5 * minute, start + 6 * minute
    assert logged.sessions[0].logged_calls() == {2: ((900, 10_600, 0, 0, 2_000), (sent, done))}
    assert unlogged.sessions[0].logged_calls() == {}


def _call_row(trace: Trace) -> dict[str, object]:
    frame = replay([("t", trace)], policy.build("as-recorded"))
    return frame.filter(pl.col("kind") == "compaction").row(0, named=True)


def test_the_call_reads_what_was_alive_when_it_was_sent(tmp_path: Path) -> None:
    """Request 1 is sent at minute 3 (its response at 4), the call at 7, the compaction's
    boundary is written at 11 and request 2 sent at 13 (minutes of the transcript). Opus
    4.5's entries live 5 minutes from the response's end (simulator/prompt_cache.py), so
    request 1's lives to 9: the call, sent at 7, reads its 10,604 tokens; priced at the
    boundary, as a call compiled before its times were kept is, or at request 2's send,
    it would find that entry gone and write it again through the parent's last item."""
    trace = _trace(tmp_path, logged=True, late=True)
    (session,) = trace.sessions
    (event,) = session.events
    ts = session.requests["ts"].tolist()
    ((_, ms),) = session.logged_calls().values()
    minute = 60_000
    t0 = ts[0] - minute
    assert (ts[1], ms, event.ts, ts[2]) == (
        t0 + 3 * minute,
        (t0 + 7 * minute, t0 + 8 * minute),
        t0 + 11 * minute,
        t0 + 13 * minute,
    )
    row = _call_row(trace)
    assert row["ts_ms"] == ms[0]
    got = (row["cache_read"], row["cache_write_5m"], row["uncached_input"])
    assert got == (10_604, 0, 896)

    untimed = replace(session, events=[replace(event, call_ms=None)])
    row = _call_row(replace(trace, sessions=[untimed]))
    assert row["ts_ms"] == event.ts
    got = (row["cache_read"], row["cache_write_5m"], row["uncached_input"])
    assert got == (0, 10_604, 896)


def test_an_untimed_call_goes_out_at_its_boundary_not_at_the_next_prompt(
    tmp_path: Path,
) -> None:
    """After a compaction the next prompt can come much later (here 30 minutes after the
    boundary): a call with no logged times goes out at the boundary's time (minute 5),
    when request 1's entry (alive to minute 9) is still read."""
    trace = _trace(tmp_path, logged=True)
    (session,) = trace.sessions
    (event,) = session.events
    late = session.requests.data["ts"].copy()
    late[2] += 30 * 60_000
    columns = {**session.requests.data, "ts": late, "ts_end": session.requests["ts_end"].copy()}
    columns["ts_end"][2] += 30 * 60_000
    untimed = replace(
        session,
        events=[replace(event, call_ms=None)],
        requests=request_columns(columns),
    )
    row = _call_row(replace(trace, sessions=[untimed]))
    assert row["ts_ms"] == event.ts == int(session.requests["ts_end"][1]) + 60_000
    assert (row["cache_read"], row["cache_write_5m"]) == (10_604, 0)


def test_claude_code_replays_the_recorded_compaction_call_when_it_went_out(
    tmp_path: Path,
) -> None:
    """The Claude Code policy replaying the recording's compactions
    (`autocompact.as_recorded_before`, as for a /compact) sends its own compaction call at
    the recording's call time, not at the next request's."""
    trace = _trace(tmp_path, logged=True, late=True)
    ((_, ms),) = trace.sessions[0].logged_calls().values()
    pipeline = policy.build("claude-code", {"autocompact.as_recorded_before": 3})
    frame = replay([("t", trace)], pipeline)
    calls = frame.filter(pl.col("kind") == "compaction")
    assert calls.select("request", "stage", "ts_ms").rows() == [(2, "as-recorded", ms[0])]


def test_a_logged_time_outside_its_requests_is_kept_between_them(tmp_path: Path) -> None:
    """A call timed before request 1's response ended, or after request 2 was sent (a
    clock that moved), goes out at the nearest time it can have: when that response
    ended, or at request 2's send."""
    trace = _trace(tmp_path, logged=True, late=True)
    (session,) = trace.sessions
    (event,) = session.events
    ts, ends = session.requests["ts"].tolist(), session.requests["ts_end"].tolist()
    for ms, sent in (((ts[0], ts[0]), ends[1]), ((ts[2] + 1, ts[2] + 9), ts[2])):
        moved = replace(session, events=[replace(event, call_ms=ms)])
        assert _call_row(replace(trace, sessions=[moved]))["ts_ms"] == sent
