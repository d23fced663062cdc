"""Observation masking, as SWE-agent does it and as "The Complexity Trap" studies it.

SWE-agent (its `last_n_observations` history processor): keep the last n observations (tool
results) verbatim; older ones become a one-line placeholder ("Old environment output: (N
lines omitted)"); the first observation (the task's setup) is kept. It marks the last 2
messages with cache_control. Paper runs of SWE-agent use n = 5; Lindenbauer et al., "The
Complexity Trap" (2025) compare masking with M = 10 against LLM summarisation.
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import CACHE_TTL, MESSAGE_MARKS, PREFIX_RESETS, ConversationSession
from simulator.params import Declarations, Param, count, flag, tokens
from simulator.policy import Emitter, Limits, Policy, SessionContext, SessionPolicy, register

#: Tokens of the placeholder an old observation becomes.
PLACEHOLDER_TOKENS = 12
MASK_SALT = 0x3A5C
#: What `limits` states (one object: the engine asks before every request).
_NO_THRESHOLD = Limits(threshold=None)


class MaskingSession(ConversationSession):
    """One session's masking state: the observations in conversation order, kept as a
    running index so a request costs what entered since the last one, not a rescan of
    the whole conversation (a rescan made masking quadratic in the session's length:
    183 to 1,499 us a request from 1k- to 10k-request sessions, issue 16)."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.keep = params["keep_observations"]
        self.keep_first = params["keep_first_observation"]
        self.placeholder = params["placeholder_tokens"]
        self.masked: set[int] = set()
        #: The tool results of `conv.items[:seen]`, in order, as of `conv.epoch` `epoch`.
        self.observations: list[int] = []
        self.seen = 0
        self.epoch = -1
        #: How many of the oldest observations were masked already (they stay masked).
        self.done = 0

    def limits(self) -> Limits:
        """No token threshold: masking acts on the count of observations (every one past
        the newest `keep_observations`), whatever their size; nothing refuses to send (the
        window)."""
        return _NO_THRESHOLD

    def transform(self, k: int, out: Emitter) -> None:
        """Mask every observation but the newest `keep`. Items only append between epochs
        (policies/conversation.py `epoch`), so the observations are extended, and the
        ones masked before are a prefix of them; a rewind rebuilds both from the items."""
        conv = self.conv
        items = conv.items
        if conv.epoch != self.epoch:
            self.epoch = conv.epoch
            self.observations = [key for key in items if conv.is_tool_result(key)]
            self.seen = len(items)
            self.done = 0
        elif self.seen < len(items):
            self.observations += [key for key in items[self.seen :] if conv.is_tool_result(key)]
            self.seen = len(items)
        first = 1 if self.keep_first and self.observations else 0
        end = max(first, len(self.observations) - self.keep)
        for key in self.observations[max(first, self.done) : end]:
            if key not in self.masked:
                conv.mask(key, min(self.placeholder, conv.tokens[key]), MASK_SALT, edit="mask")
                self.masked.add(key)
        self.done = max(self.done, end)


#: The masking parameters (simulator/params.py); values in `Masking.defaults`.
PARAMS: dict[str, Param] = {
    "keep_observations": count(
        "newest observations (tool results) kept verbatim",
        "SWE-agent paper runs n = 5; The Complexity Trap M = 10 (module docstring)",
        unit="observations",
    ),
    "keep_first_observation": flag(
        "the first observation (the task's setup) is kept",
        "SWE-agent last_n_observations",
    ),
    "placeholder_tokens": tokens(
        "size of the one-line placeholder an old observation becomes",
        "SWE-agent: 'Old environment output: (N lines omitted)'",
    ),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


class Masking(Policy):
    defaults: ClassVar[dict[str, Any]] = {
        "keep_observations": 10,
        "keep_first_observation": True,
        "placeholder_tokens": PLACEHOLDER_TOKENS,
        "cache.message_marks": 2,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return MaskingSession(ctx, self.params)


@register
class SweAgent(Masking):
    """SWE-agent's paper runs: the last 5 observations kept."""

    name = "swe-agent"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {**Masking.defaults, "keep_observations": 5}


@register
class ComplexityTrapMasking(Masking):
    """ "The Complexity Trap", masking arm: M = 10."""

    name = "masking"
    version = "1"
