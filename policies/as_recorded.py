"""`as-recorded`: send exactly what the recording agent sent.

The recording's own compactions are replayed as they happened (its summaries are in the
view, what they replaced is not), restored attachments are there as the INJECTED blocks
sized from the recorded usage, and each request's cache entries take the TTL that request
recorded. Replaying under this policy is how the cost model is checked against reality
(`ctxsim fidelity`). Where the recording shows that the client wrote the cache with a
request it does not log (a prompt suggestion after an end of turn, `post_turn_writes`),
that entry is kept too; the unlogged request itself is not priced (it is not in the
recording). A compaction call the recording logged (Claude Code's `agent-acompact-*.jsonl`,
`CompactionEvent.call_usage`) is priced as a call of its own before the first request
after that compaction (`_compaction_call`), at its logged time, with the logged output;
the recording's bill counts it too (simulator/frames.py `recorded_priced`).
"""

from __future__ import annotations

import bisect
from typing import ClassVar

import numpy as np

from policies.base import KEPT_WARM_MS, PREFIX_RESETS, WARM_START, previous_message_end
from policies.prompt_suggestion import post_turn_writes
from simulator.model import NEVER, RECORDED_CALL_STAGE, Flag, LoggedCall
from simulator.params import Declarations
from simulator.policy import Call, Emitter, Policy, SessionContext, SessionPolicy, register
from simulator.prefix import PrefixState, infer
from simulator.view import ANTHROPIC_LOOKBACK, MAX_BREAKPOINTS, Breakpoint, View, chain

#: Salt of the hash of what a recorded compaction call added to its parent's context.
COMPACTION_TAIL_SALT = 0xAC0C


