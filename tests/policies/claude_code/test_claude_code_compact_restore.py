"""What Claude Code 2.1.2xx puts back after a compaction, rule by rule, on hand-built sessions
(policies/claude_code/autocompact.py has the evidence of each rule).

Every expectation is a literal computed by hand. The sessions follow the conventions of
test_claude_code_stages.py (`Script`: no recorded usage, block tokens as written, 4
characters per token, one minute between requests, Sonnet 4.5 on a 200,000-token window).
Each test switches on the rule it checks and leaves the other 2.1.2xx rules off, so that
its numbers stay its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from policies.calibration.summary import TOKENIZER_RATIO
from policies.claude_code import autocompact
from policies.claude_code.autocompact import RATIO_MIN_RAW, tokenizer_ratio
from policies.claude_code.policy import BASE, preset_for
from simulator import policy
from simulator.model import CompactionEvent, Kind, Role, Trace
from simulator.prefix import Prefix, PrefixState
from tests.policies.claude_code.test_claude_code_stages import (
    AUTO,
    Script,
    _files_session,
    run,
)
from tests.support.scripted import compactions, contexts, row, usage
from tests.support.sessions import hand_session

LATEST = "claude-code@2.1.221"
#: 2.1.221 with every rule of this file off: what a test switches on is its own.
PLAIN: dict[str, Any] = {
    **AUTO,
    "autocompact.preserve_tail_groups": 0,
    "autocompact.restore_reference_tokens": None,
    "autocompact.skill_listing_tokens": None,
    "autocompact.invoked_skills": False,
    "autocompact.restore_session_tokens": False,
}


def _first_message(state: Any) -> None:
    """The prefix of 10,000 whose system prompt's marker ends at 6,000: the 4,000 after it
    are the first message's context (memory files, announcements, the skill listing)."""
    conv = state.conv
    layout = Prefix(shared=0, system=6_000, total=10_000, cuts=(0, 6_000))
    conv.prefix = PrefixState(conv.ctx.root, layout)
    conv.view, conv.warm, conv.marks = conv.prefix.start_view()
    conv.n_prefix = len(conv.view.ids)


# -- the skill listing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listing", "prefix_after"), [(None, 10_000), (3_000, 7_000), (9_000, 6_000)]
)
def test_the_skill_listing_is_not_sent_again(listing: int | None, prefix_after: int) -> None:
    """_files_session compacts at request 8 (171,800 > 167,000): summary 3,000 and the
    files a 2,000, b 5,000 (cut), c 4,000, d 5,000 (cut), e 1,000 = 17,000. The prefix
    keeps its 10,000, or loses the listing: 3,000 of it, or, for a listing larger than what
    follows the system prompt's marker, those 4,000 and no more."""
    params = {**PLAIN, "autocompact.skill_listing_tokens": listing}
    frame, state = run(_files_session(), params, LATEST, setup=_first_message)
    assert compactions(frame) == [(8, "autocompact")]
    assert contexts(frame)[8] == prefix_after + 3_000 + 17_000
    # Request 9 adds nothing: the prefix stays as it was after the compaction.
    assert state.conv.prefix.layout.total == prefix_after


@pytest.mark.parametrize(
    ("recorded", "logged", "ratio", "prefix_after"),
    [
        (True, 2_000, 1.0, 8_000),  # the recording's listing, at the session's 1.0
        (True, 2_000, None, 7_586),  # no measure of the session's tokens: the fit's 1.207
        (False, 2_000, 1.0, 7_000),  # the rule off: the preset's fixed size
        (True, -1, 1.0, 7_000),  # nothing logged: the preset's fixed size
    ],
)
def test_the_listing_that_leaves_is_the_one_the_recording_logged(
    monkeypatch: pytest.MonkeyPatch,
    recorded: bool,
    logged: int,
    ratio: float | None,
    prefix_after: int,
) -> None:
    """As above with a 3,000-token preset listing, where the session logged a listing of
    2,000 cl100k tokens (`Session.skill_listing`): 2,000 of the prefix leave at the
    compaction at 8, in the session's tokens (its blocks as written: 1.0 per cl100k
    token), or round(2,000 x 1.207) = 2,414 where it has no measure."""
    if ratio is None:
        monkeypatch.setattr(autocompact, "tokenizer_ratio", lambda session: None)
    params = {
        **PLAIN,
        "autocompact.skill_listing_tokens": 3_000,
        "autocompact.skill_listing_recorded": recorded,
    }

    def setup(state: Any) -> None:
        _first_message(state)
        state.conv.ctx.session.skill_listing = logged

    frame, state = run(_files_session(), params, LATEST, setup=setup)
    assert compactions(frame) == [(8, "autocompact")]
    assert contexts(frame)[8] == prefix_after + 3_000 + 17_000
    assert state.conv.prefix.layout.total == prefix_after


