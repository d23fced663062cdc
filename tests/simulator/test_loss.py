"""The loss observer's fast paths (simulator/loss.py `SessionLoss`) against a recount of
every view, and what it relies on in the view (simulator/view.py `View.seen`).

Views are driven directly, by random sequences of the edits policies make (appending runs
of history blocks, sent verbatim or rewritten, and items of their own; rewriting one item
in place as masking does; dropping items from the end or the middle; deleting by
reference; pricing a copy), so every path of the observer is taken: a run of appended
blocks (only its relevant blocks looked at), appended items one by one, one item
rewritten in place, items gone from the end, shifted or rewritten ranges, a compaction
counted afresh, another view object going on from the last one or not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import loss
from simulator.history import History
from simulator.loss import SessionLoss
from simulator.model import Flag, Session
from simulator.policy import Call
from simulator.view import NO_BLOCK, View
from tests.simulator.test_replay_properties import sessions
from tests.support.sessions import hand_session

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REQUEST = Call("request", "request", [], 0)

#: One edit of the view: (what, three numbers the edit reads as it needs).
EDITS = st.tuples(
    st.sampled_from(["run", "run", "run", "own", "rewrite", "truncate", "remove", "edit", "copy"]),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.booleans(),
)


def _recount(session: Session, view: View) -> tuple[int, int]:
    """(human_verbatim_tokens, summary_tokens) from the whole view (reports/METRICS.md)."""
    b = session.blocks
    flags = b["flags"].astype(np.int64)
    artifact = ((flags & int(Flag.ARTIFACT)) != 0).tolist()
    human = (((flags & int(Flag.HUMAN)) != 0) & ~np.array(artifact, bool)).tolist()
    hashes, tokens = b["hash"].astype(np.uint64).tolist(), b["tokens"].tolist()
    items = list(zip(view.ids, view.hashes, view.tokens, strict=True))
    verbatim = {i for i, h, t in items if i >= 0 and h == hashes[i] and t == tokens[i]}
    kept = sum(tokens[i] for i in verbatim if human[i])
    inserted = sum(t for i, _, t in items if i < 0) - session.prefix_tokens
    summary = sum(t for i, _, t in items if i >= 0 and artifact[i]) + max(0, inserted)
    return kept, summary


def _edit(view: View, edit: tuple[str, int, int, bool], history: History) -> View:
    """Apply one edit, keeping a block at most once in the view (as every policy does)."""
    what, a, c, flag = edit
    hashes, tokens = history.hashes, history.tokens
    n = len(view)
    held = set(view.ids)
    if what == "run":  # the next blocks not held yet, perhaps one of them rewritten
        start = a % (len(hashes) + 1)
        run = [b for b in range(start, min(start + 1 + c % 4, len(hashes))) if b not in held]
        if not run:
            return view
        if flag:
            view.extend_blocks(run, hashes, tokens)
        else:  # the last one sent changed (a cleared or truncated result)
            view.extend_blocks(run[:-1], hashes, tokens)
            view.append(run[-1], hashes[run[-1]] ^ 1, tokens[run[-1]])
    elif what == "own":  # a policy's own item (a summary, a prefix segment)
        view.append(NO_BLOCK, 7_000_000 + a, c % 3_000)
    elif n and what == "rewrite":  # masking: one item in place, same block, new content
        p = a % n
        block = view.ids[p]
        if flag and block >= 0:
            view.replace(p, block, hashes[block], tokens[block])  # back to verbatim
        else:
            view.replace(p, block, view.hashes[p] ^ (1 + c), c % 500)
    elif n and what == "truncate":
        view.truncate(a % n)
    elif n and what == "remove":
        first = a % n
        view.remove(sorted({first, (first + c) % n}))
    elif n and what == "edit":
        view.edit_out_many([a % n, c % n])
    elif what == "copy":  # another view object: a re-fetch round, a re-chained prefix
        view = view.copy()
        if flag and n:
            view.truncate(a % n)
    return view


@SETTINGS
@given(
    session=sessions("s", removal=True),
    edits=st.lists(st.lists(EDITS, max_size=4), min_size=1, max_size=12),
)
def test_facts_equal_a_recount_after_any_edits(session: Session, edits: list[list[Any]]) -> None:
    history = History(session)
    tracker = SessionLoss(session, history.hashes, history.tokens)
    view = View(1)
    for k, batch in enumerate(edits):
        for edit in batch:
            view = _edit(view, edit, history)
        facts = tracker.facts(min(k, session.n_requests - 1), view, REQUEST)
        assert facts[1:3] == _recount(session, view)
    assert not any(loss._NO_ARTIFACTS.items), "the shared list of no artifacts changed"


@SETTINGS
@given(
    items=st.lists(st.tuples(st.integers(-1, 50), st.integers(0, 9)), min_size=1, max_size=20),
    edits=st.lists(EDITS, max_size=10),
)
def test_the_view_keeps_what_its_observer_saw(
    items: list[tuple[int, int]], edits: list[Any]
) -> None:
    """Whatever edits follow a look, `ids[:changed] + seen.ids` (and so for hashes and
    tokens) are the items the observer saw; a view never looked at keeps nothing."""
    view = View(1)
    for block, t in items:
        view.append(block, 1000 + block, t)
    history = History.__new__(History)
    history.hashes = [1000 + b for b in range(60)]
    history.tokens = [b % 10 for b in range(60)]
    untouched = view.copy()
    view.changed = len(view)  # the observer looks
    saw = (list(view.ids), list(view.hashes), list(view.tokens))
    for edit in edits:
        if edit[0] != "copy":
            _edit(view, edit, history)
            _edit(untouched, edit, history)
        seen = view.seen
        c = view.changed
        rest: Any = seen if seen is not None else ([], [], [])
        assert (view.ids[:c] + rest[0], view.hashes[:c] + rest[1], view.tokens[:c] + rest[2]) == (
            saw[0][: c + len(rest[0])],
            saw[1][: c + len(rest[0])],
            saw[2][: c + len(rest[0])],
        )
        assert c + len(rest[0]) == len(saw[0])
    assert untouched.seen is None and untouched.changed == 0


def _six_blocks(human: list[int]) -> tuple[History, Session, SessionLoss]:
    """Six blocks of 100-600 tokens (hashes 11-16), the `human` ones the human's, and a
    tracker of them."""
    history = History.__new__(History)
    history.hashes = [11, 12, 13, 14, 15, 16]
    history.tokens = [100, 200, 300, 400, 500, 600]
    session = _hand_session(history.tokens, human=human)
    return history, session, SessionLoss(session, history.hashes, history.tokens)


def _spy_rewrites(tracker: SessionLoss, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The positions the tracker rewrites one at a time from now on ("one@p")."""
    calls: list[str] = []
    real = tracker._rewrite_one

    def spy(v: View, p: int) -> None:
        calls.append(f"one@{p}")
        real(v, p)

    monkeypatch.setattr(tracker, "_rewrite_one", spy)
    return calls


