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

from policies.conversation import Conversation


class Snip:
    def __init__(self, p: dict[str, Any]) -> None:
        self.enabled = bool(p["snip.enabled"])
        self.trigger = float(p["snip.trigger_fraction"])
        self.target = float(p["snip.target_fraction"])
        self.head = int(p["snip.keep_head_groups"])
        self.tail = int(p["snip.keep_tail_groups"])
        self.snips = 0

    def run(self, conv: Conversation, estimate: int, effective: int) -> int:
        """Snip if due; returns the tokens freed."""
        if not self.enabled or estimate < self.trigger * effective:
            return 0
        groups = conv.groups()
        if len(groups) <= self.head + self.tail:
            return 0
        bounds = [*groups, len(conv.items)]
        removable = list(range(self.head, len(groups) - self.tail))
        goal = estimate - int(self.target * effective)
        freed = 0
        drop: set[int] = set()
        for g in removable:
            if freed >= goal:
                break
            for key in conv.items[bounds[g] : bounds[g + 1]]:
                drop.add(key)
                freed += conv.item(key)[1]
        if not drop:
            return 0
        conv.remove_blocks(drop, edit="snip")
        self.snips += 1
        return freed
