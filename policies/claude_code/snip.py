"""Stage 1, snip (internal builds of Claude Code).

The model removes chosen middle ranges of the conversation; the tokens freed are
subtracted from the estimate the later checks use. Its selection and thresholds are not
public, so they are parameters: when the estimate passes `trigger_fraction` of the
effective window, whole API-round groups are removed from the middle (oldest first,
keeping `keep_head_groups` at the start and `keep_tail_groups` at the end) until the
estimate is under `target_fraction`.
"""

from __future__ import annotations

from typing import Any

from policies.claude_code.groups import GroupIndex
from policies.conversation import Conversation


class Snip:
    def __init__(self, p: dict[str, Any]) -> None:
        self.enabled = bool(p["snip.enabled"])
        self.trigger = float(p["snip.trigger_fraction"])
        self.target = float(p["snip.target_fraction"])
        self.head = int(p["snip.keep_head_groups"])
        self.tail = int(p["snip.keep_tail_groups"])
        self.snips = 0
        self.groups = GroupIndex()

    def run(self, conv: Conversation, estimate: int, effective: int) -> int:
        """Snip if due; returns the tokens freed. The groups removed are consecutive, so
        they leave as one range of items (the items are distinct)."""
        if not self.enabled or estimate < self.trigger * effective:
            return 0
        groups = self.groups(conv)
        if len(groups) <= self.head + self.tail:
            return 0
        goal = estimate - int(self.target * effective)
        if goal <= 0:
            return 0
        items = conv.items
        # Each item's tokens as `conv.item` gives them, looked up directly (a few hundred
        # items a snip): a synthetic item's, a rewritten block's, else the block's.
        synthetic, override, tokens = conv.synthetic, conv.override, conv.tokens
        lo = hi = groups[self.head]
        freed = 0
        end_group = self.head
        for g in range(self.head + 1, len(groups) - self.tail + 1):
            if freed >= goal:
                break
            end = groups[g] if g < len(groups) else len(items)
            for key in items[hi:end]:
                if key < 0:
                    freed += synthetic[key].tokens
                else:
                    o = override.get(key)
                    freed += tokens[key] if o is None else o[1]
            hi = end
            end_group = g
        conv.replace_range(lo, hi, [], edit="snip")
        self.groups.removed(conv, self.head, end_group, lo, hi)
        self.snips += 1
        return freed
