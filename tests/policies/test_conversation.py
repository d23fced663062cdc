"""The conversation's view is kept incrementally (policies/conversation.py); whatever the
stages do to it, after a sync it must be the view a rebuild from scratch gives: the prefix,
then every item as it is sent (rewritten, deleted by reference, or made by the policy).

Random sequences of the operations the stages use (appends, rewrites, deletions by
reference, items leaving, ranges replaced, direct edits of `items` that bump `epoch`,
unlogged prefix changes) are checked against that rebuild after every sync, and the
position index against a scan of `items`.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.conversation import Conversation
from simulator.policy import SessionContext
from simulator.prefix import Prefix, PrefixState
from simulator.replay import ReplayOptions, session_context
from simulator.view import NO_BLOCK, View, chain
from traces.synthetic import synthetic_trace

#: Requests at which the prefix segment from token 3,000 on changes (unlogged resets).
RESETS = {3: 3_000, 7: 3_000, 9: 3_000}


@cache
def context() -> SessionContext:
    session = synthetic_trace(120, 3).sessions[0]
    return session_context("synthetic", session, ReplayOptions())


def conversation() -> Conversation:
    """A conversation over the synthetic session, with a prefix of three segments whose
    middle one changes at the requests of RESETS."""
    ctx = context()
    conv = Conversation(ctx)
    conv.prefix = PrefixState(ctx.root, Prefix(1_000, 3_000, 9_000, (0, 1_000, 3_000), RESETS))
    conv.view, conv.warm, conv.marks = conv.prefix.start_view()
    conv.n_prefix = len(conv.view)
    return conv


def rebuilt(conv: Conversation) -> View:
    view = conv.prefix.start_view()[0]
    for key in conv.items:
        view.append(key if key >= 0 else NO_BLOCK, *conv.sent(key))
    return view


def state(view: View) -> tuple[list[int], ...]:
    return view.ids, view.hashes, view.tokens, view.chains, view.cum


OPS = [
    "append",
    "edit_out",
    "mask",
    "remove",
    "re-enter",
    "replace_range",
    "replace_all",
    "snip",
    "reset",
]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_incremental_view_is_the_rebuilt_view(data: st.DataObject) -> None:
    conv = conversation()
    n_blocks = len(conv.hashes)
    fresh = 0  # blocks below this have entered already
    for request in range(data.draw(st.integers(1, 25), label="steps")):
        op = data.draw(st.sampled_from(OPS), label="op")
        present = [k for k in conv.items if k >= 0]
        if op == "append" and fresh < n_blocks:
            n = data.draw(st.integers(1, 40), label="n")
            keys = list(range(fresh, min(fresh + n, n_blocks)))
            fresh = keys[-1] + 1
            if data.draw(st.booleans(), label="rewritten before entering"):
                conv.override[keys[0]] = (chain(conv.hashes[keys[0]], 0x50E5), 12)
            if data.draw(st.booleans(), label="with a synthetic item"):
                keys.append(conv.add_synthetic(500, "restored", request))
            conv.append(keys)
        elif op == "edit_out" and present:
            for key in data.draw(st.lists(st.sampled_from(present), max_size=8), label="keys"):
                conv.edit_out(key)
        elif op == "mask" and present:
            conv.mask(data.draw(st.sampled_from(present), label="key"), 7, 0xC1EA)
        elif op == "remove" and present:
            conv.remove_blocks(set(data.draw(st.lists(st.sampled_from(present)), label="keys")))
        elif op == "re-enter" and present:
            # A block leaves and comes back (the recording's own compaction, replayed).
            key = data.draw(st.sampled_from(present), label="key")
            conv.remove_blocks({key})
            if data.draw(st.booleans(), label="sync between"):
                conv.sync()
            conv.append([key])
        elif op == "replace_range" and conv.items:
            lo = data.draw(st.integers(0, len(conv.items) - 1), label="lo")
            hi = data.draw(st.integers(lo, len(conv.items)), label="hi")
            conv.replace_range(lo, hi, [conv.add_synthetic(300, "collapse", request)])
        elif op == "replace_all":
            conv.replace_all([conv.add_synthetic(3_000, "summary", request), *conv.items[-5:]])
        elif op == "snip" and len(conv.items) > 2:
            # What snip and collapse do: edit `items` directly, bump the epoch, touch.
            first = data.draw(st.integers(1, len(conv.items) - 1), label="first")
            drop = set(conv.items[first : first + data.draw(st.integers(1, 10), label="n")])
            conv.items = [k for k in conv.items if k not in drop]
            conv.epoch += 1
            conv.touch(first)
        elif op == "reset":
            conv.reset_prefix(data.draw(st.sampled_from(sorted(RESETS)), label="request"))
        if data.draw(st.booleans(), label="sync"):
            assert state(conv.sync()) == state(rebuilt(conv))
        for key in data.draw(st.lists(st.sampled_from(range(-3, n_blocks)), max_size=5)):
            expected = conv.items.index(key) if key in conv.items else None
            assert conv.index_of(key) == expected
            assert conv.find_recent(key) == expected
    assert state(conv.sync()) == state(rebuilt(conv))


def test_a_deletion_before_a_pending_change_still_counts() -> None:
    """An item deleted by reference before the first changed item is not re-appended by
    the sync: the deletion itself must reach the view."""
    conv = conversation()
    conv.append(list(range(40)))
    conv.mask(30, 7, 0xC1EA)  # pending change from item 30 on
    conv.edit_out(5)
    view = conv.sync()
    assert view.tokens[conv.n_prefix + 5] == 0
    assert state(view) == state(rebuilt(conv))


def test_set_override_of_an_absent_block_fails() -> None:
    conv = conversation()
    conv.append([0, 1])
    with pytest.raises(ValueError):
        conv.set_override(2, 0xBEEF, 3)


def test_a_deleted_block_that_comes_back_is_still_deleted() -> None:
    """Appended again after leaving (as a replayed recorded compaction does), a block
    deleted by reference is sent as the sync would send it: hash kept, not counted."""
    conv = conversation()
    conv.append(list(range(10)))
    conv.edit_out(3)
    conv.remove_blocks({3})
    conv.sync()
    conv.append([3])
    view = conv.sync()
    assert view.tokens[-1] == 0
    assert state(view) == state(rebuilt(conv))