def test_after_the_listing_leaves_the_system_part_is_still_read_from_cache() -> None:
    """Request 8 is one minute after request 7, whose system marker (6,000) wrote the
    prefix's first segment: request 8 reads it, and writes the 3,000-token shorter rest of
    the prefix (1,000), the summary and the files (20,000): 21,000, 5-minute entries."""
    params = {**PLAIN, "autocompact.skill_listing_tokens": 3_000}
    frame, _ = run(_files_session(), params, LATEST, setup=_first_message)
    assert usage(row(frame, 8))[:4] == (27_000, 0, 6_000, 21_000)


def _two_manual() -> Script:
    """Request 0: 1,000 user; requests 1-5: one 2,000-token Bash round each (2,100); the
    user's /compact at requests 3 and 5 (recorded, no summary logged)."""
    s = Script()
    s.user(1_000)
    s.request()
    for _ in range(5):
        s.tool("Bash", 2_000)
        s.request()
    for k in (3, 5):
        s.b.add_event(CompactionEvent(k, "manual", -1, -1, 0))
    return s


def test_the_listing_leaves_once() -> None:
    """Both /compact replace the conversation with the 3,000-token summary; the listing
    (3,000) leaves the prefix at the first only: 7,000 + 3,000 at 3 and again at 5."""
    params = {**PLAIN, "autocompact.skill_listing_tokens": 3_000}
    frame, _ = run(_two_manual(), params, LATEST, setup=_first_message)
    assert compactions(frame) == [(3, "manual"), (5, "manual")]
    assert contexts(frame)[3] == 7_000 + 3_000
    assert contexts(frame)[4] == 7_000 + 3_000 + 2_100
    assert contexts(frame)[5] == 7_000 + 3_000


# -- a restarted client process ------------------------------------------------------------


class _Restarted(Script):
    """A Script whose session marks `restarted` as sent first by a new client process
    (`Session.restarted_at`, as the reader marks it)."""

    def __init__(self, restarted: list[int]) -> None:
        super().__init__()
        self.restarted = restarted

    def trace(self) -> Trace:
        trace = super().trace()
        trace.sessions[0].restarted_at = self.restarted
        return trace


def _restarted(script: Script, restarted: list[int]) -> _Restarted:
    """`script` with the restarts marked (its builder and counters taken over)."""
    out = _Restarted(restarted)
    out.__dict__.update({k: v for k, v in script.__dict__.items() if k != "restarted"})
    return out


@pytest.mark.parametrize(
    ("restarted", "after"),
    [
        # No restart: the second /compact is by the process that announced the listing.
        ([], [10_000, 12_100, 10_000]),
        # Restarted right before the second /compact: its first prompt, after the
        # command, announces the whole listing again (3,000).
        ([5], [10_000, 12_100, 13_000]),
        # Restarted at 4: the new process finds the listing gone and announces it with its
        # first prompt; its own /compact at 5 leaves it out again.
        ([4], [10_000, 15_100, 10_000]),
        # Restarted before any compaction: the context holds the listing, its names count
        # as sent, and the first /compact leaves it out as without a restart.
        ([2], [10_000, 12_100, 10_000]),
    ],
)
def test_a_restarted_process_announces_the_listing_once_more(
    restarted: list[int], after: list[int]
) -> None:
    """`_two_manual` with a 3,000-token listing: 7,000 prefix + 3,000 summary after each
    /compact (3 and 5), + 2,100 at 4; a restarted process's listing is 3,000 more."""
    params = {**PLAIN, "autocompact.skill_listing_tokens": 3_000}
    frame, _ = run(_restarted(_two_manual(), restarted), params, LATEST, setup=_first_message)
    assert compactions(frame) == [(3, "manual"), (5, "manual")]
    assert contexts(frame)[3:6] == after


def _skills_then_compact(restarted: list[int]) -> _Restarted:
    """`_skills(2_000, False)` (skills of 3,000 and 2,000 loaded at requests 1 and 2, the
    /compact at 2), then a 2,000-token Bash round and a second /compact at request 3."""
    s = _restarted(_skills(2_000, False), restarted)
    s.tool("Bash", 2_000)
    s.request()
    s.b.add_event(CompactionEvent(3, "manual", -1, -1, 0))
    return s


@pytest.mark.parametrize(
    ("restarted", "after"),
    [
        # One process: both skills come back after both (10,000 + 3,000 + 5,000).
        ([], [18_000, 18_000]),
        # Restarted before the second /compact: the new process holds no skill.
        ([3], [18_000, 13_000]),
        # Restarted at 2: skill-one (loaded at 1) was the old process's; skill-two, loaded
        # at 2, is the new one's: 10,000 + 3,000 + 2,000, and again at 3.
        ([2], [15_000, 15_000]),
    ],
)
def test_a_restarted_process_has_lost_the_invoked_skills(
    restarted: list[int], after: list[int]
) -> None:
    frame, _ = run(
        _skills_then_compact(restarted), {**PLAIN, "autocompact.invoked_skills": True}, LATEST
    )
    assert compactions(frame) == [(2, "manual"), (3, "manual")]
    assert contexts(frame)[2:] == after


