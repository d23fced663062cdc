"""The conversation a Claude Code policy keeps: its messages, as the API view they become.

Items are history blocks (ids >= 0), possibly rewritten (a persisted preview, a cleared
tool result: `override`), deleted by reference (`edited`: cache_edits), or items the
policy made itself (ids < 0: a summary, restored files). The history is never touched;
this is the policy's projection of it. Changes in the middle mark the view dirty from
that item; `sync` re-chains once, from the first change, before the request is sent.
Deletions by reference change no hash: they are collected and applied to the view's token
counts in one pass at `sync`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model import Flag, Kind
from simulator.policy import Edit, SessionContext
from simulator.prefix import PrefixState, infer
from simulator.view import NO_BLOCK, View, chain

#: Tokens of the marker a cleared tool result is replaced by ("[Old tool result content
#: cleared]" is 7 cl100k tokens).
CLEARED_TOKENS = 7
#: The group walk's state after a synthetic item: a group of its own (equal to no origin
#: and to no user run).
SYNTHETIC_GROUP = object()


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
        self.result: list[bool] = (b["kind"] == Kind.TOOL_RESULT).tolist()
        self.override: dict[int, tuple[int, int]] = {}
        self.edited: set[int] = set()
        self.synthetic: dict[int, Synthetic] = {}
        self._next_synthetic = -2
        self._dirty: int | None = None
        #: Keys sent otherwise in place since the last sync (`_changed_in_place`); None
        #: once anything moved items (`touch`).
        self._in_place: list[int] | None = []
        #: View positions deleted by reference since the last sync (see `edit_out`).
        self._edits: list[int] = []
        #: Where each key is in `items`, for items[:_indexed] (see `index_of`).
        self._index: dict[int, int] = {}
        self._indexed = 0
        self._index_epoch = 0
        #: Edits made since the last request was sent (sent with it, simulator/policy.py
        #: `Edit`), and how many items that request held: an edit below it breaks the prefix.
        self.pending_edits: list[Edit] = []
        self.sent_items = 0

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
        """(hash, tokens) as billed: an item deleted by cache_edits keeps its hash, counts 0.
        (`item`, inlined: the stages ask this for every item they size.)"""
        if key < 0:
            s = self.synthetic[key]
            return s.hash, s.tokens
        o = self.override.get(key)
        h, t = (self.hashes[key], self.tokens[key]) if o is None else o
        return (h, 0) if key in self.edited else (h, t)

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
            self._extend(keys)

    def _extend(self, keys: list[int]) -> None:
        """The items of `keys` appended to the view as they are sent."""
        if not keys:
            return
        plain = self.override.keys().isdisjoint(keys) and self.edited.isdisjoint(keys)
        if plain and min(keys) >= 0:
            self.view.extend_blocks(keys, self.hashes, self.tokens)
        else:
            sent = [self.sent(k) for k in keys]
            self.view.extend_items(
                [k if k >= 0 else NO_BLOCK for k in keys],
                [h for h, _ in sent],
                [t for _, t in sent],
            )

    def find_recent(self, key: int) -> int | None:
        """Where `key` is in `items` (None: not there), looked for from the end: for an item
        placed lately (the last request's final marker, the last turn's response), what
        the search costs is its distance from the end, however the items before it moved.
        `index_of` rebuilds its index after every such move, which a collapse commit at
        every request made quadratic (tests/bench/test_bench_policies.py)."""
        items = self.items
        for i in range(len(items) - 1, -1, -1):
            if items[i] == key:
                return i
        return None

    def index_of(self, key: int) -> int | None:
        """Where `key` is in `items` (None: not there), without scanning them: an index
        extended on appends and rebuilt when `epoch` says items left or moved (the stages
        edit `items` directly and bump `epoch`, as their own indexes rely on). A stale hit
        (items changed without a bump) is caught and the index rebuilt."""
        items = self.items
        if self._index_epoch != self.epoch:
            self._index_epoch = self.epoch
            self._index = {}
            self._indexed = 0
        if self._indexed < len(items):
            new = range(self._indexed, len(items))
            self._index.update(zip(items[self._indexed :], new, strict=True))
            self._indexed = len(items)
        i = self._index.get(key)
        if i is not None and (i >= len(items) or items[i] != key):
            self._index = {k: j for j, k in enumerate(items)}
            self._indexed = len(items)
            i = self._index.get(key)
        return i

    def _position(self, key: int) -> int:
        """Index of `key` in `items` (it must be there)."""
        i = self.index_of(key)
        if i is None:
            raise ValueError(f"{key} is not in the conversation")
        return i

    def touch(self, index: int) -> None:
        """Item `index` changed: the view is re-chained from there at the next sync."""
        self._dirty = index if self._dirty is None else min(self._dirty, index)
        self._in_place = None  # items may have moved: the sync rebuilds from there

    def _changed_in_place(self, key: int, index: int) -> None:
        """Item `index` (`key`) is sent otherwise where it is (masked, cleared): the sync
        rewrites it alone, unless something else moved items since the last sync."""
        self._dirty = index if self._dirty is None else min(self._dirty, index)
        if self._in_place is not None:
            self._in_place.append(key)

    def _record(self, stage: str | None, kind: str, removed: int, first: int | None) -> None:
        """Put an edit on the record when a stage names itself (compactions and the
        history's own rewinds pass none: they are not edits of the policy's view)."""
        if stage is not None:
            breaks = first is not None and first < self.sent_items
            self.pending_edits.append(Edit(stage, kind, max(0, removed), breaks))

    def set_override(
        self, block: int, item_hash: int, tokens: int, *, edit: str | None = None
    ) -> None:
        before = self.sent(block)[1] if edit is not None else 0
        self.override[block] = (item_hash, tokens)
        i = self._position(block)
        self._changed_in_place(block, i)
        if edit is not None:
            self._record(edit, "mask", before - self.sent(block)[1], i)

    def clear_override(self, block: int) -> None:
        """Send a block as it is again (an edit undone), where it is: as `set_override`,
        the sync rewrites it alone."""
        self.override.pop(block, None)
        i = self.index_of(block)
        if i is not None:
            self._changed_in_place(block, i)

    def persist_entering(
        self, block: int, item_hash: int, tokens: int, *, edit: str | None = None
    ) -> None:
        """A block about to enter is sent as something smaller (a persisted tool result's
        preview): set before it is appended, so nothing sent changes."""
        self.override[block] = (item_hash, tokens)
        self._record(edit, "persist", self.tokens[block] - tokens, None)

    def remove_blocks(self, blocks: set[int], *, edit: str | None = None) -> None:
        """Items leave (a rewound branch, or a stage dropping them): the view is re-chained
        from the first."""
        if not blocks:
            return
        first = next((i for i, k in enumerate(self.items) if k in blocks), None)
        if first is None:
            return
        removed = sum(self.sent(k)[1] for k in self.items if k in blocks) if edit else 0
        self.items = [k for k in self.items if k not in blocks]
        self.epoch += 1
        self.touch(first)
        self._record(edit, "remove", removed, first)

    def edit_out(self, block: int, *, edit: str | None = None) -> None:
        """cache_edits: the item stops counting but keeps its place in the cached prefix.
        Applied to the view at the next sync, with the other deletions of this request
        (one pass over the token counts for all of them); an item at or after a pending
        change is re-appended by the sync, which reads `edited` itself."""
        if block in self.edited:
            return
        removed = self.sent(block)[1] if edit is not None else 0
        self.edited.add(block)
        i = self._position(block)
        if self._dirty is None or i < self._dirty:
            self._edits.append(self.n_prefix + i)
        elif self._in_place is not None:
            self._in_place.append(block)  # at or after a pending change: rewritten there
        self._record(edit, "clear", removed, None)

    def replace_range(self, lo: int, hi: int, keys: list[int], *, edit: str | None = None) -> None:
        """Items lo..hi become `keys` (a summary of them, or nothing)."""
        removed = 0
        if edit is not None:
            removed = sum(self.sent(k)[1] for k in self.items[lo:hi])
            removed -= sum(self.sent(k)[1] for k in keys)
        self.items[lo:hi] = keys
        self.epoch += 1
        self.touch(lo)
        self._record(edit, "replace" if keys else "remove", removed, lo)

    def mask(self, block: int, tokens: int, salt: int, *, edit: str | None = None) -> None:
        """Show a block as a placeholder of `tokens` tokens (its content masked)."""
        self.set_override(block, chain(self.hashes[block], salt), tokens, edit=edit)

    def replace_all(self, keys: list[int]) -> None:
        """A compaction: the conversation becomes `keys` (after the prefix)."""
        self.items = list(keys)
        self.epoch += 1
        self.touch(0)

    def sync(self) -> View:
        """The view of the current items (re-chained from the first change, if any)."""
        self._apply_edits()
        if self._dirty is not None:
            i = self._dirty
            self._dirty = None
            in_place, self._in_place = self._in_place, []
            view, start = self.view, self.n_prefix + i
            held = len(view.ids) - start  # items of the tail the view holds already
            if in_place is not None and held > 0:
                # Only items sent otherwise where they are since the last sync (the view
                # holds the items before the appended ones, in place): each rewritten
                # alone, what the view lacks appended.
                n, end = self.n_prefix, i + held
                at = sorted({self._position(key) for key in in_place})
                sent = [self.sent(self.items[p]) for p in at if p < end]
                view.rewrite_at([n + p for p in at if p < end], [h for h, _ in sent],
                                [t for _, t in sent])  # fmt: skip
                self._extend(self.items[end:])
                return view
            keys = self.items[i:]
            override, edited = self.override, self.edited
            block_hashes, block_tokens = self.hashes, self.tokens
            # Plain blocks looked up directly; rewritten and synthetic ones through `sent`.
            hashes = [
                block_hashes[k] if k >= 0 and k not in override else self.sent(k)[0] for k in keys
            ]
            tokens = [
                (0 if k in edited else block_tokens[k])  # cache_edits: hash kept, not counted
                if k >= 0 and k not in override
                else self.sent(k)[1]
                for k in keys
            ]
            ids = [k if k >= 0 else NO_BLOCK for k in keys]
            view.truncate(start)
            view.extend_items(ids, hashes, tokens)
        return self.view

    def _apply_edits(self) -> None:
        if self._edits:
            self.view.edit_out_many(self._edits)
            self._edits = []

    def reset_prefix(self, k: int) -> None:
        """Apply an unlogged change of the client's context at request k, if any. Only a
        prefix segment changes: the items keep their hashes and sizes (read back from the
        view up to its first pending change), they are only re-chained after the new
        prefix."""
        if not self.prefix.reset(k):
            return
        self._apply_edits()
        old = self.view
        self.view, self.warm, self.marks = self.prefix.start_view()
        n = self.n_prefix
        end = len(old.ids) if self._dirty is None else n + self._dirty
        self.view.extend_items(old.ids[n:end], old.hashes[n:end], old.tokens[n:end])

    # -- facts for the stages -----------------------------------------------------------

    def total(self) -> int:
        return self.sync().total

    def is_tool_result(self, key: int) -> bool:
        return key >= 0 and self.result[key]

    def is_read_result(self, key: int) -> bool:
        return key >= 0 and bool(self.flags[key] & Flag.PATH_READ) and self.is_tool_result(key)

    def groups(self, items: list[int] | None = None) -> list[int]:
        """Start index of each API-round group of the items (or of `items`, a candidate
        list of them): an assistant response with the tool results that answer it, or a
        run of user content. Cutting only at these never separates a tool_use from its
        tool_result."""
        starts: list[int] = []
        self.extend_groups(self.items if items is None else items, 0, None, starts)
        return starts

    def extend_groups(
        self, items: list[int], start: int, prev: object, starts: list[int]
    ) -> object:
        """The walk of `groups` over items[start:], appending to `starts`, from the state
        `prev` the walk had before `start` (None at the beginning); returns its state after
        the last item, so a running index (policies/claude_code/groups.py) goes on from it."""
        origin, result = self.origin, self.result  # a pass over every item: locals
        for i in range(start, len(items)):
            key = items[i]
            if key < 0:
                starts.append(i)
                prev = SYNTHETIC_GROUP
                continue
            o = origin[key]
            if o >= 0:
                if prev != o:
                    starts.append(i)
                    prev = o
            elif result[key] and prev is not None:
                continue  # stays with the response it answers
            elif prev != "user":
                starts.append(i)
                prev = "user"
        return prev
