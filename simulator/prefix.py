"""The system + tools prefix of a session as pseudo-items of the view.

A transcript does not log the prefix; its size and cache structure are inferred from the
recorded usage (the compiled trace keeps the inferred total, `Session.prefix_tokens`):

* `shared`: the part the first request already read from cache. The session did not
  write it, so another session sharing the same system prompt had.
* `system`: where the system prompt's own cache marker ends: after a change early in the
  conversation (a compaction) the recording falls back to reading exactly this much; it is
  the smallest later cache read above `shared`.
* the rest of the prefix: context the client adds before the first logged message.

Unlogged prefix changes. Claude Code rewrites parts of what precedes the first logged
message (its injected context: CLAUDE.md, reminders, environment) without logging it. The
recording shows it: a request whose cache read falls back to a point inside the prefix
although the previous request's entries were still alive (the gap is shorter than the
TTL it wrote with) and were longer. Such a request is a *reset* at that point: the
prefix segment starting there changes from that request on, for every policy (the client
would have sent the changed context whatever the compaction policy).

Sessions without usage have one segment, the whole prefix.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from simulator.model import Session
from simulator.view import FIVE_MINUTES, NO_BLOCK, ONE_HOUR, View, chain

#: A fallback read must be this much shorter than what was alive to count as a reset
#: (smaller shortfalls are ordinary lookback or reminder effects near the end).
RESET_MIN_SHORTFALL = 1024


@dataclass(frozen=True)
class Prefix:
    shared: int  # tokens read from cache at the first request (warm from elsewhere)
    system: int  # tokens through the system prompt's cache marker
    total: int  # the whole inferred prefix
    #: Segment starts inside the prefix (0 first), ascending.
    cuts: tuple[int, ...] = (0,)
    #: Request -> segment start whose content changes there (an unlogged reset).
    resets: dict[int, int] = field(default_factory=dict)

    def segments(self) -> list[tuple[int, int]]:
        """(start, size) of each prefix segment."""
        bounds = [*self.cuts, self.total]
        return [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


def infer(session: Session, *, resets: bool = True) -> Prefix:
    total = session.prefix_tokens
    r = session.requests
    has = r["has_usage"].tolist()
    if not has or not has[0]:
        return Prefix(0, total, total, (0,), {})
    read = r["cache_read"].tolist()
    ts = r["ts"].tolist()
    w1 = r["cache_write_1h"].tolist()
    w5 = r["cache_write_5m"].tolist()
    context = session.recorded_context().tolist()
    shared = min(read[0], total)
    later = [c for c, h in zip(read[1:], has[1:], strict=True) if h and shared < c <= total]
    system = min(later) if later else total
    compactions = {e.request for e in session.events}
    # Reads that end inside the prefix mark cache entries there (system prompt markers).
    marks = {read[k] for k in compactions if k < len(has) and has[k] and 0 < read[k] < total}
    found: dict[int, int] = {}
    if resets:
        for k in range(1, len(has)):
            if not (has[k] and has[k - 1]) or k in compactions or read[k] >= total:
                continue
            ttl = ONE_HOUR if w1[k - 1] > 0 and w5[k - 1] == 0 else FIVE_MINUTES
            alive = ts[k] - ts[k - 1] < ttl
            if alive and context[k - 1] - read[k] >= RESET_MIN_SHORTFALL:
                found[k] = read[k]
    cuts = sorted({0, shared, system, *found.values(), *marks} - {total})
    return Prefix(shared, system, total, tuple(c for c in cuts if c < total), found)


class PrefixState:
    """The prefix items of a session's views, with the content version of each segment."""

    def __init__(self, root: int, prefix: Prefix) -> None:
        self.root = root
        self.prefix = prefix
        self.version = {start: 0 for start, _ in prefix.segments()}

    def reset(self, request: int) -> bool:
        """Apply an unlogged change at `request`, if there is one; True if the prefix changed."""
        at = self.prefix.resets.get(request)
        if at is None:
            return False
        for start, _ in self.prefix.segments():
            if start >= at:
                self.version[start] += 1
                break
        return True

    def start_view(self) -> tuple[View, list[int], list[int]]:
        """A view of the prefix items, the positions cached before the session began (the
        shared part, warm from other sessions) and the positions of the prefix's cache
        markers (where its observed reads end; at most 3, the largest, so that with the
        message marker a request has at most 4)."""
        view = View(self.root)
        p = self.prefix
        ends = set(p.cuts[1:]) | {p.system}
        warm: list[int] = []
        marks: list[int] = []
        for start, size in p.segments():
            view.append(NO_BLOCK, chain(self.root, (start << 24) ^ self.version[start]), size)
            end = start + size
            if 0 < end <= p.shared:
                warm.append(len(view) - 1)
            if end in ends:
                marks.append(len(view) - 1)
        if not len(view):
            view.append(NO_BLOCK, chain(self.root, 0), 0)
        if not marks:
            marks.append(len(view) - 1)
        return view, warm, marks[-3:]
