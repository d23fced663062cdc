"""The conversation a Claude Code policy keeps: its messages, as the API view they become.

Items are history blocks (ids >= 0), possibly rewritten (a persisted preview, a cleared
tool result: `override`), deleted by reference (`edited`: cache_edits), or items the
policy made itself (ids < 0: a summary, restored files). The history is never touched;
this is the policy's projection of it. Changes in the middle mark the view dirty from
that item; `sync` re-chains once, from the first change, before the request is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model import Flag, Kind
from simulator.policy import SessionContext
from simulator.prefix import PrefixState, infer
from simulator.view import View, chain

#: Tokens of the marker a cleared tool result is replaced by ("[Old tool result content
#: cleared]" is 7 cl100k tokens).
CLEARED_TOKENS = 7


@dataclass
class Synthetic:
    """An item the policy made: its identity, size and role in the loss metrics."""

    hash: int
    tokens: int
    kind: str  # "summary", "restored", "skills", "collapse"


class Conversation:
    def __init__(self, ctx: SessionContext, *, prefix_resets: bool = True) -> None:
        s = ctx.session
        b = s.blocks
        self.ctx = ctx
        self.hashes = ctx.history.hashes
        self.tokens = ctx.history.tokens
        self.kinds: list[int] = b["kind"].tolist()
        self.chars: list[int] = b["chars"].tolist()
        self.tool_ids: list[int] = b["tool"].tolist()
        self.tools = s.tools
        self.flags: list[int] = b["flags"].tolist()
        self.path_hash: list[int] = b["path_hash"].tolist()
        self.file_tokens: list[int] = b["file_tokens"].tolist()
        self.origin: list[int] = b["origin"].tolist()
        self.msg: list[int] = b["msg"].tolist()
        self.link: list[int] = b["link"].tolist()
        self.prefix = PrefixState(ctx.root, infer(s, resets=prefix_resets))
        self.view, self.warm, self.marks = self.prefix.start_view()
        self.n_prefix = len(self.view.ids)
        self.items: list[int] = []
        #: Bumped whenever items leave or are reordered (not on appends or rewrites), so
        #: stages can keep incremental indexes over `items`.
        self.epoch = 0
        names = s.tools
        self.block_tool: list[str | None] = [names[t] if t >= 0 else None for t in self.tool_ids]
        self.result: list[bool] = [k == Kind.TOOL_RESULT for k in self.kinds]
        self.override: dict[int, tuple[int, int]] = {}
        self.edited: set[int] = set()
        self.synthetic: dict[int, Synthetic] = {}
        self._next_synthetic = -2
        self._dirty: int | None = None

    # -- items ----------------------------------------------------------------------

    def tool(self, block: int) -> str | None:
        return self.block_tool[block] if block >= 0 else None

    def item(self, key: int) -> tuple[int, int]:
        """(hash, tokens) of an item as it is sent."""
        if key < 0:
            s = self.synthetic[key]
            return s.hash, s.tokens
        o = self.override.get(key)
        if o is not None:
            return o
        return self.hashes[key], self.tokens[key]

    def sent(self, key: int) -> tuple[int, int]:
        """(hash, tokens) as billed: an item deleted by cache_edits keeps its hash, counts 0."""
        h, t = self.item(key)
        return (h, 0) if key >= 0 and key in self.edited else (h, t)

    def estimate_chars(self, key: int) -> int:
        """Characters as Claude Code's length/4 estimate sees them (images count 2,000
        tokens, i.e. 8,000 characters)."""
        if key < 0:
            return self.synthetic[key].tokens * 4
        if self.kinds[key] == Kind.IMAGE:
            return 8_000
        o = self.override.get(key)
        if o is not None:
            return o[1] * 4
        return self.chars[key]

    def add_synthetic(self, tokens: int, kind: str, salt: int) -> int:
        key = self._next_synthetic
        self._next_synthetic -= 1
        self.synthetic[key] = Synthetic(chain(self.ctx.root, (salt << 8) ^ -key), tokens, kind)
        return key

    def append(self, keys: list[int]) -> None:
        """New items at the end (the common case: O(new items))."""
        if not keys:
            return
        self.items.extend(keys)
        if self._dirty is None:
            if all(k >= 0 and k not in self.override for k in keys):
                self.view.extend_blocks(keys, self.hashes, self.tokens)
            else:
                self.view.extend((k if k >= 0 else -1, *self.item(k)) for k in keys)

    def touch(self, index: int) -> None:
        """Item `index` changed: the view is re-chained from there at the next sync."""
        self._dirty = index if self._dirty is None else min(self._dirty, index)

    def set_override(self, block: int, item_hash: int, tokens: int) -> None:
        self.override[block] = (item_hash, tokens)
        self.touch(self.items.index(block))

    def remove_blocks(self, blocks: set[int]) -> None:
        """Items leave (a rewound branch): the view is re-chained from the first."""
        if not blocks:
            return
        first = next((i for i, k in enumerate(self.items) if k in blocks), None)
        if first is None:
            return
        self.items = [k for k in self.items if k not in blocks]
        self.epoch += 1
        self.touch(first)

    def edit_out(self, block: int) -> None:
        """cache_edits: the item stops counting but keeps its place in the cached prefix."""
        if block in self.edited:
            return
        self.edited.add(block)
        if self._dirty is None:
            self.view.edit_out(self.n_prefix + self.items.index(block))

    def replace_range(self, lo: int, hi: int, keys: list[int]) -> None:
        """Items lo..hi become `keys` (a summary of them, or nothing)."""
        self.items[lo:hi] = keys
        self.epoch += 1
        self.touch(lo)

    def mask(self, block: int, tokens: int, salt: int) -> None:
        """Show a block as a placeholder of `tokens` tokens (its content masked)."""
        self.set_override(block, chain(self.hashes[block], salt), tokens)

    def replace_all(self, keys: list[int]) -> None:
        """A compaction: the conversation becomes `keys` (after the prefix)."""
        self.items = list(keys)
        self.epoch += 1
        self.touch(0)

    def sync(self) -> View:
        """The view of the current items (re-chained from the first change, if any)."""
        if self._dirty is not None:
            i = self._dirty
            self._dirty = None
            self.view.truncate(self.n_prefix + i)
            keys = self.items[i:]
            ids: list[int] = []
            hashes: list[int] = []
            tokens: list[int] = []
            override, edited, synthetic = self.override, self.edited, self.synthetic
            block_hashes, block_tokens = self.hashes, self.tokens
            for key in keys:
                if key < 0:
                    syn = synthetic[key]
                    ids.append(-1)
                    hashes.append(syn.hash)
                    tokens.append(syn.tokens)
                    continue
                o = override.get(key)
                h, t = o if o is not None else (block_hashes[key], block_tokens[key])
                ids.append(key)
                hashes.append(h)
                tokens.append(0 if key in edited else t)  # cache_edits: hash kept, not counted
            self.view.extend_items(ids, hashes, tokens)
        return self.view

    def reset_prefix(self, k: int) -> None:
        """Apply an unlogged change of the client's context at request k, if any."""
        if self.prefix.reset(k):
            self.view, self.warm, self.marks = self.prefix.start_view()
            self._dirty = 0

    # -- facts for the stages -----------------------------------------------------------

    def total(self) -> int:
        return self.sync().total

    def is_tool_result(self, key: int) -> bool:
        return key >= 0 and self.result[key]

    def is_read_result(self, key: int) -> bool:
        return key >= 0 and bool(self.flags[key] & Flag.PATH_READ) and self.is_tool_result(key)

    def groups(self) -> list[int]:
        """Start index of each API-round group: an assistant response with the tool
        results that answer it, or a run of user content. Cutting only at these never
        separates a tool_use from its tool_result."""
        starts: list[int] = []
        prev: object = None
        for i, key in enumerate(self.items):
            if key < 0:
                starts.append(i)
                prev = ("synthetic", i)
                continue
            o = self.origin[key]
            if o >= 0:
                if prev != o:
                    starts.append(i)
                    prev = o
            elif self.is_tool_result(key) and prev is not None:
                continue  # stays with the response it answers
            elif prev != "user":
                starts.append(i)
                prev = "user"
        return starts
