"""`none`: no context management at all. The conversation grows until it no longer fits;
every request past the model's window is recorded as an overflow (replay goes on: the
recorded agent kept working). It states no limits (`SessionPolicy.limits` None): it has no
threshold, and it never refuses to send, so its only line is the window every chart draws
(a blocking limit of None is the window, simulator/policy.py `Limits`)."""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import CACHE_TTL, PREFIX_RESETS, ConversationSession
from simulator.params import Declarations, Param
from simulator.policy import Policy, SessionContext, SessionPolicy, register

#: Only the shared parameters (simulator/params.py).
PARAMS: dict[str, Param] = {"cache.ttl": CACHE_TTL, "prefix_resets": PREFIX_RESETS}


@register
class NoPolicy(Policy):
    name = "none"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {"cache.ttl": "recorded", "prefix_resets": True}
    declared: ClassVar[Declarations] = PARAMS

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return ConversationSession(ctx, self.params)