def test_a_masked_item_is_one_rewrite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Masking's edit (one old result rewritten in place, the rest the same, then new
    items) takes the one-item path: hand-computed totals."""
    history, _, tracker = _six_blocks(human=[0, 3])
    view = View(1)
    view.extend_blocks([0, 1, 2, 3], history.hashes, history.tokens)
    assert tracker.facts(0, view, REQUEST)[1] == 100 + 400
    view.replace(3, 3, 99, 5)  # the human block at 3 masked: no longer verbatim
    view.extend_blocks([4], history.hashes, history.tokens)
    calls = _spy_rewrites(tracker, monkeypatch)
    assert tracker.facts(1, view, REQUEST)[1] == 100
    assert calls == ["one@3"]
    view.replace(3, 3, 14, 400)  # back as it was
    assert tracker.facts(1, view, REQUEST)[1] == 100 + 400
    assert calls == ["one@3", "one@3"]


def test_items_rewritten_in_place_are_one_rewrite_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Masking's request that masks two old observations (the same blocks at the same
    positions, two of them rewritten, then new items) takes one rewrite per changed item,
    not the search; an item of the policy's own that changes size moves the summary."""
    history, session, tracker = _six_blocks(human=[1, 3])
    view = View(1)
    view.append(NO_BLOCK, 77, session.prefix_tokens + 50)  # 50 tokens beyond the prefix
    view.extend_blocks([0, 1, 2, 3], history.hashes, history.tokens)
    assert tracker.facts(0, view, REQUEST)[1:3] == (200 + 400, 50)
    calls = _spy_rewrites(tracker, monkeypatch)
    view.truncate(0)  # re-chained from the start, as a policy's sync does
    view.append(NO_BLOCK, 77, session.prefix_tokens + 80)
    view.extend_items([0, 1, 2, 3], [11, 99, 13, 98], [100, 5, 300, 5])
    view.extend_blocks([4], history.hashes, history.tokens)
    assert tracker.facts(1, view, REQUEST)[1:3] == (0, 80)
    assert calls == ["one@2", "one@4"]


