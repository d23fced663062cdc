"""Stage 3, context collapse (internal builds of Claude Code).

Spans of older conversation are summarised in the background as the context grows; from
90% of the effective window the staged summaries are committed (each span replaced by its
summary), and at 95% the request is blocked (recorded as an overflow). When collapse is
on, proactive autocompact is off. Span size and summary ratio are not public: parameters.
Each committed span costs one background summary request, priced as its own row.
"""

from __future__ import annotations

from typing import Any

from policies.conversation import Conversation


class Collapse:
    def __init__(self, p: dict[str, Any]) -> None:
        self.enabled = bool(p["collapse.enabled"])
        self.commit = float(p["collapse.commit_fraction"])
        self.block = float(p["collapse.block_fraction"])
        self.span_groups = int(p["collapse.span_groups"])
        self.ratio = float(p["collapse.summary_ratio"])
        self.keep_tail = int(p["collapse.keep_tail_groups"])
        self.commits = 0

    def due(self, estimate: int, effective: int) -> bool:
        return self.enabled and estimate >= self.commit * effective

    def blocked(self, estimate: int, effective: int) -> bool:
        return self.enabled and estimate >= self.block * effective

    def commit_span(self, conv: Conversation) -> tuple[list[int], int] | None:
        """Replace the oldest span by its summary; returns (span items, summary tokens)."""
        groups = conv.groups()
        first_real = next(
            (
                i
                for i, g in enumerate(groups)
                if conv.items[g] >= 0 or conv.synthetic[conv.items[g]].kind != "collapse"
            ),
            None,
        )
        if first_real is None:
            return None
        end_group = min(first_real + self.span_groups, len(groups) - self.keep_tail)
        if end_group <= first_real:
            return None
        bounds = [*groups, len(conv.items)]
        lo, hi = bounds[first_real], bounds[end_group]
        span = conv.items[lo:hi]
        tokens = sum(conv.item(k)[1] for k in span)
        summary = conv.add_synthetic(max(1, int(tokens * self.ratio)), "collapse", self.commits)
        conv.replace_range(lo, hi, [summary], edit="collapse")
        self.commits += 1
        return span, conv.synthetic[summary].tokens
