"""Fidelity of two cache mechanisms of Claude Code recordings, on sessions built by hand.

* The client marks the last two messages of a request (policies/as_recorded.py), so a turn
  adding more blocks than the 20-block lookback still reads the previous request's entry
  through the marker on its assistant message, unless that message alone is too long.
* Thinking on and off are separate cache keys (simulator/prefix.py): a switch away falls
  back to the system part (a recorded reset), and a switch back that the recording shows
  reading the last prompt of its own mode reads it in the replay too.

Every session: Sonnet 4.5 (cache minimum 1,024 tokens), a 5,000-token prefix inferred from
the first request, nothing cached before it, requests one minute apart (5-minute TTL).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from simulator import policy as registry
from simulator.app.fidelity import compare
from simulator.model import Kind, Role, Trace
from simulator.replay import replay
from traces.builder import Hasher, RecordedUsage, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000


@dataclass(frozen=True)
class B:
    """One block: message index, kind, tokens; assistant blocks name their request."""

    msg: int
    kind: Kind
    tokens: int
    origin: int = -1

    @property
    def role(self) -> Role:
        return Role.ASSISTANT if self.origin >= 0 else Role.USER


def session(turns: list[tuple[list[B], tuple[int, int, int]]]) -> Trace:
    """A session whose request k adds turns[k]'s blocks and recorded (read, write 5m,
    uncached input)."""
    b = SessionBuilder(Hasher(b"keys"), id="s", kind="main", client="claude-code 2.1.29")
    for k, (blocks, (read, write, uncached)) in enumerate(turns):
        for i, blk in enumerate(blocks):
            b.add_block(
                msg=blk.msg,
                kind=blk.kind,
                role=blk.role,
                text=f"{blk.msg}-{i}-{blk.kind}",
                ts=T0 + k * MINUTE - 1,
                first_request=k,
                tokens=blk.tokens,
                origin=blk.origin,
            )
        usage = RecordedUsage(uncached, read, write, 0, 10)
        b.add_request(ts=T0 + k * MINUTE, model=SONNET, usage=usage)
    return Trace(format="claude-code", source_digest="ab" * 32, sessions=[b.finish()])


def simulated(trace: Trace) -> pl.DataFrame:
    named = [("keys", trace)]
    return compare(replay(named, registry.build("as-recorded")), named)


def tool_turn(uses: int, *, thinking: bool = True) -> list[B]:
    """Request 0's response (thinking, `uses` tool uses of 20 tokens) and the results of
    30 tokens, each result its own logged user message."""
    out = [B(1, Kind.THINKING, 50, origin=0)] if thinking else []
    out += [B(1, Kind.TOOL_USE, 20, origin=0) for _ in range(uses)]
    out += [B(2 + i, Kind.TOOL_RESULT, 30) for i in range(uses)]
    return out


def test_a_turn_of_21_blocks_reads_the_previous_prompt_through_the_assistant_marker() -> None:
    # Request 1 adds 21 blocks: its final marker's lookback (20 back) misses request 0's
    # entry at 6,000, the marker on the last tool use (10 results back) reaches it.
    added = 50 + 10 * 20 + 10 * 30
    trace = session([([B(0, Kind.TEXT, 1_000)], (0, 6_000, 0)), (tool_turn(10), (6_000, added, 0))])
    row = simulated(trace).row(1, named=True)
    assert (row["sim_cache_read"], row["sim_cache_write_5m"]) == (6_000, 550)
    assert row["matched"]


def test_an_assistant_message_longer_than_the_lookback_still_misses() -> None:
    # 22 tool uses: even the assistant marker is 22 blocks past request 0's entry; the read
    # falls back to the prefix's own marker, at 5,000.
    added = 22 * 20 + 22 * 30
    turns = [
        ([B(0, Kind.TEXT, 1_000)], (0, 6_000, 0)),
        (tool_turn(22, thinking=False), (5_000, 1_000 + added, 0)),
    ]
    row = simulated(session(turns)).row(1, named=True)
    assert (row["sim_cache_read"], row["sim_cache_write_5m"]) == (5_000, 1_000 + added)
    assert row["matched"]


def mode_session(return_read: int) -> Trace:
    """Request 0 thinks, 1 and 2 do not, 3 thinks again. The switch away at request 1
    falls back to 3,000 (inside the 5,000 prefix); `return_read` is request 3's read."""
    turns = [
        ([B(0, Kind.TEXT, 2_000)], (0, 7_000, 0)),
        (
            [
                B(1, Kind.THINKING, 100, origin=0),
                B(1, Kind.TEXT, 100, origin=0),
                B(2, Kind.TEXT, 800),
            ],
            (3_000, 5_000, 0),
        ),
        ([B(3, Kind.TEXT, 200, origin=1), B(4, Kind.TEXT, 300)], (8_000, 500, 0)),
        (
            [B(5, Kind.TEXT, 100, origin=2), B(6, Kind.TEXT, 400)],
            (return_read, 9_000 - return_read, 0),
        ),
        (
            [
                B(7, Kind.THINKING, 100, origin=3),
                B(7, Kind.TEXT, 100, origin=3),
                B(8, Kind.TEXT, 300),
            ],
            (9_000, 500, 0),
        ),
    ]
    return session(turns)


def test_switch_back_to_thinking_reads_the_last_prompt_of_its_mode() -> None:
    frame = simulated(mode_session(7_000))
    reads = frame["sim_cache_read"].to_list()
    # 1: the switch away reads the system part; 2: its own previous prompt; 3: the switch
    # back reads request 0's 7,000 (not request 2's 8,500) and writes 2,000.
    assert reads[:4] == [0, 3_000, 8_000, 7_000]
    assert frame["sim_cache_write_5m"].to_list()[3] == 2_000
    assert frame["matched"].all()


def test_switch_back_reading_the_current_prompt_is_no_return() -> None:
    # The recording reads request 2's whole prompt at the switch back (as 2.1.1xx+ do):
    # nothing is restored, the replay reads it too.
    frame = simulated(mode_session(8_500))
    assert frame["sim_cache_read"].to_list()[3] == 8_500
    assert frame["matched"].all()
