"""The view's prefix hashes and token counts (simulator/view.py).

Prefix hashes are computed three ways (one item at a time, a few blocks inlined, a long run
through numpy); each test checks they agree, and that they behave as prefix identities: a
change at one position changes every later prefix hash and no earlier one.
"""

from __future__ import annotations

from itertools import accumulate
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator.view as view_module
from simulator.view import _VECTOR_MIN, View, prefix_hashes, term

ROOT = 0x5EED
HASHES = st.integers(0, 2**64 - 1)
TOKENS = st.integers(0, 5_000)


def one_by_one(items: list[tuple[int, int]], root: int = ROOT) -> View:
    view = View(root)
    for i, (h, t) in enumerate(items):
        view.append(i, h, t)
    return view


def at_once(items: list[tuple[int, int]], root: int = ROOT) -> View:
    view = View(root)
    view.extend_items(list(range(len(items))), [h for h, _ in items], [t for _, t in items])
    return view


def by_block(items: list[tuple[int, int]], root: int = ROOT) -> View:
    """Items as history blocks, appended in runs of 1 to 3 (a request's new blocks)."""
    view = View(root)
    hashes, tokens = [h for h, _ in items], [t for _, t in items]
    blocks = list(range(len(items)))
    start, size = 0, 1
    while start < len(blocks):
        view.extend_blocks(blocks[start : start + size], hashes, tokens)
        start, size = start + size, size % 3 + 1
    return view


def state(view: View) -> tuple[list[int], ...]:
    return view.ids, view.hashes, view.tokens, view.chains, view.cum


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(HASHES, TOKENS), max_size=3 * _VECTOR_MIN), HASHES)
def test_every_way_of_appending_gives_the_same_view(
    items: list[tuple[int, int]], root: int
) -> None:
    expected = one_by_one(items, root)
    assert state(at_once(items, root)) == state(expected)
    assert state(by_block(items, root)) == state(expected)
    whole = View(root)  # one long run of blocks: extend_blocks through numpy
    whole.extend_blocks(list(range(len(items))), [h for h, _ in items], [t for _, t in items])
    assert state(whole) == state(expected)
    assert expected.cum == list(accumulate(t for _, t in items))


@settings(max_examples=60, deadline=None)
@given(st.lists(HASHES, min_size=1, max_size=3 * _VECTOR_MIN), st.integers(0, 5_000), HASHES)
def test_numpy_and_python_prefix_hashes_agree(hashes: list[int], start: int, before: int) -> None:
    """Whatever the run's length, start position and the hash before it, the long-run path
    (numpy) and the short-run path (Python) give the sum of the terms modulo 2**64."""
    expected = list(accumulate((term(start + i, h) for i, h in enumerate(hashes)), initial=before))
    expected = [e % 2**64 for e in expected[1:]]
    assert prefix_hashes(before, start, hashes) == expected
    while len(hashes) < _VECTOR_MIN:
        hashes = hashes + hashes
    expected = list(accumulate((term(start + i, h) for i, h in enumerate(hashes)), initial=before))
    assert prefix_hashes(before, start, hashes) == [e % 2**64 for e in expected[1:]]


def test_a_change_changes_every_later_prefix_and_no_earlier_one() -> None:
    items = [(0x1000 + i, 10) for i in range(2 * _VECTOR_MIN)]
    base = at_once(items).chains
    for position in (0, 5, len(items) - 1):
        changed = list(items)
        changed[position] = (0xBEEF, 10)
        chains = at_once(changed).chains
        assert chains[:position] == base[:position]
        assert all(a != b for a, b in zip(chains[position:], base[position:], strict=True))


def test_order_matters_and_the_root_too() -> None:
    a, b = (0xA, 1), (0xB, 1)
    assert one_by_one([a, b]).chains[-1] != one_by_one([b, a]).chains[-1]
    assert one_by_one([a, a]).chains[-1] != one_by_one([a]).chains[-1]
    assert one_by_one([a], root=1).chains != one_by_one([a], root=2).chains


