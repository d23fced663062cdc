"""Trigger fidelity: the preset of each recording's Claude Code version, replayed on the
real traces, compacts where the recording compacted.

Two ways to replay, both checked exactly so that any change to the pipeline shows up here
and is looked at:

* free-running: the policy makes every auto-compaction itself (the user's recorded
  /compact commands are replayed as actions), so a later compaction inherits the error of
  the policy's earlier ones;
* one at a time: for each recorded auto-compaction the replay starts from the recorded
  state (earlier compactions replayed as recorded, `autocompact.as_recorded_before`), so
  each row tests the trigger and the post-compaction model on their own.

The acceptance bar (same request +/- 1, context after compaction within 15%) is what
`test_acceptance` counts: met one at a time (12 of 12 on the request or within one, 11 of
12 also within 15% after). The one miss, f67ab274's first compaction, restored 85.7k
tokens that nothing in the transcript accounts for (policies/calibration/README.md); the
2.1.226 rows are explained where they are listed. `test_where_the_acceptance_stands` pins
the counts.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from policies.claude_code.policy import preset_for
from simulator import policy
from simulator.model import CompactionEvent, Session, Trace
from simulator.replay import replay
from traces.load import load_all, units

Row = tuple[str, int, int | None, int, int | None]

#: (session, recorded request, simulated request or None, recorded context after, simulated
#: context after) per recorded auto-compaction, free-running. 390ab778 is the Opus 5 session
#: of ../shared/traces/claude-code/flutter-docker, read from aba9151e (2.1.226), which
#: resumed it from 390ab778's own file: requests 0-93 were sent by that other process
#: (2.1.224), which let the context reach 204,665 without compacting (above 200k: its window
#: was 1M); aba9151e compacted at once on resuming (preTokens 213,002), and the first request
#: it sent after the compaction is 94. The preset takes the window of the process that sent
#: each request (policies/claude_code/settings.py `standard_window_from`: 1M before 94, 200k
#: from it), so it compacts at 94 too; its context after (70,818) is 14.97% over the
#: recording's 61,596, just inside the bar: the newest API round it keeps verbatim holds a
#: 9.5k tool result, and it restores 15.3k of recently read files where the recording's
#: postTokens (17,692) is below those of the three later compactions (20,026-21,980).
#: Free-running, the rows after it inherit that: 11 and 9 requests early (136, 235), and the
#: last at 354 as recorded.
FREE_RUNNING = [
    ("390ab778", 94, 94, 61596, 70818),
    ("390ab778", 147, 136, 64513, 67395),
    ("390ab778", 244, 235, 67181, 55864),
    ("390ab778", 354, 354, 63889, 64955),
    ("ffc93f57", 163, 163, 62794, 62659),
    ("ffc93f57", 269, 269, 76113, 83220),
    ("0a725fb5", 158, 158, 30905, 32837),
    ("9034225e", 135, 135, 35866, 34400),
    ("da4409c0", 247, 246, 32147, 33215),
    ("da4409c0", 374, 374, 27927, 28358),
    ("f67ab274", 140, 140, 102368, 40742),
    ("f67ab274", 223, None, 43421, None),
]
#: The same, each compaction replayed from the recorded state. 390ab778: at 94 as above;
#: 147, 244 and 354 on the request. The unpadded estimate is the client's logged preTokens
#: to within 11 tokens at all three (167,008, 166,611 and 166,906 against 167,009, 166,612
#: and 166,907), but 244 and 354 fired below 167,000 and 146 and 353 (166,135 and 166,150)
#: did not: 2.1.2xx pads what the last usage does not hold by 4/3
#: (policies/claude_code/autocompact.py), which gives 167,090 and 167,123 at 244 and 354,
#: 166,365 and 166,173 at 146 and 353. Unpadded, 244 fired 2 late and 354 not at all.
#: ffc93f57 (2.1.29) on the request: its trigger adds the output_tokens it logged (1, a
#: streaming snapshot), not the 514 its response holds, which fired at 162.
ONE_AT_A_TIME = [
    ("390ab778", 94, 94, 61596, 70818),
    ("390ab778", 147, 147, 64513, 60142),
    ("390ab778", 244, 244, 67181, 58210),
    ("390ab778", 354, 354, 63889, 65068),
    ("ffc93f57", 163, 163, 62794, 62659),
    ("ffc93f57", 269, 269, 76113, 84580),
    ("0a725fb5", 158, 158, 30905, 32837),
    ("9034225e", 135, 135, 35866, 34400),
    ("da4409c0", 247, 247, 32147, 33215),
    ("da4409c0", 374, 374, 27927, 28316),
    ("f67ab274", 140, 140, 102368, 40742),
    ("f67ab274", 223, 222, 43421, 37860),
]
#: The source folder of each session with a recorded auto-compaction.
FOLDER = {
    "390ab778": "flutter-docker",
    "ffc93f57": "promptgrimoire",
    "0a725fb5": "vsla",
    "9034225e": "vsla",
    "da4409c0": "vsla",
    "f67ab274": "vsla",
}
#: The users' own /compact (logged by compact_boundary with trigger "manual", or, in
#: 1.0.53, by its command line) are replayed as actions, at their requests, in both ways.
MANUAL = [
    ("da81b1d5", 39),
    ("da81b1d5", 93),
    ("5e12a303", 199),
    ("5e12a303", 297),
    ("da4409c0", 128),
]


def _row(name: str, session: Session, event: CompactionEvent, frame: pl.DataFrame) -> Row:
    """The policy's compaction nearest the recorded one (within 20 requests) and the
    context of its first request after it."""
    own = frame.filter((pl.col("kind") == "compaction") & (pl.col("stage") != "as-recorded"))
    near = [k for k in own["request"].to_list() if abs(k - event.request) <= 20]
    sim = min(near, key=lambda k: abs(k - event.request)) if near else None
    after = None
    if sim is not None:
        row = frame.filter((pl.col("request") == sim) & (pl.col("kind") == "request"))
        after = int(row["context_tokens"][0])
    recorded = int(session.recorded_context()[event.request])
    return (session.id[:8], event.request, sim, recorded, after)


def trigger_tables(shared: Path) -> tuple[list[Row], list[Row], list[tuple[str, int]]]:
    """(free-running rows, one-at-a-time rows, manual compactions replayed)."""
    free: list[Row] = []
    single: list[Row] = []
    manual: list[tuple[str, int]] = []
    for item in load_all(units([shared / "claude-code"]), lenient=True):
        for session in item.trace.sessions:
            if not session.events:
                continue
            trace = Trace(item.trace.format, item.trace.source_digest, [session])
            preset = preset_for(session.client)
            frame = replay([(item.name, trace)], policy.build(preset))
            stages = frame.filter(pl.col("kind") == "compaction").select("request", "stage")
            manual += [(session.id[:8], k) for k, s in stages.rows() if s == "manual"]
            for event in session.events:
                if event.trigger == "manual":
                    continue
                free.append(_row(item.name, session, event, frame))
                params = {"autocompact.as_recorded_before": event.request}
                one = replay([(item.name, trace)], policy.build(preset, params))
                single.append(_row(item.name, session, event, one))
    return free, single, manual


@pytest.fixture(scope="module")
def tables(shared: Path) -> tuple[list[Row], list[Row], list[tuple[str, int]]]:
    return trigger_tables(shared)


def test_trigger_tables(tables: tuple[list[Row], list[Row], list[tuple[str, int]]]) -> None:
    free, single, manual = tables
    assert sorted(free) == sorted(FREE_RUNNING)
    assert sorted(single) == sorted(ONE_AT_A_TIME)
    assert manual == MANUAL


def _meets(rows: list[Row]) -> tuple[int, int, int]:
    same = [r for r in rows if r[2] is not None and abs(r[2] - r[1]) <= 1]
    close = [r for r in same if r[4] is not None and abs(r[4] - r[3]) <= 0.15 * r[3]]
    return len(rows), len(same), len(close)


def test_where_the_acceptance_stands(
    tables: tuple[list[Row], list[Row], list[tuple[str, int]]],
) -> None:
    """(rows, same request +/- 1, and context after within 15%) as they are now: the
    clients before 2.1.200 meet the bar (8, 8, 7 one at a time); the four 2.1.226 rows
    fire on the request and land within 15% after (see ONE_AT_A_TIME). Free-running,
    390ab778's later rows inherit its first compaction's 15% surplus (FREE_RUNNING).
    `test_acceptance` is the bar itself."""
    free, single, _ = tables
    assert _meets([r for r in single if r[0] == "390ab778"]) == (4, 4, 4)
    assert _meets(free) == (12, 9, 8)
    assert _meets(single) == (12, 12, 11)
    old = [r for r in single if r[0] != "390ab778"]
    assert _meets(old) == (8, 8, 7)
    # Per source folder. No rule behind these rows has a fitted parameter (the 2.1.2xx
    # padding is the client's 4/3), so leaving a folder out changes nothing; the padding
    # was read from flutter-docker, which is in-sample for it.
    per_folder = {
        folder: _meets([r for r in single if FOLDER[r[0]] == folder])
        for folder in sorted(set(FOLDER.values()))
    }
    assert per_folder == {
        "flutter-docker": (4, 4, 4),
        "promptgrimoire": (2, 2, 2),
        "vsla": (6, 6, 5),
    }


def test_acceptance(tables: tuple[list[Row], list[Row], list[tuple[str, int]]]) -> None:
    """Issue 13's bar: the version-matched preset compacts within one request of the
    recording on at least 90% of the recorded auto-compactions and lands the context after
    within 15% on at least 75%, each compaction replayed from the recorded state."""
    _, single, _ = tables
    rows, same, close = _meets(single)
    assert same >= 0.90 * rows
    assert close >= 0.75 * rows


def test_as_recorded_flags_no_overflow_on_a_request_the_provider_accepted(shared: Path) -> None:
    """Every recorded request of ../shared was accepted: none may be flagged (starcar's
    Opus 4.8 sessions reach 619k; entirecontext's Opus 4.6 one 223k, on the 1M window)."""
    items = list(load_all(units([shared / "claude-code"]), lenient=True))
    frame = replay([(i.name, i.trace) for i in items], policy.build("as-recorded"))
    requests = frame.filter(pl.col("kind") == "request")
    assert requests.height > 10_000
    assert requests["overflow"].sum() == 0