def test_after_a_restart_the_listing_is_back_and_the_skills_gone() -> None:
    """Both rules of the preset together, the /compact at 3 right after a restart: the
    prefix 7,000 (the 3,000 listing left at the /compact at 2), the summary 3,000, no
    skill, the listing announced again 3,000: 13,000, where one process has 7,000 +
    3,000 + 5,000 = 15,000."""
    params = {
        **PLAIN,
        "autocompact.invoked_skills": True,
        "autocompact.skill_listing_tokens": 3_000,
    }
    for restarted, after in (([], 15_000), ([3], 13_000)):
        s = _skills_then_compact(restarted)
        frame, _ = run(s, params, LATEST, setup=_first_message)
        assert contexts(frame)[2:] == [15_000, after]


def test_before_2_1_200_a_restart_changes_nothing() -> None:
    """claude-code@2.1.88 (no listing rule, no invoked skills): the rows of a session with
    restarts marked are those of the same session without."""
    rows = []
    for restarted in ([], [3]):
        frame, _ = run(_skills_then_compact(restarted), {}, "claude-code@2.1.88")
        rows.append(frame.sort("request", "kind", "stage"))
    assert rows[0].equals(rows[1])


# -- files over the cap ---------------------------------------------------------------------


def test_a_file_over_the_cap_comes_back_as_a_reference() -> None:
    """The five files newest first: a 2,000, b 8,000 (over 5,000: a 60-token reference),
    c 4,000, d 6,000 (a reference), e 1,000: 2,000 + 60 + 4,000 + 60 + 1,000 = 7,120,
    where a cut leaves 17,000."""
    params = {**PLAIN, "autocompact.restore_reference_tokens": 60}
    frame, _ = run(_files_session(), params, LATEST)
    assert contexts(frame)[8] == 10_000 + 3_000 + 7_120


# -- invoked skills -------------------------------------------------------------------------


def _skills(second: int, again: bool) -> Script:
    """Request 0: 1,000 user. Request 1: a Skill round (100 + a 10-token result) and the
    skill's content after it, 3,000 tokens; request 2: another skill, `second` tokens;
    request 3 (`again`): the first skill loaded again, the same content. The user's
    /compact at the last request."""
    s = Script()
    s.user(1_000)
    s.request()
    contents = [("skill-one", 3_000), ("skill-two", second)]
    if again:
        contents.append(contents[0])
    for text, tokens in contents:
        s.tool("Skill", 10)
        s.msg += 1
        s.b.add_block(
            msg=s.msg,
            kind=Kind.TEXT,
            role=Role.USER,
            text=text.ljust(4 * tokens, "x"),
            ts=s.ts,
            first_request=s.k,
            tokens=tokens,
        )
        s.request()
    s.b.add_event(CompactionEvent(s.k - 1, "manual", -1, -1, 0))
    return s


@pytest.mark.parametrize(
    ("second", "again", "budget", "attached"),
    [
        # Both, whole: 3,000 + 2,000.
        (2_000, False, 25_000, 5_000),
        # The second is 7,000 by length/4, cut to its 5,000 share: 3,000 + 5,000.
        (7_000, False, 25_000, 8_000),
        # Loaded twice, the first counts once: 3,000 + 2,000.
        (2_000, True, 25_000, 5_000),
        # A 6,000 budget, newest first: the second's 5,000 fits, the first's 3,000 not.
        (7_000, False, 6_000, 5_000),
    ],
)
def test_invoked_skills_come_back_after_a_compaction(
    second: int, again: bool, budget: int, attached: int
) -> None:
    params = {
        **PLAIN,
        "autocompact.invoked_skills": True,
        "autocompact.skills_budget_tokens": budget,
    }
    s = _skills(second, again)
    last = s.k - 1
    frame, _ = run(s, params, LATEST)
    assert compactions(frame) == [(last, "manual")]
    assert contexts(frame)[last] == 10_000 + 3_000 + attached


def test_the_skills_stay_loaded_across_compactions() -> None:
    """After the /compact at request 2 (skills 3,000 + 2,000 attached) a Bash round and a
    second /compact at request 3: the skills' content blocks were compacted away, the
    client still holds both: 10,000 + 3,000 + 5,000 again."""
    s = _skills(2_000, False)
    s.tool("Bash", 2_000)
    s.request()
    s.b.add_event(CompactionEvent(3, "manual", -1, -1, 0))
    frame, _ = run(s, {**PLAIN, "autocompact.invoked_skills": True}, LATEST)
    assert compactions(frame) == [(2, "manual"), (3, "manual")]
    assert contexts(frame)[2:] == [18_000, 18_000]


