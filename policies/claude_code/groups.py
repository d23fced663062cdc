"""The API-round groups of a conversation, kept between requests (issue 16).

`Conversation.groups` walks every item; snip asks for the groups at every request its
estimate is over the trigger, collapse and session memory at every commit, so on a long
session the walk was most of their time. `GroupIndex` gives the same start indexes from
a running list: extended over the items appended since it was last asked (the walk's
state, the group the last item belongs to, is kept), rebuilt when the conversation's
`epoch` says items left or moved, or repaired in place by the stage that just moved them
(snip's removed range, `removed`; collapse's range replaced by its summary, `replaced`).
tests/policies/claude_code/test_claude_code_stages.py checks it against the walk on
scripted sessions.
"""

from __future__ import annotations

from policies.conversation import SYNTHETIC_GROUP as _SYNTHETIC
from policies.conversation import Conversation


class GroupIndex:
    """`Conversation.groups()` of one conversation, updated incrementally."""

    def __init__(self) -> None:
        #: Bumped at every rebuild from scratch (not on appends or repairs): a pointer a
        #: stage keeps into the groups stays valid while it holds.
        self.generation = 0
        self._epoch = -1
        self._items: list[int] | None = None
        self._seen = 0
        self._starts: list[int] = []
        self._prev: object = None

    def removed(self, conv: Conversation, first: int, end: int, lo: int, hi: int) -> None:
        """Groups first..end-1, items lo..hi-1, just left as one range (snip): the index is
        repaired instead of rebuilt. The walk's state after a group is what its first item
        set (a response's origin, a user run, a synthetic item), so up to lo nothing
        changes; the item now at lo started a group before (old hi) and is no tool result,
        so it starts one now unless the group before lo is of its kind, and from there
        both walks are in the same state: the later starts only move down by hi - lo."""
        items = conv.items
        old = self._starts
        if (
            conv.epoch != self._epoch + 1
            or items is not self._items
            or len(items) != self._seen - (hi - lo)
            or old[first] != lo
            or (old[end] if end < len(old) else self._seen) != hi
        ):
            self._epoch = -1  # not the state it repairs: rebuilt when next asked
            return
        origin = conv.origin
        before: object = None
        if first > 0:
            key = items[old[first - 1]]
            before = _SYNTHETIC if key < 0 else (origin[key] if origin[key] >= 0 else "user")
        starts = old[:first]
        if lo < len(items):
            key = items[lo]
            kind: object = _SYNTHETIC if key < 0 else (origin[key] if origin[key] >= 0 else "user")
            if kind is _SYNTHETIC or before != kind:
                starts.append(lo)
            gone = hi - lo
            starts += [s - gone for s in old[end + 1 :]]
        else:
            self._prev = before
        self._starts = starts
        self._epoch = conv.epoch
        self._seen = len(items)

    def replaced(self, conv: Conversation, first: int, end: int, lo: int, hi: int) -> None:
        """Groups first..end-1, items lo..hi-1, just replaced by one synthetic item (a
        collapse summary): repaired in place. A synthetic item starts a group of its own;
        the item after it (old hi) started a group before and is no tool result that
        follows another item, so it starts one after a synthetic item too, and from there
        both walks are in the same state: the later starts move down by hi - lo - 1. Only
        the groups after the span are touched (the summaries before it stay as they are)."""
        items = conv.items
        starts = self._starts
        if (
            conv.epoch != self._epoch + 1
            or items is not self._items
            or hi <= lo
            or len(items) != self._seen - (hi - lo) + 1
            or starts[first] != lo
            or (starts[end] if end < len(starts) else self._seen) != hi
            or items[lo] >= 0
        ):
            self._epoch = -1  # not the state it repairs: rebuilt when next asked
            return
        if end >= len(starts):
            self._prev = _SYNTHETIC  # the summary is the last item: the walk's state
        gone = hi - lo - 1
        starts[first + 1 :] = [s - gone for s in starts[end:]]
        self._epoch = conv.epoch
        self._seen = len(items)

    def __call__(self, conv: Conversation) -> list[int]:
        """Start index of each group of `conv.items` (the caller must not change it)."""
        items = conv.items
        if conv.epoch != self._epoch or items is not self._items or len(items) < self._seen:
            self._epoch = conv.epoch
            self._items = items
            self.generation += 1
            self._seen = 0
            self._starts = []
            self._prev = None
        n = len(items)
        if self._seen < n:
            self._prev = conv.extend_groups(items, self._seen, self._prev, self._starts)
            self._seen = n
        return self._starts
