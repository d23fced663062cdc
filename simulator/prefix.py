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

A recorded compaction whose request reads the cache only up to a point inside the prefix
is a reset there too: Claude Code sends what follows the system prompt (environment,
CLAUDE.md) again after each compaction, and the 2.1.22x compactions of ../shared read
exactly the same 29,760-token start four times in one session.

The shared part is warm from other sessions, not forever: after an idle gap (longer than
the TTL the session last wrote with) a request that reads less than the shared part found
it warm only that far: its segments up to the read are the warm versions (again, if an
earlier gap found them cold) and the one at the read is reset. In ../shared, git-sync and
entirecontext sessions read nothing after gaps of hours, m-claude and wakil ones part of
it, others all of it after 54 minutes.

After such a gap a request can also read *more* of the prefix than the session found warm
at its start: other sessions of the user kept a longer part warm by then (their system
prompt and injected context had the same start as this one's). The recording's read is the
evidence of how far, per request, never a per-session constant: the prefix gets a segment
boundary there, with a cache marker (a read ending there means the client marks there: no
marker of the session's own reaches it by lookback from further on), and the request finds
the segments up to it warm (`Prefix.warm_more`, `PrefixState.warm_now`), seeded with the
request's own TTL, so a later gap reads only what its own evidence says. In ../shared
(`ctxsim fidelity`, as-recorded; the 174 requests after a gap longer than the TTL last
written with, the previous request with usage too): 23 such reads end inside the prefix
beyond the start's shared part, in flutter-docker, git-sync, starcar and wakil; starcar
548526c8 found nothing warm at its start and reads 30,582 of its 79,600-token prefix after
its own entries expired (5.0 minutes on a 5-minute TTL), git-sync ec48fae0 reads 9,236 of
17,458 after gaps of 1.4-9 h and 17,248 after one of 5.7 h (9,210 at its start), wakil
adf7939a 26,205 of 39,406 after 77 minutes (21,274 at its start) and 21,399 after the
later 11-13 minute gaps. Reads beyond the prefix after such a gap (ec48fae0 reads 24,203
after 15 h, into its first messages) are not modelled: the messages are this session's.

Thinking on and off are separate cache keys. Anthropic keys message-cache entries by the
thinking parameters ("thinking parameter changes invalidate messages cache"; system and
tools stay cached), and in 2.1.29 and 2.1.31 (promptgrimoire 8 of 8, denubis 4 of 5) a
switch of whether the response holds thinking falls back to the system part: a reset,
found as any other. A switch back reads the last prompt of its own mode where that entry
is still alive: promptgrimoire request 150 reads 146,960, request 142's cached part to the
token (its context less its 10 uncached), after 7 requests of the other mode; request 229
reads 134,697, request 222's likewise (the 24 blocks between are reached through the
assistant message's marker, policies/as_recorded.py). Such a return restores the segment
versions from just before the switch away (`Prefix.restores`, `PrefixState.restored`),
taken only where the recording's read is that earlier prompt's cached part (within
`RESET_MIN_SHORTFALL`) and short of the previous request's context, with no reset,
compaction or layout change between: denubis a0adff31 request 4 switches back and reads
45,066, more than the other mode's last context (44,540), which no key per mode explains,
so it is no return. In 2.1.1xx-2.1.2xx 3,118 of 3,199 switches within the TTL read the
whole previous context (a response without thinking is no request without it there): no
reset, so no return either. promptgrimoire went from -0.58% to -0.07% with this (its
requests 150 and 229 matched); no other request of ../shared/traces/claude-code changed.

Sessions without usage have one segment, the whole prefix.

Prefix changes. The prefix is per request (`Session.prefix_at`, the compiled `prefix`
column): each model gets its own (Claude Code sends full tool schemas to some models and
deferred tools to others; issue 12 measured 159k against 42k in one session), and a
recorded compaction can shrink it (traces/builder.py). Each run of requests with one
prefix total is an *epoch* with its own layout, inferred from that run's reads as above;
a segment with the same bounds and content version in two layouts is the same content
(the system prompt does not change with the model), so it keeps its identity: the part a
new model finds warm from elsewhere is read again where the recording read it. Every
layout is padded to the same number of items with empty ones, so a policy's view keeps
its prefix length when the layout changes (`PrefixState.reset` says when).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from simulator.model import Kind, Session
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
    #: Request -> the layout from that request on (a new model's prefix, or a prefix
    #: re-inferred after a compaction); empty when the prefix never changes.
    changes: dict[int, Prefix] = field(default_factory=dict)
    #: A layout of a model's first requests: what they read of it was warm from elsewhere
    #: (`shared`), to be seeded when the layout starts (`PrefixState.warm_pending`).
    new_model: bool = False
    #: Request after an idle gap -> how far the shared part was warm from elsewhere (what
    #: the recording read of it): those segments are the warm versions again.
    shared_warm: dict[int, int] = field(default_factory=dict)
    #: Request after an idle gap -> how far the prefix was warm from elsewhere where that
    #: is beyond the shared part: the segments ending there are seeded as they are now.
    warm_more: dict[int, int] = field(default_factory=dict)
    #: Request switching the thinking mode back -> the request that switched away from it:
    #: the segments' versions from just before that switch are restored (`_mode_returns`).
    restores: dict[int, int] = field(default_factory=dict)

    def segments(self) -> list[tuple[int, int]]:
        """(start, size) of each prefix segment."""
        bounds = [*self.cuts, self.total]
        return [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


def _layout(
    total: int, requests: list[int], read: list[int], has: list[bool], marks: set[int]
) -> tuple[int, int, set[int]]:
    """(shared, system, cut points) of one epoch's prefix from its requests' reads."""
    used = [k for k in requests if has[k]]
    if not used:
        return 0, total, set()
    shared = min(read[used[0]], total)
    later = [read[k] for k in used[1:] if shared < read[k] <= total]
    system = min(later) if later else total
    inside = {m for m in marks if 0 < m < total}
    return shared, system, {0, shared, system, *inside}


def infer(session: Session, *, resets: bool = True, recorded: bool = False) -> Prefix:
    """The prefix of a session's views. `recorded`: for a replay of the recording's own
    compactions (`as-recorded`); other policies do not compact where the recording did, so
    what a compaction changed in the prefix (a re-inferred size, the part re-sent after
    it) is not theirs: they keep each model's prefix from before."""
    totals = session.prefix_at().tolist()
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
    compactions = {e.request for e in session.events}
    if not recorded:
        totals = _model_prefixes(totals, r["model"].tolist())
    # Reads that end inside the prefix mark cache entries there (system prompt markers).
    marks = {read[k] for k in compactions if k < len(has) and has[k] and read[k] > 0}
    found: dict[int, int] = {}
    shared0 = min(read[0], totals[0])
    warm_shared: dict[int, int] = {}
    warm_more: dict[int, int] = {}
    if resets:
        for k in range(1, len(has)):
            ttl = ONE_HOUR if w1[k - 1] > 0 and w5[k - 1] == 0 else FIVE_MINUTES
            alive = ts[k] - ts[k - 1] < ttl
            if recorded and has[k] and k in compactions and 0 < read[k] < totals[k]:
                # A compaction re-sends what follows the system prompt (environment,
                # CLAUDE.md): the recording reads only up to there, every time.
                found[k] = read[k]
                if not alive and shared0 > 0:
                    warm_shared[k] = min(read[k], shared0)
                if not alive and read[k] > shared0:
                    warm_more[k] = read[k]
                continue
            if not (has[k] and has[k - 1]) or k in compactions or read[k] > totals[k]:
                continue
            if totals[k] != totals[k - 1]:
                continue  # a new layout: its own cache entries, not a reset
            if alive:
                if read[k] < totals[k] and context[k - 1] - read[k] >= RESET_MIN_SHORTFALL:
                    found[k] = read[k]
                continue
            if read[k] > shared0:
                warm_more[k] = read[k]  # warm from elsewhere beyond the shared part
            if shared0 > 0 and read[k] < totals[k]:
                warm_shared[k] = min(read[k], shared0)  # warm from elsewhere so far
                if read[k] < shared0:
                    found[k] = read[k]  # and the rest cold
    models = r["model"].tolist()
    starts = [0, *(k for k in range(1, len(totals)) if totals[k] != totals[k - 1])]
    bounds = [*starts, len(totals)]
    layouts: list[tuple[int, Prefix]] = []
    for a, b in itertools.pairwise(bounds):
        t = totals[a]
        shared, system, cuts = _layout(t, list(range(a, b)), read, has, marks)
        new_model = a > 0 and models[a] not in models[:a]
        if a and not new_model:
            shared = layouts[0][1].shared  # warm from elsewhere: seeded once, at the start
        cuts |= {v for v in found.values() if v < t} | {layouts[0][1].shared if a else 0}
        cuts |= {v for v in warm_more.values() if v < t}
        cut_points = tuple(sorted(c for c in cuts if c < t) or [0])
        layouts.append((a, Prefix(shared, system, t, cut_points, found, new_model=new_model)))
    restores = _mode_returns(session, found, compactions, set(starts)) if resets else {}
    first = replace(layouts[0][1], shared_warm=warm_shared, warm_more=warm_more, restores=restores)
    if len(layouts) == 1:
        return first
    return replace(first, changes={a: layout for a, layout in layouts[1:]})


def _model_prefixes(totals: list[int], models: list[int]) -> list[int]:
    """Per-request prefixes with each model keeping the size it first had (the builder
    changes a model's prefix only at a recorded compaction)."""
    first: dict[int, int] = {}
    return [first.setdefault(m, t) for t, m in zip(totals, models, strict=True)]


def _mode_returns(
    session: Session, found: dict[int, int], compactions: set[int], starts: set[int]
) -> dict[int, int]:
    """Requests whose thinking mode returns to the one an earlier reset switched away
    from, and read that mode's last prompt: request -> the switch away (see the module's
    docstring). A request's mode is whether its response holds thinking; the return is
    taken only where the recording's read is that prompt's cached part (its context less
    its uncached input, within `RESET_MIN_SHORTFALL`) and falls short of the previous
    request's context, with no other reset, compaction or layout change in between."""
    r = session.requests
    n = len(r)
    if n < 3 or not found:
        return {}
    blocks = session.blocks
    thinks = [False] * n
    origin = blocks["origin"].tolist()
    for i, kind in enumerate(blocks["kind"].tolist()):
        if kind == Kind.THINKING and 0 <= origin[i] < n:
            thinks[origin[i]] = True
    has = r["has_usage"].tolist()
    read = r["cache_read"].tolist()
    uncached = r["input"].tolist()
    context = session.recorded_context().tolist()
    out: dict[int, int] = {}
    away = -1
    for k in range(1, n):
        if k in compactions or k in starts:
            away = -1
            continue
        if k in found:
            switched = thinks[k] != thinks[k - 1]
            away = k if switched and has[k - 1] else -1
            continue
        if away < 0 or thinks[k] == thinks[k - 1]:
            continue
        before = away - 1
        cached = context[before] - uncached[before]
        if (
            has[k]
            and thinks[k] == thinks[before]
            and abs(read[k] - cached) <= RESET_MIN_SHORTFALL
            and context[k - 1] - read[k] >= RESET_MIN_SHORTFALL
        ):
            out[k] = away
        away = -1
    return out


class PrefixState:
    """The prefix items of a session's views, with the content version of each segment."""

    def __init__(self, root: int, prefix: Prefix) -> None:
        self.root = root
        self.prefix = prefix
        self.layout = prefix
        layouts = [prefix, *prefix.changes.values()]
        self.n_items = max(max(len(p.segments()) for p in layouts), 1)
        self.version: dict[int, int] = {}
        #: The layout `reset` just started is a new model's: its warm part is to be seeded.
        self.warm_pending = False
        #: Positions `reset` found warm from elsewhere beyond the shared part (`warm_more`):
        #: to be seeded for this request with its own TTL.
        self.warm_now: list[int] = []
        #: Switch away -> the segments' versions just before it, for a later return.
        self._before_switch: dict[int, dict[int, int]] = {}
        self._switches = set(prefix.restores.values())
        #: `reset` just restored a thinking mode's versions: the view is re-chained onto
        #: entries older than the previous request's.
        self.restored = False
        #: The requests at which `reset` has anything to do: at every other one (nearly all:
        #: a reset is a few requests of a session) it returns at once, without rebuilding
        #: the layout's segments (7% of an as-recorded replay when it did, issue 16).
        self._eventful = {
            *prefix.changes,
            *prefix.warm_more,
            *prefix.shared_warm,
            *prefix.restores,
            *self._switches,
            *prefix.resets,
        }
        #: The segments of each layout, built once (`Prefix.segments`).
        self._segments: dict[int, list[tuple[int, int]]] = {}

    def _layout_segments(self) -> list[tuple[int, int]]:
        layout = self.layout
        segments = self._segments.get(id(layout))
        if segments is None:
            segments = self._segments[id(layout)] = layout.segments()
        return segments

    def reset(self, request: int) -> bool:
        """Apply an unlogged change at `request`, if there is one; True if the prefix changed."""
        if request not in self._eventful:
            self.warm_pending = self.restored = False
            self.warm_now = []
            return False
        changed = False
        layout = self.prefix.changes.get(request)
        self.warm_pending = False
        if layout is not None:
            self.layout = layout
            self.warm_pending = layout.new_model
            changed = True
        more = self.prefix.warm_more.get(request, 0)
        segments = self._layout_segments()
        self.warm_now = [
            i
            for i, (start, size) in enumerate(segments)
            if self.layout.shared < start + size <= more
        ]
        upto = self.prefix.shared_warm.get(request)
        if upto is not None:
            for start, size in segments:
                if start + size <= upto and self.version.get(start, 0):
                    self.version[start] = 0  # warm from elsewhere again
                    changed = True
        back = self.prefix.restores.get(request)
        self.restored = back is not None and back in self._before_switch
        if back is not None and self.restored:
            self.version = dict(self._before_switch.pop(back))  # that mode's entries again
            return True
        if request in self._switches:
            self._before_switch[request] = dict(self.version)
        at = self.prefix.resets.get(request)
        if at is None:
            return changed
        for start, _ in segments:
            if start >= at:
                self.version[start] = self.version.get(start, 0) + 1
                break
        return True

    def _item(self, start: int, size: int) -> int:
        version = self.version.get(start, 0)
        return chain(chain(self.root, (start << 24) ^ version), start + size)

    def start_view(self) -> tuple[View, list[int], list[int]]:
        """A view of the prefix items, the positions cached before the session began (the
        shared part, warm from other sessions) and the positions of the prefix's cache
        markers (where its observed reads end; at most 3, the largest, so that with the
        message marker a request has at most 4)."""
        view = View(self.root)
        p = self.layout
        ends = set(p.cuts[1:]) | {p.system}
        warm: list[int] = []
        marks: list[int] = []
        for start, size in p.segments():
            view.append(NO_BLOCK, self._item(start, size), size)
            end = start + size
            if 0 < end <= p.shared:
                warm.append(len(view) - 1)
            if end in ends:
                marks.append(len(view) - 1)
        if not len(view):
            view.append(NO_BLOCK, chain(self.root, 0), 0)
        if not marks:
            marks.append(len(view) - 1)
        for pad in range(len(view), self.n_items):  # the same length in every layout
            view.append(NO_BLOCK, chain(self.root, ~pad), 0)
        return view, warm, marks[-3:]
