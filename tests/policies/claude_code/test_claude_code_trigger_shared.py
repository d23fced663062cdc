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
the counts. The users' own /compact are pinned with their context after (`MANUAL`), which
for 2.1.2xx is all the pipeline's model of what the client puts back.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest

from policies.claude_code.policy import preset_for
from simulator import policy
from simulator.model import CompactionEvent, Session, Trace
from simulator.replay import replay
from tests.support import Named

Row = tuple[str, int, int | None, int, int | None]
Manual = tuple[str, int, int, int]

#: (session, recorded request, simulated request or None, recorded context after, simulated
#: context after) per recorded auto-compaction, free-running. 390ab778 is the Opus 5 session
#: of ../shared/traces/claude-code/flutter-docker, read from aba9151e (2.1.226), which
#: resumed it from 390ab778's own file: requests 0-93 were sent by that other process
#: (2.1.224), which let the context reach 204,665 without compacting (above 200k: its window
#: was 1M); aba9151e compacted at once on resuming (preTokens 213,002), and the first request
#: it sent after the compaction is 94. The preset takes the window of the process that sent
#: each request (policies/claude_code/settings.py `standard_window_from`: 1M before 94, 200k
#: from it), so it compacts at 94 too; its context after (57,734) is 6.3% under the
#: recording's 61,596: the prefix without the skill listing the recording logged (3,983
#: cl100k tokens, 6.3k in Opus 5's), the summary, the newest API round (a 9.5k tool
#: result), two files named by a reference (over the 5,000 cap) and three whole
#: (policies/claude_code/autocompact.py). The later rows fall 8-13% short (ONE_AT_A_TIME),
#: mostly Opus 5's own summaries, which the fit's size does not hold, so free-running each
#: next compaction comes later: 6 and 15 requests (153, 259), and none within 20 requests
#: of 354 (the session ends at 355).
FREE_RUNNING = [
    ("390ab778", 94, 94, 61596, 57734),
    ("390ab778", 147, 153, 64513, 56413),
    ("390ab778", 244, 259, 67181, 59651),
    ("390ab778", 354, None, 63889, None),
    ("ffc93f57", 163, 163, 62794, 61636),
    ("ffc93f57", 269, 269, 76113, 83606),
    ("0a725fb5", 158, 158, 30905, 33273),
    ("9034225e", 135, 135, 35866, 34956),
    ("da4409c0", 247, 246, 32147, 33957),
    ("da4409c0", 374, 373, 27927, 28891),
    ("f67ab274", 140, 140, 102368, 40395),
    ("f67ab274", 223, None, 43421, None),
]
#: The same, each compaction replayed from the recorded state. 390ab778: at 94 as above;
#: 147, 244 and 354 on the request. The unpadded estimate is the client's logged preTokens
#: to within 11 tokens at all three (167,008, 166,611 and 166,906 against 167,009, 166,612
#: and 166,907), but 244 and 354 fired below 167,000 and 146 and 353 (166,135 and 166,150)
#: did not: 2.1.2xx pads what the last usage does not hold by 4/3
#: (policies/claude_code/autocompact.py), which gives 167,090 and 167,123 at 244 and 354,
#: 166,365 and 166,173 at 146 and 353. Unpadded, 244 fired 2 late and 354 not at all.
#: Their contexts after are 13.4%, 7.8% and 9.0% short: the recording's summaries (raw
#: 4,918-5,079 cl100k tokens, Opus 5) are twice the fit's, and the deferred-tools and MCP
#: announcements it sends again had grown by 2.6k cl100k since the session's start (the
#: growth came in attachments, which the compiled trace holds only as unlogged context);
#: the pipeline holds the skills the Skill tool loaded (1,406 and 2,839 cl100k tokens
#: before 147 and 244; the recording's 1,422 and 2,936), the files at the session's own
#: tokens per cl100k token (1.59), and a prefix without the recorded listing (3,983 cl100k
#: tokens, about 6.3k in the session's; with the preset's fixed 4,000 instead, the two
#: shortfalls above were partly offset: 9.7%, 4.4% and 5.4%).
#: ffc93f57 (2.1.29) on the request: its trigger adds the output_tokens it logged (1, a
#: streaming snapshot), not the 514 its response holds, which fired at 162.
ONE_AT_A_TIME = [
    ("390ab778", 94, 94, 61596, 57734),
    ("390ab778", 147, 147, 64513, 55894),
    ("390ab778", 244, 244, 67181, 61909),
    ("390ab778", 354, 354, 63889, 58131),
    ("ffc93f57", 163, 163, 62794, 61636),
    ("ffc93f57", 269, 269, 76113, 83557),
    ("0a725fb5", 158, 158, 30905, 33273),
    ("9034225e", 135, 135, 35866, 34956),
    ("da4409c0", 247, 247, 32147, 33957),
    ("da4409c0", 374, 374, 27927, 29058),
    ("f67ab274", 140, 140, 102368, 40395),
    ("f67ab274", 223, 222, 43421, 37513),
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
#: 1.0.53, by its command line) are replayed as actions, at their requests, in both ways:
#: (session, request, recorded context after, simulated context after). The 2.1.2xx ones
#: (with the recorded summary, the attachments modelled): entirecontext da81b1d5 (2.1.232,
#: Opus 4.6) +0.7% and +0.6% with the skill listing the recording logged leaving the prefix
#: (9,414 cl100k tokens, its 141 skills; about 12.3k in the session's tokens); +15.1% and
#: +13.6% with the preset's fixed 4,000, and +38.1% and +33.8% (80,740 and 86,798) before
#: the listing left the prefix and the files over the cap came back as references.
#: flutter-docker 5e12a303
#: (2.1.228 and 2.1.232, Opus 5) +5.5% and +5.4%: each /compact came right after the client
#: was restarted (a new version and a `SessionStart:resume` hook logged a few lines before
#: it: `Session.restarted_at` holds 199 and 297), and the new process holds none of the
#: skills the old one loaded (-2,420, the one skill loaded at request 86; the recording
#: attaches no `invoked_skills` after either) and sends the whole listing again with its
#: first prompt (what left at its first compaction: the recorded 4,099 cl100k tokens; the
#: recording's announcements are 4,464 and 4,494, about 7k of Opus 5's), so the listing's
#: size cancels here. It was +2.7% and +3.0% with the listing left out and the skill attached; what
#: is over now is the rest of the model (the prefix's first-message part, 5 files at
#: 9,023, the rest at 2,347), not the listing. da4409c0 (1.0.53) +2.1%.
MANUAL = [
    ("da81b1d5", 39, 58460, 58895),
    ("da81b1d5", 93, 64874, 65291),
    ("5e12a303", 199, 58061, 61231),
    ("5e12a303", 297, 65611, 69166),
    ("da4409c0", 128, 27368, 27943),
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


Tables = tuple[list[Row], list[Row], list[Manual]]


def trigger_tables(corpus: Named) -> Tables:
    """(free-running rows, one-at-a-time rows, manual compactions replayed) over the shared
    Claude Code traces."""
    free: list[Row] = []
    single: list[Row] = []
    manual: list[Manual] = []
    for stem, whole in corpus:
        # The name `ctxsim run` gives the trace (its compiled file's, without `.ctxt`): the
        # policies' seed follows it, so these rows are what a run of the session shows.
        name = stem
        for session in whole.sessions:
            if not session.events:
                continue
            trace = Trace(whole.format, whole.source_digest, [session])
            preset = preset_for(session.client)
            frame = replay([(name, trace)], policy.build(preset))
            stages = frame.filter(pl.col("kind") == "compaction").select("request", "stage")
            recorded = session.recorded_context()
            for k, stage in stages.rows():
                if stage == "manual":
                    row = frame.filter((pl.col("request") == k) & (pl.col("kind") == "request"))
                    after = int(row["context_tokens"][0])
                    manual.append((session.id[:8], k, int(recorded[k]), after))
            for event in session.events:
                if event.trigger == "manual":
                    continue
                free.append(_row(name, session, event, frame))
                params = {"autocompact.as_recorded_before": event.request}
                one = replay([(name, trace)], policy.build(preset, params))
                single.append(_row(name, session, event, one))
    return free, single, manual


@pytest.fixture(scope="module")
def tables(shared_corpus: Callable[[str], Named]) -> Tables:
    return trigger_tables(shared_corpus("claude-code"))


def test_trigger_tables(tables: Tables) -> None:
    free, single, manual = tables
    assert sorted(free) == sorted(FREE_RUNNING)
    assert sorted(single) == sorted(ONE_AT_A_TIME)
    assert manual == MANUAL


def _meets(rows: list[Row]) -> tuple[int, int, int]:
    same = [r for r in rows if r[2] is not None and abs(r[2] - r[1]) <= 1]
    close = [r for r in same if r[4] is not None and abs(r[4] - r[3]) <= 0.15 * r[3]]
    return len(rows), len(same), len(close)


def test_where_the_acceptance_stands(tables: Tables) -> None:
    """(rows, same request +/- 1, and context after within 15%) as they are now: the
    clients before 2.1.200 meet the bar (8, 8, 7 one at a time); the four 2.1.226 rows
    fire on the request and land within 15% after (see ONE_AT_A_TIME). Free-running,
    390ab778's rows after the first come later, each inheriting the shortfall before it
    (FREE_RUNNING). `test_acceptance` is the bar itself."""
    free, single, _ = tables
    assert _meets([r for r in single if r[0] == "390ab778"]) == (4, 4, 4)
    assert _meets(free) == (12, 8, 7)
    assert _meets(single) == (12, 12, 11)
    old = [r for r in single if r[0] != "390ab778"]
    assert _meets(old) == (8, 8, 7)
    # Per source folder. No rule behind these rows has a fitted parameter (the 2.1.2xx
    # padding is the client's 4/3, the listing the recording's own and the caps the
    # client's documented values),
    # so leaving a folder out changes nothing; the padding was read from flutter-docker,
    # which is in-sample for it.
    per_folder = {
        folder: _meets([r for r in single if FOLDER[r[0]] == folder])
        for folder in sorted(set(FOLDER.values()))
    }
    assert per_folder == {
        "flutter-docker": (4, 4, 4),
        "promptgrimoire": (2, 2, 2),
        "vsla": (6, 6, 5),
    }


def test_acceptance(tables: Tables) -> None:
    """Issue 13's bar: the version-matched preset compacts within one request of the
    recording on at least 90% of the recorded auto-compactions and lands the context after
    within 15% on at least 75%, each compaction replayed from the recorded state."""
    _, single, _ = tables
    rows, same, close = _meets(single)
    assert same >= 0.90 * rows
    assert close >= 0.75 * rows


def test_as_recorded_flags_no_overflow_on_a_request_the_provider_accepted(
    shared_corpus: Callable[[str], Named],
) -> None:
    """Every recorded request of ../shared was accepted: none may be flagged (starcar's
    Opus 4.8 sessions reach 619k; entirecontext's Opus 4.6 one 223k, on the 1M window)."""
    frame = replay(shared_corpus("claude-code"), policy.build("as-recorded"))
    requests = frame.filter(pl.col("kind") == "request")
    assert requests.height > 10_000
    assert requests["overflow"].sum() == 0
