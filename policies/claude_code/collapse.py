"""Stage 3, context collapse (internal builds of Claude Code).

Spans of older conversation are summarised in the background as the context grows; from
90% of the effective window the staged summaries are committed (each span replaced by its
summary), and at 95% the request is blocked (recorded as an overflow). When collapse is
on, proactive autocompact is off. Span size and summary ratio are not public: parameters.
Each committed span costs one background summary request, priced as its own row.

A commit finds its span without walking the conversation (issue 16): the groups come
from a `GroupIndex` (policies/claude_code/groups.py) repaired in place after each commit,
and the groups before the first one that does not open with a collapse summary are
counted once (`_lead`), not scanned again: on the 10,000-request synthetic session the
summaries pile up (one a request once the window is full), and the walk over them and
over every group was 90% of the replay. The span's tokens are summed over its own items
only. tests/policies/claude_code/test_claude_code_stages.py checks the commits against
the full walk on scripted sessions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from policies.claude_code.groups import GroupIndex
from policies.conversation import Conversation


class Span(NamedTuple):
    """The groups first..end-1 (items lo..hi-1) the next commit replaces."""

    first: int
    end: int
    lo: int
    hi: int


class Collapse:
    def __init__(self, p: dict[str, Any]) -> None:
        self.enabled = bool(p["collapse.enabled"])
        self.commit = float(p["collapse.commit_fraction"])
        self.block = float(p["collapse.block_fraction"])
        self.span_groups = int(p["collapse.span_groups"])
        self.ratio = float(p["collapse.summary_ratio"])
        self.keep_tail = int(p["collapse.keep_tail_groups"])
        self.commits = 0
        self.groups = GroupIndex()
        #: Groups 0.._lead-1 open with a collapse summary (valid for one generation of
        #: the index: appends and commits keep the groups before it as they are).
        self._lead = 0
        self._generation = -1

    def due(self, estimate: int, effective: int) -> bool:
        return self.enabled and estimate >= self.commit * effective

    def blocked(self, estimate: int, effective: int) -> bool:
        return self.enabled and estimate >= self.block * effective

    def span(self, conv: Conversation) -> Span | None:
        """The oldest span the next commit would replace: from the first group that does
        not open with a collapse summary, `span_groups` groups, keeping `keep_tail`."""
        groups = self.groups(conv)
        if self._generation != self.groups.generation:
            self._generation = self.groups.generation
            self._lead = 0
        items, synthetic = conv.items, conv.synthetic
        first, n = self._lead, len(groups)
        while first < n:
            key = items[groups[first]]
            if key >= 0 or synthetic[key].kind != "collapse":
                break
            first += 1
        self._lead = first
        if first == n:
            return None
        end = min(first + self.span_groups, n - self.keep_tail)
        if end <= first:
            return None
        return Span(first, end, groups[first], groups[end] if end < n else len(items))

    def replace(self, conv: Conversation, span: Span) -> int:
        """Replace `span`, as `span` just found it, by its summary; returns the summary's
        tokens."""
        first, end, lo, hi = span
        keys = conv.items[lo:hi]
        tokens = sum(conv.item(k)[1] for k in keys)
        summary = conv.add_synthetic(max(1, int(tokens * self.ratio)), "collapse", self.commits)
        conv.replace_range(lo, hi, [summary], edit="collapse")
        self.groups.replaced(conv, first, end, lo, hi)
        self._lead = first + 1
        self.commits += 1
        return conv.synthetic[summary].tokens