@pytest.mark.parametrize("step", [1, 0x9E3779B97F4A7C15, 2**32])
def test_evenly_spaced_item_hashes_give_distinct_prefixes(step: int) -> None:
    """Item hashes with a pattern (consecutive, or multiples of the golden ratio as
    tests write them) must not line up with the positions: every prefix distinct, also
    from the same items one position later."""
    items = [((i + 1) * step % 2**64, 1) for i in range(100)]
    chains = at_once(items).chains
    shifted = at_once([(0xF00D, 1), *items]).chains[1:]
    assert len(set(chains) | set(shifted)) == 2 * len(items)


def test_replace_and_remove_recompute_the_rest() -> None:
    items = [(0x1000 + i, i) for i in range(3 * _VECTOR_MIN)]
    view = at_once(items)
    view.replace(4, 4, 0xBEEF, 99)
    items[4] = (0xBEEF, 99)
    assert state(view) == state(one_by_one(items))
    view.remove([1, 30, 31])
    kept = [(i, it) for i, it in enumerate(items) if i not in (1, 30, 31)]
    expected = one_by_one([it for _, it in kept])
    expected.ids = [i for i, _ in kept]
    assert state(view) == state(expected)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(TOKENS, min_size=1, max_size=60),
    st.lists(st.integers(0, 59), max_size=10),
)
def test_edit_out_many_is_edit_out_one_by_one(tokens: list[int], picks: list[int]) -> None:
    positions = [p for p in picks if p < len(tokens)]
    items = [(0x1000 + i, t) for i, t in enumerate(tokens)]
    batch, single = at_once(items), at_once(items)
    chains = list(batch.chains)
    batch.edit_out_many(positions)
    for p in positions:
        single.edit_out(p)
    assert state(batch) == state(single)
    assert batch.chains == chains  # deleted by reference: the prefix hashes stay
    assert batch.cum == list(accumulate(batch.tokens))
    assert all(batch.tokens[p] == 0 for p in positions)


def _reference(view: View) -> View:
    """The same items appended one at a time (no plan, no numpy): what `view` must hold."""
    other = View(view.root)
    for block, h, t in zip(view.ids, view.hashes, view.tokens, strict=True):
        other.append(block, h, t)
    return other


#: What a policy does to its view between requests: append the next blocks, append blocks
#: out of order (the first one the next block or not), delete one by reference, drop
#: items from the end, rewrite one item.
OPS = st.lists(
    st.tuples(
        st.sampled_from(["next", "next", "next", "skip", "gap", "edit", "truncate", "replace"]),
        st.integers(1, 5),
    ),
    min_size=40,
    max_size=120,
)


@settings(max_examples=30, deadline=None)
@given(ops=OPS, history=st.lists(st.tuples(HASHES, TOKENS), min_size=400, max_size=400))
def test_planned_appends_equal_appends_one_at_a_time(
    ops: list[tuple[str, int]], history: list[tuple[int, int]]
) -> None:
    """`extend_blocks` computes runs of consecutive blocks ahead (`_Plan`; here 2 to 16
    blocks a plan, so that a few hundred use many up): after any mix of appends,
    deletions by reference, truncations and rewrites (each of which a plan must notice),
    the view holds the prefix hashes and counts of appending its items one at a time."""
    hashes, tokens = [h for h, _ in history], [t for _, t in history]
    view = View(ROOT)
    next_block = 0
    with (
        mock.patch.object(view_module, "_PLAN_MIN", 2),
        mock.patch.object(view_module, "_PLAN_MAX", 16),
    ):
        for op, size in ops:
            if op == "next" and next_block + size <= len(hashes):
                view.extend_blocks(list(range(next_block, next_block + size)), hashes, tokens)
                next_block += size
            elif op == "skip" and next_block + 2 * size <= len(hashes):
                blocks = list(range(next_block + 2 * size - 1, next_block - 1, -2))
                view.extend_blocks(blocks, hashes, tokens)
                next_block += 2 * size
            elif op == "gap" and next_block + size + 1 < len(hashes):
                view.extend_blocks([next_block, next_block + size + 1], hashes, tokens)
                next_block += size + 2
            elif op == "edit" and len(view):
                view.edit_out((size * 7919) % len(view))
            elif op == "truncate" and len(view) > size:
                view.truncate(len(view) - size)
            elif op == "replace" and len(view) > size:
                view.replace(len(view) - size, view.ids[-size], 0xBEEF + size, size)
            assert state(view) == state(_reference(view))
            assert view.cum == list(accumulate(view.tokens))


