"""`sliding-window`: the simplest baseline. Drop the oldest rounds; no LLM call.

The rule (a generic baseline, not any one harness; the same family as Letta's "evict the
oldest 30% of messages" and Cline's truncation, DESIGN.md section 5): when the view sent
to the model (system + tools prefix included) holds more than `trigger_fraction` (0.9) of
the model's context window, drop whole API-round groups from the oldest on
(`Conversation.groups()`: a response with the tool results that answer it, or a run of
user content, so a tool_use never loses its tool_result) until the view holds at most
`target_fraction` (0.6) of the window. The first group (the first user message: the
task) is never dropped while `keep_first` is on, and the newest group always stays.

Nothing is summarised: what is dropped is gone. Dropping changes the conversation right
after what is kept at its start, so the cache is written again from there on.
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import CACHE_TTL, MESSAGE_MARKS, PREFIX_RESETS, ConversationSession
from simulator.params import Declarations, Param, flag, fraction
from simulator.policy import (
    Emitter,
    Limits,
    Policy,
    PolicyError,
    SessionContext,
    SessionPolicy,
    register,
)


class SlidingWindowSession(ConversationSession):
    """One session's window: the thresholds in tokens and the number of truncations."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.trigger = int(params["trigger_fraction"] * self.window)
        self.target = int(params["target_fraction"] * self.window)
        self.keep_first = params["keep_first"]
        self.truncations = 0
        self.dropped_groups = 0

    def threshold_tokens(self) -> int:
        """The smallest view that is cut: groups go once the view holds more than
        `trigger_fraction` of the window (in whole tokens), so that + 1."""
        return self.trigger + 1

    def limits(self) -> Limits:
        """Dropping at `threshold_tokens` of the view; nothing refuses to send (the
        window)."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        total = conv.total()
        if total < self.threshold_tokens():
            return
        groups = conv.groups()
        bounds = [*groups, len(conv.items)]
        first = 1 if self.keep_first else 0
        g = first
        while g < len(groups) - 1 and total > self.target:
            total -= self.tokens(conv.items[bounds[g] : bounds[g + 1]])
            g += 1
        if g == first:
            return
        conv.replace_range(bounds[first], bounds[g], [], edit="window")
        self.truncations += 1
        self.dropped_groups += g - first


#: The baseline's parameters (simulator/params.py); values in `SlidingWindow.defaults`.
PARAMS: dict[str, Param] = {
    "trigger_fraction": fraction(
        "drop groups when the view holds more than this share of the window",
        "ours: a generic baseline (module docstring)",
        open_low=True,
    ),
    "target_fraction": fraction(
        "drop until the view holds at most this share of the window",
        "ours: a generic baseline (module docstring)",
        open_low=True,
    ),
    "keep_first": flag("the first group (the task) is never dropped", "ours: a generic baseline"),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class SlidingWindow(Policy):
    """Drop the oldest API-round groups above a share of the window (module docstring)."""

    name = "sliding-window"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "trigger_fraction": 0.9,
        "target_fraction": 0.6,
        "keep_first": True,
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        trigger = self.params["trigger_fraction"]
        target = self.params["target_fraction"]
        if not 0 < target <= trigger:
            raise PolicyError(
                "sliding-window: need 0 < target_fraction <= trigger_fraction "
                f"(got {target}, {trigger})"
            )

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return SlidingWindowSession(ctx, self.params)