# -- the session's own tokens -----------------------------------------------------------------


def _ratio_session(sizes: list[tuple[int, int, int]]) -> Any:
    """Blocks (kind, cl100k count, anchored tokens), all sent from request 0 on."""
    n = len(sizes)
    blocks = {
        "msg": list(range(n)),
        "kind": [k for k, _, _ in sizes],
        "role": [Role.USER] * n,
        "tool": [-1] * n,
        "link": [-1] * n,
        "tokens_raw": [r for _, r, _ in sizes],
        "tokens": [t for _, _, t in sizes],
        "chars": [4 * r for _, r, _ in sizes],
        "hash": np.arange(n, dtype=np.uint64),
        "ts": [0] * n,
        "first_request": [0] * n,
        "hidden_from": [2**31 - 1] * n,
        "compacted_at": [2**31 - 1] * n,
        "origin": [-1] * n,
        "flags": [0] * n,
        "path_hash": np.zeros(n, dtype=np.uint64),
        "file_tokens": [-1] * n,
    }
    requests = {k: [0] for k in ("ts", "ts_end", "model", "input", "cache_read")}
    requests |= {"has_usage": [False], "prefix": [-1]}
    requests |= {k: [0] for k in ("cache_write_5m", "cache_write_1h", "output")}
    requests["output_recorded"] = [0]
    return hand_session(blocks, requests, "claude-opus-5")


def test_the_sessions_tokenizer_ratio_is_the_median_over_its_big_tool_results() -> None:
    """Tool results of 1,000 and 2,000 cl100k tokens at 1,600 and 3,400 (1.6 and 1.7):
    1.65; a 999-token one at 2,000 and a 5,000-token text block at 9,000 are not samples."""
    assert RATIO_MIN_RAW == 1_000
    session = _ratio_session(
        [
            (Kind.TOOL_RESULT, 1_000, 1_600),
            (Kind.TOOL_RESULT, 2_000, 3_400),
            (Kind.TOOL_RESULT, 999, 2_000),
            (Kind.TEXT, 5_000, 9_000),
        ]
    )
    assert tokenizer_ratio(session) == pytest.approx(1.65)
    assert tokenizer_ratio(_ratio_session([(Kind.TEXT, 5_000, 9_000)])) is None


def test_calibrated_sizes_are_in_the_sessions_tokens() -> None:
    """A Script session counts 1.0 token per cl100k token (its tokens are the tokenizer's),
    so the files (calibrated in Claude tokens at 1.207 per cl100k) come back at 1/1.207 of
    their size: 2,000 -> 1,657, 5,000 -> 4,143 twice, 4,000 -> 3,314, 1,000 -> 829:
    14,086; the 5,000 caps are the client's own count, applied before. The summary fixed
    by a parameter (3,000) is not a calibrated size: it stays."""
    s = _files_session()
    assert tokenizer_ratio(s.trace().sessions[0]) == 1.0
    assert [round(t / TOKENIZER_RATIO) for t in (2_000, 5_000, 4_000, 1_000)] == [
        1_657,
        4_143,
        3_314,
        829,
    ]
    params = {**PLAIN, "autocompact.restore_session_tokens": True}
    frame, _ = run(s, params, LATEST)
    assert contexts(frame)[8] == 10_000 + 3_000 + 14_086


# -- the presets ----------------------------------------------------------------------------


def test_only_the_2_1_2xx_preset_has_these_rules() -> None:
    latest = policy.build(preset_for("claude-code 2.1.232")).params
    assert latest["autocompact.skill_listing_tokens"] == 4_000
    assert latest["autocompact.skill_listing_recorded"] is True
    assert latest["autocompact.restore_reference_tokens"] == 60
    assert latest["autocompact.invoked_skills"] is True
    assert latest["autocompact.restore_session_tokens"] is True
    assert (latest["autocompact.skill_cap_tokens"], latest["autocompact.skills_budget_tokens"]) == (
        5_000,
        25_000,
    )
    for client in ("claude-code 1.0.53", "claude-code 2.1.29", "claude-code 2.1.199"):
        params = policy.build(preset_for(client)).params
        assert params["autocompact.skill_listing_tokens"] is None
        assert params["autocompact.skill_listing_recorded"] is False
        assert params["autocompact.restore_reference_tokens"] is None
        assert params["autocompact.invoked_skills"] is False
        assert params["autocompact.restore_session_tokens"] is False
    assert BASE["autocompact.skill_listing_tokens"] is None
