"""The system + tools prefix of a session as pseudo-items of the view.

A transcript does not log the prefix; its size and cache structure are inferred from the
recorded usage (the compiled trace keeps the inferred total, `Session.prefix_tokens`):

* `shared`: the part the first request already read from cache. The session did not
  write it, so another session sharing the same system prompt (the user's other sessions,
  or earlier ones) had; it is taken to stay warm while the session runs.
* `system`: where the system prompt's own cache marker ends. After a change early in the
  conversation (thinking dropped at a new turn, a compaction) the recording falls back to
  reading exactly this much; it is the smallest later cache read above `shared`.
* the rest of the prefix: context the client adds before the first logged message.

Sessions without usage have one segment, the whole prefix.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from simulator.model import Session
from simulator.view import NO_BLOCK, View, chain


@dataclass(frozen=True)
class Prefix:
    shared: int  # tokens read from cache at the first request (warm from elsewhere)
    system: int  # tokens through the system prompt's cache marker
    total: int  # the whole inferred prefix

    def segments(self) -> list[int]:
        cuts = sorted({0, self.shared, self.system, self.total})
        return [b - a for a, b in itertools.pairwise(cuts) if b > a]


def infer(session: Session) -> Prefix:
    total = session.prefix_tokens
    r = session.requests
    has = r["has_usage"]
    if len(has) == 0 or not has[0]:
        return Prefix(0, total, total)
    shared = min(int(r["cache_read"][0]), total)
    later = [
        int(c)
        for c, h in zip(r["cache_read"][1:].tolist(), has[1:].tolist(), strict=True)
        if h and shared < c <= total
    ]
    system = min(later) if later else total
    return Prefix(shared, system, total)


def start_view(root: int, prefix: Prefix) -> tuple[View, int, int]:
    """A view holding the prefix items; returns it with the positions of the end of the
    shared part (-1 if none) and of the system marker."""
    view = View(root)
    h = root
    shared_pos = -1
    system_pos = -1
    done = 0
    for size in prefix.segments():
        h = chain(h, size)
        view.append(NO_BLOCK, h, size)
        done += size
        if done == prefix.shared:
            shared_pos = len(view) - 1
        if done == prefix.system:
            system_pos = len(view) - 1
    if not len(view):
        view.append(NO_BLOCK, chain(root, 0), 0)
    if system_pos < 0:
        system_pos = len(view) - 1
    return view, shared_pos, system_pos