def test_a_run_looks_at_its_relevant_blocks_only() -> None:
    """A run of appended blocks without a human block, an artifact or a read result adds
    nothing and is not looked at; one with a human block sent rewritten adds nothing."""
    history = History.__new__(History)
    history.hashes = [21, 22, 23, 24]
    history.tokens = [10, 20, 30, 40]
    session = _hand_session(history.tokens, human=[2])
    tracker = SessionLoss(session, history.hashes, history.tokens)
    assert tracker.relevant == [2, loss._PAST]
    view = View(1)
    view.extend_blocks([0, 1], history.hashes, history.tokens)
    assert tracker.facts(0, view, REQUEST)[1] == 0
    view.append(2, 999, 30)  # the human block, its content changed
    view.extend_blocks([3], history.hashes, history.tokens)
    assert tracker.facts(1, view, REQUEST)[1] == 0
    view.replace(2, 2, 23, 30)
    assert tracker.facts(1, view, REQUEST)[1] == 30


def _hand_session(tokens: list[int], human: list[int]) -> Session:
    """A session of one request per block, the blocks `human` written by the human."""
    from simulator.model import NEVER, Kind, Role

    m = len(tokens)
    flags = np.zeros(m, np.uint8)
    flags[human] = int(Flag.HUMAN)
    blocks = {
        "msg": np.arange(m),
        "kind": np.full(m, int(Kind.TEXT)),
        "role": np.full(m, int(Role.USER)),
        "tool": np.full(m, -1),
        "link": np.full(m, -1),
        "tokens_raw": np.array(tokens),
        "tokens": np.array(tokens),
        "chars": np.array(tokens) * 4,
        "hash": np.arange(m, dtype=np.uint64),
        "ts": np.zeros(m),
        "first_request": np.zeros(m),
        "hidden_from": np.full(m, NEVER),
        "compacted_at": np.full(m, NEVER),
        "origin": np.full(m, -1),
        "flags": flags,
        "path_hash": np.zeros(m),
    }
    requests = {
        "ts": np.zeros(2),
        "ts_end": np.zeros(2),
        "model": np.zeros(2),
        "has_usage": np.ones(2, bool),
        "input": np.zeros(2),
        "cache_read": np.zeros(2),
        "cache_write_5m": np.zeros(2),
        "cache_write_1h": np.zeros(2),
        "output": np.zeros(2),
        "output_recorded": np.zeros(2),
    }
    return hand_session(blocks, requests, "claude-sonnet-4-5-20250929")


def test_a_session_keeps_its_block_facts_for_its_next_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The set-up runs once per session: a second replay (another policy, a sweep's next
    cell) takes what the first derived and gives the same columns; a session given other
    blocks derives them again."""
    from dataclasses import replace as with_fields

    from simulator import policy
    from simulator.model import Trace
    from simulator.replay import replay
    from traces.synthetic import synthetic_session

    derived: list[int] = []
    real = SessionLoss._facts_of_blocks

    def counted(self: SessionLoss, session: Session, m: int) -> None:
        derived.append(m)
        real(self, session, m)

    monkeypatch.setattr(SessionLoss, "_facts_of_blocks", counted)
    session = synthetic_session(300, seed=5)
    traces = [("s", Trace("claude-code", "s", [session]))]
    columns = list(loss.LOSS_SCHEMA)
    first = replay(traces, policy.build("as-recorded"), loss=True).select(columns)
    again = replay(traces, policy.build("masking"), loss=True)
    assert len(derived) == 1
    assert replay(traces, policy.build("as-recorded"), loss=True).select(columns).equals(first)
    fresh = [("s", Trace("claude-code", "s", [synthetic_session(300, seed=5)]))]
    assert again.equals(replay(fresh, policy.build("masking"), loss=True))
    assert len(derived) == 2  # the fresh session's own
    session.blocks = with_fields(session.blocks, data=dict(session.blocks.data))
    assert replay(traces, policy.build("as-recorded"), loss=True).select(columns).equals(first)
    assert len(derived) == 3