class _State(SessionPolicy):
    def __init__(self, ctx: SessionContext, warm_start: bool, resets: bool) -> None:
        self.ctx = ctx
        self.schedule = ctx.history.recorded
        self.hashes = ctx.history.hashes
        self.tokens = ctx.history.tokens
        self.prefix = PrefixState(ctx.root, infer(ctx.session, resets=resets, recorded=True))
        self.view, self.warm, self.marks = self.prefix.start_view()
        self.n_prefix = len(self.view)
        self.pos: dict[int, int] = {}
        blocks = ctx.session.blocks
        self.stripped = set(np.nonzero(blocks["flags"] & Flag.STRIPPED)[0].tolist())
        self.hidden: list[int] = blocks["hidden_from"].tolist()
        self.compacted: list[int] = blocks["compacted_at"].tolist()
        self.removed_later: dict[int, list[int]] = {}
        self.warm_start = warm_start
        self.rewarm: list[int] = []
        self.uncached: list[int] = ctx.session.requests["input"].tolist()
        self.marks_by_ttl: dict[int, list[Breakpoint]] = {}
        #: One Call reused for every request: the engine reads it at once, keeps nothing.
        self.call = Call("request", "", [], 0)
        self.roles: list[int] = blocks["role"].tolist()
        self.kinds: list[int] = blocks["kind"].tolist()
        #: The block the previous request's message marker was on (-1: none yet).
        self.last_mark = -1
        #: Request -> the response block an unlogged post-turn request wrote through.
        self.post_turn = post_turn_writes(ctx.session)
        #: Request -> the logged usage of the compaction call just before it.
        self.compaction_calls = ctx.session.logged_calls()

    def _sync(self, k: int) -> None:
        if self.prefix.reset(k):  # the client changed its unlogged context: re-chain
            blocks = self.view.items(self.n_prefix)
            self.view, warm, marks = self.prefix.start_view()
            if marks != self.marks:  # another layout (a new model's prefix): its markers
                self.marks, self.marks_by_ttl = marks, {}
            self.view.extend(blocks)
            if self.prefix.warm_pending and self.warm_start:
                self.rewarm = warm  # a new model's prefix, warm from other sessions
        view, pos = self.view, self.pos
        leaving = [pos.pop(b) for b in self.removed_later.pop(k, []) if b in pos]
        for b in self.schedule.leave[k]:
            if b not in pos:
                continue
            if b in self.stripped and self.hidden[b] == k:
                # Still sent, no longer counted: the cached prefix is unchanged. The block
                # leaves the prompt when the recording's compaction drops it, if ever.
                view.edit_out(pos[b])
                if self.compacted[b] < NEVER:
                    self.removed_later.setdefault(self.compacted[b], []).append(b)
            else:
                leaving.append(pos.pop(b))
        if leaving:
            leaving.sort()
            view.remove(leaving)
            for i in range(leaving[0], len(view)):
                pos[view.ids[i]] = i
        entering = self.schedule.enter[k]
        if entering:
            n = len(view.ids)
            for i, b in enumerate(entering, start=n):
                pos[b] = i
            view.extend_blocks(entering, self.hashes, self.tokens)

    def _message_mark(self, k: int, view: View) -> int:
        """Where the request's message marker was: the item boundary nearest to what the
        recording cached (its context less its uncached input). Usually the view's end;
        where the client sent content after its marker (up to a few thousand uncached
        input tokens in 2.1.x, git-sync and entirecontext of ../shared), the next request
        reads only up to the marker, so the marker goes there. Where what the recording
        cached is nearer a prefix mark than the prefix's end, the request had no message
        marker at all (it goes on the last prefix mark, adding nothing): first requests of
        2.1.1xx git-sync sessions read the shared 16k, write 5k and leave 4-26k uncached
        (26,131 in two of them); marked at the prefix's end they wrote up to 31k the
        recording did not (git-sync's p90 session error 2.25%, 1.04% with this)."""
        last = len(view.ids) - 1
        tail = self.uncached[k]
        lo = max(self.n_prefix - 1, self.marks[-1] if self.marks else 0)
        if tail <= 0 or last <= lo:
            return last
        cum = view.cum
        target = cum[last] - tail
        j = bisect.bisect_left(cum, target, lo, last)
        if j > lo and target - cum[j - 1] < cum[j] - target:
            j -= 1
        if j == lo and self.marks and lo > self.marks[-1]:
            nearest = min((*self.marks, lo), key=lambda p: abs(cum[p] - target))
            if nearest != lo:
                j = self.marks[-1]  # no marker of its own: the prefix's marks alone
        return j

    def _previous_message_mark(self, view: View, mark: int) -> int:
        """Where the marker on the message before the last one goes, or -1 where it changes
        nothing this request reads. Claude Code marks the last two messages of a request
        (`addCacheBreakpoints`: `index > messages.length - 3`, on the last block of each,
        never on a thinking block; in the 1.0.x and 2.0.x sources), so a turn that adds more
        blocks than the lookback (simulator/prompt_cache.py) still reads the previous
        request's entry through the assistant message's marker. In ../shared/traces/
        claude-code: m-claude 3cfce0ff request 22 (2.0.x: thinking, 10 tool uses, 10
        results: 21 blocks) read the whole previous context, 65,114 of 65,126, and
        promptgrimoire request 229 (2.1.29) read the prompt 24 blocks back, exactly 20
        before its assistant message's last block; a lookback that skipped empty blocks
        would explain 3cfce0ff alone (4 of its 21 are empty results), not 229 (one). The
        two other turns of more than 20 blocks within the TTL (git-sync f82fa48e request 9,
        35 blocks; wakil 544fe3a7 request 13, 26) missed, as this rule has them miss too.
        The marker is placed only where the final one's lookback misses the previous
        request's final marker, or the view was just re-chained onto an older thinking
        mode's entries (`PrefixState.restored`): the prefix layout infers up to 3 markers
        (simulator/prefix.py) where the client's system prompt had at most 2, and 4 is the
        API's limit, so there the smallest prefix marker gives way; elsewhere the marker
        would only write what the final one writes too."""
        ids = view.ids
        last = self.pos.get(self.last_mark, -1)
        if not self.prefix.restored and (last < 0 or mark - last <= ANTHROPIC_LOOKBACK):
            return -1
        q = previous_message_end(ids, self.n_prefix, self.roles, self.kinds)
        return q if q < mark else -1

    def _compaction_call(self, k: int, out: Emitter, logged: LoggedCall) -> None:
        """The recording's compaction call before request k: the context request k - 1 sent
        (still the view: k is not synced yet), then what the call added to it (its logged
        input beyond that: the last response and the compaction prompt), with k - 1's TTL.
        Claude Code sends it through its fork helper with `skipCacheWrite` (compact.ts:
        the marker on the message before the prompt, which writes no entry of the fork's
        own), so the message marker goes on the parent's last item, as policies/base.py
        marks a fork, and what the call added is sent uncached.

        It is sent when the acompact file logged it (`Session.compaction_call_ms`), not at
        k's send: the two are as far apart as the summary took to write (minutes for a
        long one), and the call reads k - 1's entry only while that is alive."""
        parent = self.view
        if not parent.ids:
            return
        usage = logged.usage
        view = parent.copy()
        added = sum(usage[:4]) - view.total
        if added > 0:
            item = chain(self.ctx.root, (COMPACTION_TAIL_SALT << 16) ^ k)
            view.extend_items([-1], [item], [added])
        ttl = self.ctx.recorded_ttl[k - 1]
        last = len(parent.ids) - 1
        prefix = [Breakpoint(p, ttl) for p in self.marks if p < last]
        marks = [*prefix[-(MAX_BREAKPOINTS - 1) :], Breakpoint(last, ttl)]
        out.call(view, Call("compaction", RECORDED_CALL_STAGE, marks, usage[4], at_ms=logged.ms))

    def step(self, k: int, out: Emitter) -> None:
        logged = self.compaction_calls.get(k)
        if logged is not None:
            self._compaction_call(k, out, logged)
        self._sync(k)
        ttl = self.ctx.recorded_ttl[k]
        view: View = self.view
        if k == 0 and self.warm_start:
            for position in self.warm:
                out.warm(view, position, KEPT_WARM_MS)
            fork = self.ctx.session.fork
            if fork is not None and fork.block in self.pos:  # the parent's cache
                p = self.pos[fork.block]
                out.written(view, p, fork.sent_ms, fork.ttl_ms, fork.end_ms)
        for position in self.rewarm:
            out.warm(view, position, KEPT_WARM_MS)
        self.rewarm = []
        if self.warm_start:
            for position in self.prefix.warm_now:  # warm from elsewhere after an idle gap
                out.warm(view, position, ttl)
        if k in self.post_turn:  # the prompt suggestion sent when the turn ended
            p = self.pos.get(self.post_turn[k], -1)
            if p >= 0:
                out.written(view, p, self.ctx.ts_end[k - 1], self.ctx.recorded_ttl[k - 1])
        prefix_marks = self.marks_by_ttl.get(ttl)
        if prefix_marks is None:
            prefix_marks = self.marks_by_ttl[ttl] = [Breakpoint(p, ttl) for p in self.marks]
        mark = self._message_mark(k, view)
        before = self._previous_message_mark(view, mark)
        call = self.call
        if before < 0:
            call.breakpoints = [*prefix_marks, Breakpoint(mark, ttl)]
        else:
            kept = prefix_marks[-(MAX_BREAKPOINTS - 2) :] if MAX_BREAKPOINTS > 2 else []
            call.breakpoints = [*kept, Breakpoint(before, ttl), Breakpoint(mark, ttl)]
        self.last_mark = view.ids[mark]
        call.output_tokens = self.ctx.output[k]
        call.flags = {"overflow": True} if view.total > self.ctx.facts.window else {}
        out.call(view, call)


@register
class AsRecorded(Policy):
    name = "as-recorded"
    #: 2: the client's marker on the last two messages, and the entry the prompt
    #: suggestion writes when a turn ends (`post_turn_writes`). 3: a logged compaction
    #: call sent at its own logged time (`_compaction_call`).
    version = "3"
    defaults: ClassVar[dict[str, object]] = {"warm_start": True, "prefix_resets": True}
    declared: ClassVar[Declarations] = {"warm_start": WARM_START, "prefix_resets": PREFIX_RESETS}

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _State(ctx, self.params["warm_start"], self.params["prefix_resets"])
