"""Stage 2, microcompact: old tool results replaced, cheaply.

Time-based (gated off by default): if at least 60 minutes passed since the last assistant
message (the cache has expired anyway), the content of all but the 5 most recent results
of Read, Bash, PowerShell, Grep, Glob, WebSearch, WebFetch, Edit and Write is replaced by
`[Old tool result content cleared]`.

Cached (internal): old results are deleted by reference through `cache_edits`, so the
cached prefix stays valid and the deleted tokens simply stop counting; when the number of
such results in the context reaches `trigger_count`, all but the `keep` most recent go.
"""

from __future__ import annotations

from typing import Any

from policies.conversation import CLEARED_TOKENS, Conversation
from simulator.view import chain

CLEARED_SALT = 0xC1EA


class Microcompact:
    def __init__(self, p: dict[str, Any]) -> None:
        self.time_based = bool(p["microcompact.time_based.enabled"])
        self.gap_ms = int(float(p["microcompact.time_based.gap_minutes"]) * 60_000)
        self.keep = int(p["microcompact.time_based.keep"])
        self.tools = set(p["microcompact.tools"])
        self.cached = bool(p["microcompact.cached.enabled"])
        self.trigger_count = int(p["microcompact.cached.trigger_count"])
        self.cached_keep = int(p["microcompact.cached.keep"])
        self.cleared: set[int] = set()
        self.runs = 0
        # Incremental index of the candidates: rebuilt when items leave (conv.epoch),
        # extended on appends, so a request costs O(new items).
        self._cands: list[int] = []
        self._epoch = -1
        self._seen = 0
        #: Per block: a result of a compactable tool (made at the first request).
        self._compactable: list[bool] | None = None

    def _candidates(self, conv: Conversation) -> list[int]:
        """Results of the compactable tools not yet cleared or deleted, oldest first."""
        if conv.epoch != self._epoch:
            self._epoch = conv.epoch
            self._seen = 0
            self._cands = []
        items = conv.items
        if self._seen < len(items):
            compactable = self._compactable
            if compactable is None:
                tools = self.tools
                compactable = self._compactable = [
                    r and t in tools for r, t in zip(conv.result, conv.block_tool, strict=True)
                ]
            cleared, edited = self.cleared, conv.edited
            self._cands += [
                k
                for k in items[self._seen :]
                if k >= 0 and compactable[k] and k not in cleared and k not in edited
            ]
            self._seen = len(items)
        return self._cands

    def run(self, conv: Conversation, now_ms: int, last_assistant_ms: int | None) -> int:
        """Clear or delete old results if due; returns the tokens freed."""
        freed = 0
        idle = last_assistant_ms is not None and now_ms - last_assistant_ms >= self.gap_ms
        if self.time_based and idle:
            cands = self._candidates(conv)
            old = cands[: len(cands) - self.keep] if len(cands) > self.keep else []
            for k in old:
                freed += conv.item(k)[1] - CLEARED_TOKENS
                conv.set_override(
                    k, chain(conv.hashes[k], CLEARED_SALT), CLEARED_TOKENS, edit="microcompact"
                )
                self.cleared.add(k)
            if old:
                del cands[: len(old)]
                self.runs += 1
        if self.cached:
            live = self._candidates(conv)
            if len(live) >= self.trigger_count:
                gone = live[: len(live) - self.cached_keep]
                for k in gone:
                    freed += conv.item(k)[1]
                    conv.edit_out(k, edit="microcompact")
                del live[: len(gone)]
                self.runs += 1
        return freed
