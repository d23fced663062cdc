"""The API view: what one simulated request sends, as a sequence of items.

An item is the system/tools prefix (one or more pseudo-items) or one block of the history,
possibly rewritten by a policy (a cleared tool result, a summary). Each item has a hash
(its content identity) and a token count. The view keeps, for every position, the hash
chain of the prefix up to it and the cumulative token count, so the prompt-cache model can
ask "is the prefix through item i cached?" in O(1), and an append-only request (the
common case) costs O(new items). A change in the middle truncates the view there and
re-appends the rest: a policy pays only for what it touches.

The view is a projection over the session's append-only history (block ids refer to it);
building it never mutates the history.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

FIVE_MINUTES = 5 * 60 * 1000
ONE_HOUR = 60 * 60 * 1000


class Breakpoint(NamedTuple):
    """A cache marker a request puts on an item: the prefix through it may be cached.

    A named tuple: a request makes a few, so they must be cheap to create."""

    position: int  # index of the last item the cached prefix includes
    ttl_ms: int = FIVE_MINUTES


_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15
_SEED = 0x243F6A8885A308D3

#: Item id of pseudo-items that are not history blocks (prefix segments, summaries).
NO_BLOCK = -1


def chain(previous: int, item_hash: int) -> int:
    """Hash of a prefix extended by one item (splitmix64-style mixing; not cryptographic:
    the item hashes are keyed content hashes already)."""
    z = (previous ^ item_hash) * _MUL & _MASK
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


class View:
    """The items of one request, with prefix hashes and cumulative tokens per position.

    Position i (0-based) is the i-th item; `chains[i]` identifies the prefix through item
    i and `cum[i]` is its token count. `ids[i]` is the history block behind the item, or
    NO_BLOCK.
    """

    __slots__ = ("chains", "cum", "hashes", "ids", "root", "tokens")

    def __init__(self, root: int) -> None:
        #: Identity of what precedes every item (the model: caches are per model).
        self.root = root
        self.ids: list[int] = []
        self.hashes: list[int] = []
        self.tokens: list[int] = []
        self.chains: list[int] = []
        self.cum: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def total(self) -> int:
        """Tokens of the whole view (the request's input)."""
        return self.cum[-1] if self.cum else 0

    def append(self, block: int, item_hash: int, tokens: int) -> None:
        chains, cum = self.chains, self.cum
        if chains:
            z = (chains[-1] ^ item_hash) * _MUL & _MASK  # chain(), inlined: the hot path
            prev_cum = cum[-1]
        else:
            z = (self.root ^ item_hash) * _MUL & _MASK
            prev_cum = 0
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
        self.ids.append(block)
        self.hashes.append(item_hash)
        self.tokens.append(tokens)
        chains.append(z ^ (z >> 31))
        cum.append(prev_cum + tokens)

    def extend_blocks(self, blocks: list[int], hashes: list[int], tokens: list[int]) -> None:
        """Append history blocks (item hash and tokens looked up by block id): the per-request
        hot path of every policy, so the chain step is inlined with locals bound once."""
        if not blocks:
            return
        ids, item_hashes, item_tokens, chains, cum = (
            self.ids,
            self.hashes,
            self.tokens,
            self.chains,
            self.cum,
        )
        z_prev = chains[-1] if chains else self.root
        total = cum[-1] if cum else 0
        for b in blocks:
            h = hashes[b]
            t = tokens[b]
            z = (z_prev ^ h) * _MUL & _MASK
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
            z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
            z_prev = z ^ (z >> 31)
            total += t
            ids.append(b)
            item_hashes.append(h)
            item_tokens.append(t)
            chains.append(z_prev)
            cum.append(total)

    def extend_items(self, ids: list[int], hashes: list[int], tokens: list[int]) -> None:
        """Append items given as parallel lists (a re-chain after a change in the middle)."""
        chains, cum = self.chains, self.cum
        z_prev = chains[-1] if chains else self.root
        total = cum[-1] if cum else 0
        for h, t in zip(hashes, tokens, strict=True):
            z = (z_prev ^ h) * _MUL & _MASK
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
            z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
            z_prev = z ^ (z >> 31)
            total += t
            chains.append(z_prev)
            cum.append(total)
        self.ids.extend(ids)
        self.hashes.extend(hashes)
        self.tokens.extend(tokens)

    def extend(self, items: Iterable[tuple[int, int, int]]) -> None:
        for block, item_hash, tokens in items:
            self.append(block, item_hash, tokens)

    def truncate(self, n: int) -> None:
        """Keep the first `n` items."""
        if n < len(self.ids):
            del self.ids[n:], self.hashes[n:], self.tokens[n:], self.chains[n:], self.cum[n:]

    def items(self, start: int = 0) -> list[tuple[int, int, int]]:
        return list(zip(self.ids[start:], self.hashes[start:], self.tokens[start:], strict=True))

    def replace(self, position: int, block: int, item_hash: int, tokens: int) -> None:
        """Rewrite one item; everything after it is re-chained (its prefix changed)."""
        rest = self.items(position + 1)
        self.truncate(position)
        self.append(block, item_hash, tokens)
        self.extend(rest)

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
        delta = self.tokens[position]
        if not delta:
            return
        self.tokens[position] = 0
        cum = self.cum
        for i in range(position, len(cum)):
            cum[i] -= delta