def test_a_long_run_of_requests_is_planned_and_exact() -> None:
    """Thousands of requests appending the next 1 to 3 blocks (the common case), with
    the default plan sizes: every prefix hash as computed one at a time, and most calls
    served by a plan (its numpy pass covers the blocks ahead)."""
    items = [((i * 0x9E3779B97F4A7C15 + 7) % 2**64, i % 97) for i in range(6000)]
    planned = by_block(items)
    assert state(planned) == state(one_by_one(items))
    assert planned._plan is not None and len(planned._plan.ids) >= 1024


def test_the_last_changed_index() -> None:
    """`changed` only falls: appends leave it, and each rewrite lowers it to the first
    position it touched; every item below it is what it was when it was set."""
    items = [(0x1000 + i, 1 + i % 5) for i in range(3 * _VECTOR_MIN)]
    view = at_once(items)
    assert view.changed == 0  # never looked at
    view.changed = len(view)
    view.extend_items([900], [0xABC], [4])
    view.extend_blocks([3, 4], [h for h, _ in items], [t for _, t in items])
    assert view.changed == len(items)
    view.edit_out_many([40, 50])
    assert view.changed == 40
    view.changed = len(view)
    view.edit_out(50)  # already deleted: nothing changes
    assert view.changed == len(view)
    view.replace(30, 30, 0xBEEF, 3)
    assert view.changed == 30
    view.changed = len(view)
    view.remove([12, 60])
    assert view.changed == 12
    view.changed = len(view)
    view.truncate(len(view))  # keeps every item
    assert view.changed == len(view)
    view.truncate(5)
    assert view.changed == 5
    assert View(1).copy().changed == 0 and view.copy().changed == 0


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(HASHES, TOKENS), min_size=1, max_size=3 * _VECTOR_MIN),
    st.data(),
)
def test_a_rewrite_in_place_is_truncating_and_appending_again(
    items: list[tuple[int, int]], data: st.DataObject
) -> None:
    """`View.rewrite_at` over the items from `start` (the same items at the same
    positions, some sent otherwise) gives the view truncating at `start` and appending
    them again gives, and keeps what an observer saw as that does (`changed`, `seen`)."""
    start = data.draw(st.integers(0, len(items) - 1), label="start")
    new = list(items)
    for p in data.draw(st.lists(st.integers(start, len(items) - 1), max_size=4), label="at"):
        new[p] = (data.draw(HASHES, label="hash"), data.draw(TOKENS, label="tokens"))
    seen_at = data.draw(st.integers(0, len(items)), label="observer's last look")
    fast, slow = at_once(items), at_once(items)
    fast.changed = slow.changed = seen_at
    fast.rewrite_at(
        list(range(start, len(items))), [h for h, _ in new[start:]], [t for _, t in new[start:]]
    )
    slow.truncate(start)
    slow.extend_items(list(range(start, len(items))), [h for h, _ in new[start:]],
                      [t for _, t in new[start:]])  # fmt: skip
    assert state(fast) == state(slow) == state(at_once(new))
    # The observer's mark falls to the first item that changed (truncating marks every
    # item from `start`, changed or not), and what it saw there is kept.
    first = next((p for p in range(start, len(items)) if new[p] != items[p]), None)
    if first is not None and first < seen_at:
        assert fast.changed == first and fast.seen is not None
        assert fast.ids[:first] + fast.seen.ids == list(range(seen_at))
        assert fast.seen.hashes == [h for h, _ in items[first:seen_at]]
        assert fast.seen.tokens == [t for _, t in items[first:seen_at]]
    else:
        assert fast.changed == seen_at and fast.seen is None


def test_a_rewrite_needs_one_hash_and_count_per_position() -> None:
    view = at_once([(1, 1), (2, 2)])
    with pytest.raises(ValueError, match="one hash and one token count per position"):
        view.rewrite_at([0, 1], [1], [1])
    with pytest.raises(ValueError, match="one hash and one token count per position"):
        view.rewrite_at([0], [1], [1, 2])
