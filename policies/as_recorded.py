"""`as-recorded`: send exactly what the recording agent sent.

The recording's own compactions are replayed as they happened (its summaries are in the
view, what they replaced is not), restored attachments are there as the INJECTED blocks
sized from the recorded usage, and each request's cache entries take the TTL that request
recorded. Replaying under this policy is how the cost model is checked against reality
(`ctxsim fidelity`).
"""

from __future__ import annotations

from typing import ClassVar

from simulator.policy import Call, Emitter, Policy, SessionContext, SessionPolicy, register
from simulator.prefix import infer, start_view
from simulator.prompt_cache import Breakpoint
from simulator.view import View

#: A shared prefix warmed by other sessions is taken to stay warm: far longer than any TTL.
KEPT_WARM_MS = 10 * 365 * 24 * 3600 * 1000


class _State(SessionPolicy):
    def __init__(self, ctx: SessionContext, warm_start: bool) -> None:
        self.ctx = ctx
        self.schedule = ctx.history.recorded
        self.hashes = ctx.history.hashes
        self.tokens = ctx.history.tokens
        prefix = infer(ctx.session)
        self.view, self.shared_pos, self.system_pos = start_view(ctx.root, prefix)
        self.pos: dict[int, int] = {}
        self.warm_start = warm_start

    def _sync(self, k: int) -> None:
        view, pos = self.view, self.pos
        leaving = [pos.pop(b) for b in self.schedule.leave[k] if b in pos]
        if leaving:
            leaving.sort()
            view.remove(leaving)
            first = leaving[0]
            for i in range(first, len(view)):
                pos[view.ids[i]] = i
        hashes, tokens = self.hashes, self.tokens
        for b in self.schedule.enter[k]:
            pos[b] = len(view)
            view.append(b, hashes[b], tokens[b])

    def step(self, k: int, out: Emitter) -> None:
        self._sync(k)
        ttl = self.ctx.recorded_ttl[k]
        view: View = self.view
        if k == 0 and self.warm_start and self.shared_pos >= 0:
            out.warm(view, self.shared_pos, KEPT_WARM_MS)
        breakpoints = [Breakpoint(self.system_pos, ttl), Breakpoint(len(view) - 1, ttl)]
        out.call(view, Call("request", "", breakpoints, self.ctx.output[k]))


@register
class AsRecorded(Policy):
    name = "as-recorded"
    version = "1"
    defaults: ClassVar[dict[str, object]] = {"warm_start": True}

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _State(ctx, bool(self.params["warm_start"]))
