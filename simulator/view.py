"""The API view: what one simulated request sends, as a sequence of items.

An item is the system/tools prefix (one or more pseudo-items) or one block of the history,
possibly rewritten by a policy (a cleared tool result, a summary). Each item has a hash
(its content identity) and a token count. The view keeps, for every position, a hash of
the prefix up to it and the cumulative token count, so the prompt-cache model can ask "is
the prefix through item i cached?" in O(1), and an append-only request (the common case)
costs O(new items). A change in the middle truncates the view there and re-appends the
rest: a policy pays only for what it touches.

The prefix hash through position i is the view's root plus, for every item up to i, a
term mixing the item's hash with its position (`term`), modulo 2**64. Like a hash chain it
identifies the whole sequence, order included (the position is mixed into each term), but
each term depends on one item only, so the prefix hashes of a long run of items are a
cumulative sum that numpy computes at once. That matters when a change near the start (a
snipped range, a committed collapse, a rewritten prefix segment) re-appends the whole rest
of the view: with a chain, where each hash depends on the previous one, that was a Python
loop over every later item.

The view is a projection over the session's append-only history (block ids refer to it);
building it never mutates the history.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import accumulate, islice
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

FIVE_MINUTES = 5 * 60 * 1000
ONE_HOUR = 60 * 60 * 1000

# Two facts of the API that a policy places its markers by, so they live beside Breakpoint.

#: Anthropic accepts at most this many cache_control markers per request.
MAX_BREAKPOINTS = 4

#: How many items before a breakpoint the lookup checks for a live entry ("up to
#: approximately 20 blocks before your explicit breakpoint", Anthropic's prompt-caching
#: documentation): a request adding more items than this after its last read entry misses,
#: unless a marker of its own is nearer (policies/as_recorded.py: Claude Code marks the last
#: two messages).
ANTHROPIC_LOOKBACK = 20


class Breakpoint(NamedTuple):
    """A cache marker a request puts on an item: the prefix through it may be cached.

    A named tuple: a request makes a few, so they must be cheap to create."""

    position: int  # index of the last item the cached prefix includes
    ttl_ms: int = FIVE_MINUTES


_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_SEED = 0x243F6A8885A308D3
_U_MUL, _U_MIX1, _U_MIX2 = np.uint64(_MUL), np.uint64(_MIX1), np.uint64(_MIX2)
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)

#: From this many items on, prefix hashes are computed with numpy; below it, converting
#: to and from arrays costs more than the Python loop.
_VECTOR_MIN = 24

#: Item id of pseudo-items that are not history blocks (prefix segments, summaries).
NO_BLOCK = -1

#: Blocks a first plan of `View.extend_blocks` covers; each plan used to its end doubles
#: the next, up to `_PLAN_MAX` (a broken one starts again from `_PLAN_MIN`).
_PLAN_MIN = 64
_PLAN_MAX = 4096


class Seen(NamedTuple):
    """Items an observer saw that the view no longer holds as they were (`View.seen`)."""

    ids: list[int]
    hashes: list[int]
    tokens: list[int]


class _Plan(NamedTuple):
    """Prefix hashes and token counts computed ahead, with numpy, for history blocks
    first, first + 1, ... appended at positions start, start + 1, ... after a prefix
    hashing to `base` and counting `base_total` tokens (`View.extend_blocks`)."""

    hashes: list[int]  # the history lists the plan was computed from
    tokens: list[int]
    first: int
    start: int
    base: int
    base_total: int
    ids: list[int]  # first, first + 1, ...: what a call's blocks are compared with
    chains: list[int]
    cum: list[int]


def _totals_after(before: int, tokens: Iterable[int]) -> Iterator[int]:
    """Running token counts of items appended after a prefix of `before` tokens."""
    running = accumulate(tokens, initial=before)
    next(running)  # the `initial` value itself
    return running


def chain(previous: int, item_hash: int) -> int:
    """A hash of two (splitmix64-style mixing; not cryptographic: the item hashes are keyed
    content hashes already): how an identity is derived from others, e.g. a cleared tool
    result's from its block's, a summary's from the session's root, a prefix term's from
    the item's and its position's."""
    z = (previous ^ item_hash) * _MUL & _MASK
    z = (z ^ (z >> 30)) * _MIX1 & _MASK
    z = (z ^ (z >> 27)) * _MIX2 & _MASK
    return z ^ (z >> 31)


class _Salts:
    """The salt of each position, `chain(_SEED, position)`: pseudo-random, so that no
    pattern in the item hashes (consecutive or evenly spaced values) lines up with the
    positions. Computed once for every position up to the longest view met, as ints and
    as a uint64 array for the vectorised path. It grows by replacing both at once, never
    in place, so what a caller was handed never changes (threads sharing it included)."""

    def __init__(self) -> None:
        self.table: tuple[list[int], npt.NDArray[np.uint64]] = ([], np.zeros(0, np.uint64))

    def upto(self, n: int) -> tuple[list[int], npt.NDArray[np.uint64]]:
        """The salts of at least positions 0..n-1, as ints and as an array."""
        table = self.table
        ints = table[0]
        if n > len(ints):
            more = range(len(ints), max(n, 2 * len(ints), 1024))
            ints = ints + [chain(_SEED, position) for position in more]
            table = self.table = (ints, np.array(ints, dtype=np.uint64))
        return table


_SALTS = _Salts()


def term(position: int, item_hash: int) -> int:
    """What the item at `position` adds to the hash of every prefix holding it: `chain` of
    the position's salt and the item's hash."""
    return chain(_SALTS.upto(position + 1)[0][position], item_hash)


def prefix_hashes(previous: int, start: int, item_hashes: list[int]) -> list[int]:
    """Hashes of the prefixes through positions start, start + 1, ... of items with
    `item_hashes`, after a prefix through start - 1 hashing to `previous` (the root when
    start is 0)."""
    salts, salt_array = _SALTS.upto(start + len(item_hashes))
    if len(item_hashes) < _VECTOR_MIN:
        out: list[int] = []
        for position, h in enumerate(item_hashes, start):
            z = (h ^ salts[position]) * _MUL & _MASK  # term(), inlined: the per-request path
            z = (z ^ (z >> 30)) * _MIX1 & _MASK
            z = (z ^ (z >> 27)) * _MIX2 & _MASK
            previous = (previous + (z ^ (z >> 31))) & _MASK
            out.append(previous)
        return out
    # The same terms for every item at once; uint64 arithmetic wraps modulo 2**64, as the
    # masks above do.
    terms = np.array(item_hashes, dtype=np.uint64) ^ salt_array[start : start + len(item_hashes)]
    terms *= _U_MUL
    terms = (terms ^ (terms >> _U30)) * _U_MIX1
    terms = (terms ^ (terms >> _U27)) * _U_MIX2
    terms ^= terms >> _U31
    np.cumsum(terms, out=terms)
    terms += np.uint64(previous)
    hashes: list[int] = terms.tolist()
    return hashes


class View:
    """The items of one request, with prefix hashes and cumulative tokens per position.

    Position i (0-based) is the i-th item; `chains[i]` identifies the prefix through item
    i and `cum[i]` is its token count. `ids[i]` is the history block behind the item, or
    NO_BLOCK.

    `changed` is a running "last changed" index for one observer (the engine's loss
    proxies, simulator/loss.py): every position below it holds the item, prefix hash and
    token count it held when the observer last set it to the view's length. Appends leave
    it; every method that rewrites, removes or recounts items lowers it to the first
    position it touches. So an observer of a view that changes near its end (masking
    rewrites an old observation each request) compares only the items from there, not the
    whole view: on the 10,000-request synthetic session that comparison made the loss
    columns 6x the masking replay (issue 16). The lists are changed only through these
    methods (nothing else in the project assigns into them).

    `seen` keeps, for that observer, what it saw from `changed` on: the first change below
    `changed` moves the items from there to `changed` into it (ahead of what it holds), so
    the items the observer saw are always `ids[:changed] + seen.ids` (and so for hashes
    and tokens), and it needs no copy of its own: a copy of each call's new items cost
    it a third of its time (simulator/loss.py). Only a view the observer looked at (with
    `changed` above 0) keeps anything; the observer empties it when it looks again.
    """

    __slots__ = (
        "_plan",
        "_plan_size",
        "chains",
        "changed",
        "cum",
        "hashes",
        "ids",
        "root",
        "seen",
        "tokens",
    )

    def __init__(self, root: int) -> None:
        #: Identity of what precedes every item (the model: caches are per model).
        self.root = root
        self.ids: list[int] = []
        self.hashes: list[int] = []
        self.tokens: list[int] = []
        self.chains: list[int] = []
        self.cum: list[int] = []
        #: Positions below this are unchanged since the observer last looked (see above).
        self.changed = 0
        #: What the observer saw from `changed` on, where it changed since (see above).
        self.seen: Seen | None = None
        #: The appends computed ahead (`extend_blocks`), and how many blocks the next covers.
        self._plan: _Plan | None = None
        self._plan_size = _PLAN_MIN

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def total(self) -> int:
        """Tokens of the whole view (the request's input)."""
        return self.cum[-1] if self.cum else 0

    def append(self, block: int, item_hash: int, tokens: int) -> None:
        chains, cum = self.chains, self.cum
        if chains:
            previous = chains[-1]
            prev_cum = cum[-1]
        else:
            previous = self.root
            prev_cum = 0
        salts = _SALTS.table[0]
        if len(chains) >= len(salts):
            salts = _SALTS.upto(len(chains) + 1)[0]
        z = (item_hash ^ salts[len(chains)]) * _MUL & _MASK  # term(), inlined: a hot path
        z = (z ^ (z >> 30)) * _MIX1 & _MASK
        z = (z ^ (z >> 27)) * _MIX2 & _MASK
        self.ids.append(block)
        self.hashes.append(item_hash)
        self.tokens.append(tokens)
        chains.append((previous + (z ^ (z >> 31))) & _MASK)
        cum.append(prev_cum + tokens)

    def extend_blocks(self, blocks: list[int], hashes: list[int], tokens: list[int]) -> None:
        """Append history blocks (item hash and tokens looked up by block id in the
        history's lists, which never change): the per-request path of every policy, a few
        blocks at a time.

        Nearly every call appends the blocks that follow the previous call's, at the
        positions that follow (the shared Claude Code corpus, as-recorded and claude-code:
        97% of 12,700 calls; the 10,000-request synthetic session 98-99%): the view only
        grows with the history. From the second such call in a row, the prefix hashes and
        token counts of the next blocks are computed ahead with numpy (`_Plan`) and a call
        copies its slice, after checking that its blocks are the planned ones and that the
        view ends where the plan starts from (same prefix hash, so the same arithmetic:
        results are identical). Other calls hash in Python, `term` inlined."""
        n = len(blocks)
        if n >= _VECTOR_MIN:
            self.extend_items(blocks, [hashes[b] for b in blocks], [tokens[b] for b in blocks])
            return
        if not n:
            return
        chains, cum = self.chains, self.cum
        position = len(chains)
        previous = chains[-1] if chains else self.root
        total = cum[-1] if cum else 0
        b = blocks[0]
        plan = self._plan
        if plan is not None and plan.hashes is hashes and plan.tokens is tokens:
            i = position - plan.start
            # i past the planned chains: the view grew by other appends since (a synthetic
            # item), so the plan cannot vouch for the prefix: it is dropped below.
            if (
                b - plan.first == i >= 0
                and i <= len(plan.chains)
                and (plan.chains[i - 1] if i else plan.base) == previous
            ):
                if i + n > len(plan.ids):  # used up: the next plan is twice as long
                    self._plan_size = min(2 * self._plan_size, _PLAN_MAX)
                    plan = self._make_plan(b, position, previous, total, hashes, tokens)
                    i = 0
                if plan is not None and plan.ids[i : i + n] == blocks:
                    self.ids += blocks
                    self.hashes += hashes[b : b + n]
                    self.tokens += tokens[b : b + n]
                    chains += plan.chains[i : i + n]
                    if total == (plan.cum[i - 1] if i else plan.base_total):
                        cum += plan.cum[i : i + n]
                    else:  # an earlier item was deleted by reference: counts moved
                        cum += _totals_after(total, tokens[b : b + n])
                    return
            self._plan = None
            self._plan_size = _PLAN_MIN
        item_hashes, item_tokens = self.hashes, self.tokens
        salts = _SALTS.table[0]
        if position + n > len(salts):
            salts = _SALTS.upto(position + n)[0]
        self.ids += blocks
        for b in blocks:
            h = hashes[b]
            t = tokens[b]
            z = (h ^ salts[position]) * _MUL & _MASK
            z = (z ^ (z >> 30)) * _MIX1 & _MASK
            z = (z ^ (z >> 27)) * _MIX2 & _MASK
            previous = (previous + (z ^ (z >> 31))) & _MASK
            position += 1
            total += t
            item_hashes.append(h)
            item_tokens.append(t)
            chains.append(previous)
            cum.append(total)
        if self._plan is None and blocks[-1] - blocks[0] == n - 1:
            # Plan from the next call on if it appends the blocks that follow these.
            self._plan = _Plan(
                hashes, tokens, blocks[-1] + 1, position, previous, total, [], [], []
            )

    def _make_plan(
        self,
        first: int,
        start: int,
        base: int,
        base_total: int,
        hashes: list[int],
        tokens: list[int],
    ) -> _Plan | None:
        """The plan for blocks first, first + 1, ... from position `start` on, or None
        where the history has no blocks after `first`."""
        end = min(first + self._plan_size, len(hashes))
        if end <= first:
            self._plan = None
            return None
        plan = self._plan = _Plan(
            hashes,
            tokens,
            first,
            start,
            base,
            base_total,
            list(range(first, end)),
            prefix_hashes(base, start, hashes[first:end]),
            list(_totals_after(base_total, tokens[first:end])),
        )
        return plan

    def extend_items(self, ids: list[int], hashes: list[int], tokens: list[int]) -> None:
        """Append items given as parallel lists."""
        if len(ids) != len(hashes) or len(ids) != len(tokens):
            raise ValueError("ids, hashes and tokens must have one entry per item")
        if not ids:
            return
        chains, cum = self.chains, self.cum
        start = len(chains)
        chains += prefix_hashes(chains[-1] if chains else self.root, start, hashes)
        cum += _totals_after(cum[-1] if cum else 0, tokens)
        self.ids += ids
        self.hashes += hashes
        self.tokens += tokens

    def extend(self, items: Iterable[tuple[int, int, int]]) -> None:
        rows = list(items)
        self.extend_items([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def truncate(self, n: int) -> None:
        """Keep the first `n` items."""
        if n < len(self.ids):
            if n < self.changed:
                self._keep_seen(n)
            del self.ids[n:], self.hashes[n:], self.tokens[n:], self.chains[n:], self.cum[n:]

    def items(self, start: int = 0) -> list[tuple[int, int, int]]:
        return list(zip(self.ids[start:], self.hashes[start:], self.tokens[start:], strict=True))

    def rewrite_at(self, positions: list[int], hashes: list[int], tokens: list[int]) -> None:
        """The items at `positions` (ascending) sent as `hashes` and `tokens`, in place:
        equal to truncating at the first and appending the items from there again.

        A prefix hash is the running sum of its items' terms (`prefix_hashes`) and a
        running count the sum of their tokens, so a change at position j moves every later
        one by the same amount: one pass adds it, where truncating and appending again
        re-chained every later item (masking at every request: 30-40 of them each time,
        tests/bench/test_bench_policies.py). An observer's marks move as truncating would
        move them, from the first item that changed (`changed`, `seen`)."""
        if len(positions) != len(hashes) or len(hashes) != len(tokens):
            raise ValueError("one hash and one token count per position")
        old_hashes, old_tokens = self.hashes, self.tokens
        changed = [
            (p, h, t)
            for p, h, t in zip(positions, hashes, tokens, strict=True)
            if h != old_hashes[p] or t != old_tokens[p]
        ]
        if not changed:
            return
        if changed[0][0] < self.changed:
            self._keep_seen(changed[0][0])
        chains, cum, n = self.chains, self.cum, len(self.ids)
        shift = tokens_shift = 0
        for i, (p, h, t) in enumerate(changed):
            if h != old_hashes[p]:
                shift = (shift + term(p, h) - term(p, old_hashes[p])) & _MASK
                old_hashes[p] = h
            tokens_shift += t - old_tokens[p]
            old_tokens[p] = t
            end = changed[i + 1][0] if i + 1 < len(changed) else n
            if shift:
                chains[p:end] = [(c + shift) & _MASK for c in chains[p:end]]
            if tokens_shift:
                cum[p:end] = [c + tokens_shift for c in cum[p:end]]

    def replace(self, position: int, block: int, item_hash: int, tokens: int) -> None:
        """Rewrite one item; every later prefix hash is recomputed (its prefix changed)."""
        rest = self.items(position + 1)
        self.truncate(position)
        self.extend([(block, item_hash, tokens), *rest])

    def remove(self, positions: list[int]) -> None:
        """Drop items (ascending positions); the prefix after the first one changes."""
        if not positions:
            return
        first = positions[0]
        drop = set(positions)
        rest = [it for i, it in enumerate(self.items(first), start=first) if i not in drop]
        self.truncate(first)
        self.extend(rest)

    def copy(self) -> View:
        other = View(self.root)
        other.ids = self.ids.copy()
        other.hashes = self.hashes.copy()
        other.tokens = self.tokens.copy()
        other.chains = self.chains.copy()
        other.cum = self.cum.copy()
        return other

    def edit_out(self, position: int) -> None:
        """Delete an item by reference (Anthropic `cache_edits`): its tokens stop counting
        but the prefix hashes stay, so the cached prefix remains valid."""
        self.edit_out_many((position,))

    def edit_out_many(self, positions: Iterable[int]) -> None:
        """`edit_out` for several items at once: the running token counts after the first
        of them are recomputed in one pass, not once per item (a policy that deletes a
        batch of old results would otherwise pay O(view) for each)."""
        tokens = self.tokens
        counted = [p for p in positions if tokens[p]]
        if not counted:
            return
        first = min(counted)
        if first < self.changed:
            self._keep_seen(first)
        for p in counted:
            tokens[p] = 0
        before = self.cum[first - 1] if first else 0
        self.cum[first:] = _totals_after(before, islice(tokens, first, None))

    def _keep_seen(self, position: int) -> None:
        """A change at `position`, below `changed`: the items from there to `changed` go
        into `seen`, ahead of what it holds (see the class docstring)."""
        end = self.changed
        ids = self.ids[position:end]
        hashes = self.hashes[position:end]
        tokens = self.tokens[position:end]
        seen = self.seen
        if seen is not None:
            ids += seen.ids
            hashes += seen.hashes
            tokens += seen.tokens
        self.seen = Seen(ids, hashes, tokens)
        self.changed = position
