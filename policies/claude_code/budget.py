"""Stage 0, the tool-result budget (Claude Code 2.1.88).

Per tool result: above min(the tool's maximum, 50,000 characters) (Bash 30,000, Grep
20,000, Read never) the result is saved to disk and the model sees a preview of about
2,000 characters in a `<persisted-output>` wrapper. Per message (gated off by default): if
the fresh tool results of one user message exceed 200,000 characters, the largest fresh
ones are replaced first until the message is under. Decisions are taken when a result
first enters and never revisited: results already sent are frozen, to keep the cache.
"""

from __future__ import annotations

from typing import Any

from policies.conversation import Conversation
from simulator.view import chain

#: Tokens of the wrapper around a preview (tags and the saved file's name).
WRAPPER_TOKENS = 40


class Budget:
    def __init__(self, p: dict[str, Any]) -> None:
        self.enabled = bool(p["budget.enabled"])
        self.max_chars = int(p["budget.max_result_chars"])
        self.tool_limits: dict[str, int | None] = dict(p["budget.tool_limits"])
        self.preview_chars = int(p["budget.preview_chars"])
        self.per_message = bool(p["budget.per_message.enabled"])
        self.message_chars = int(p["budget.per_message.max_chars"])
        #: Results persisted so far (for the loss metrics and tests).
        self.persisted: list[int] = []
        #: `limit` of each tool met so far.
        self._limits: dict[str | None, int | None] = {}

    def limit(self, tool: str | None) -> int | None:
        """Characters above which a result of `tool` is persisted (None: never)."""
        if tool is not None and tool in self.tool_limits:
            own = self.tool_limits[tool]
            return None if own is None else min(own, self.max_chars)
        return self.max_chars

    def _persist(self, conv: Conversation, block: int) -> None:
        chars = conv.chars[block]
        tokens = conv.tokens[block]
        preview = min(tokens, round(tokens * self.preview_chars / max(chars, 1)))
        item = chain(conv.hashes[block], 0x50E5)
        conv.persist_entering(block, item, preview + WRAPPER_TOKENS, edit="budget")
        self.persisted.append(block)

    def on_enter(self, conv: Conversation, keys: list[int]) -> None:
        """Decide for results about to enter the conversation (called before they are
        appended, so the decision costs no re-chaining). Runs for every request: the
        per-tool limits are looked up once per tool."""
        if not self.enabled:
            return
        result, chars, block_tool, limits = conv.result, conv.chars, conv.block_tool, self._limits
        fresh: dict[int, list[int]] = {}
        for key in keys:
            if key < 0 or not result[key]:
                continue
            tool = block_tool[key]
            if tool in limits:
                limit = limits[tool]
            else:
                limit = limits[tool] = self.limit(tool)
            if limit is not None and chars[key] > limit:
                self._persist(conv, key)
            elif self.per_message:
                fresh.setdefault(conv.msg[key], []).append(key)
        for blocks in fresh.values():
            total = sum(chars[b] for b in blocks)
            if total <= self.message_chars:
                continue
            for b in sorted(blocks, key=lambda x: -chars[x]):
                if total <= self.message_chars:
                    break
                total -= chars[b] - self.preview_chars
                self._persist(conv, b)
