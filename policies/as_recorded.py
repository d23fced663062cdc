"""`as-recorded`: send exactly what the recording agent sent.

The recording's own compactions are replayed as they happened (its summaries are in the
view, what they replaced is not), restored attachments are there as the INJECTED blocks
sized from the recorded usage, and each request's cache entries take the TTL that request
recorded. Replaying under this policy is how the cost model is checked against reality
(`ctxsim fidelity`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from policies.base import KEPT_WARM_MS
from simulator.model import NEVER, Flag
from simulator.policy import Call, Emitter, Policy, SessionContext, SessionPolicy, register
from simulator.prefix import PrefixState, infer
from simulator.view import Breakpoint, View


class _State(SessionPolicy):
    def __init__(self, ctx: SessionContext, warm_start: bool, resets: bool) -> None:
        self.ctx = ctx
        self.schedule = ctx.history.recorded
        self.hashes = ctx.history.hashes
        self.tokens = ctx.history.tokens
        self.prefix = PrefixState(ctx.root, infer(ctx.session, resets=resets))
        self.view, self.warm, self.marks = self.prefix.start_view()
        self.n_prefix = len(self.view)
        self.pos: dict[int, int] = {}
        blocks = ctx.session.blocks
        self.stripped = set(np.nonzero(blocks["flags"] & Flag.STRIPPED)[0].tolist())
        self.hidden: list[int] = blocks["hidden_from"].tolist()
        self.compacted: list[int] = blocks["compacted_at"].tolist()
        self.removed_later: dict[int, list[int]] = {}
        self.warm_start = warm_start
        self.marks_by_ttl: dict[int, list[Breakpoint]] = {}
        #: One Call reused for every request: the engine reads it at once, keeps nothing.
        self.call = Call("request", "", [], 0)

    def _sync(self, k: int) -> None:
        if self.prefix.reset(k):  # the client changed its unlogged context: re-chain
            blocks = self.view.items(self.n_prefix)
            self.view, _, _ = self.prefix.start_view()
            self.view.extend(blocks)
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

    def step(self, k: int, out: Emitter) -> None:
        self._sync(k)
        ttl = self.ctx.recorded_ttl[k]
        view: View = self.view
        if k == 0 and self.warm_start:
            for position in self.warm:
                out.warm(view, position, KEPT_WARM_MS)
        prefix_marks = self.marks_by_ttl.get(ttl)
        if prefix_marks is None:
            prefix_marks = self.marks_by_ttl[ttl] = [Breakpoint(p, ttl) for p in self.marks]
        call = self.call
        call.breakpoints = [*prefix_marks, Breakpoint(len(view.ids) - 1, ttl)]
        call.output_tokens = self.ctx.output[k]
        call.flags = {"overflow": True} if view.total > self.ctx.facts.window else {}
        out.call(view, call)


@register
class AsRecorded(Policy):
    name = "as-recorded"
    version = "1"
    defaults: ClassVar[dict[str, object]] = {"warm_start": True, "prefix_resets": True}

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _State(ctx, bool(self.params["warm_start"]), bool(self.params["prefix_resets"]))
