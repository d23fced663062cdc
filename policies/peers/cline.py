"""Cline's conversation truncation: drop half (or three quarters) of the middle; no LLM call.

Facts (Cline, `src/core/context/context-management/ContextManager.ts` and
`context-window-utils.ts`; DESIGN.md section 5):

* Limit: `maxAllowedSize` = window - 40,000 for 200k-token models (64k: - 27,000; 128k:
  - 30,000; other windows: max(window - 40,000, 0.8 x window)). Parameter
  `reserve_tokens`: the reserve for every window, or None for that table.
* Trigger: before a request, the previous request's usage (input + output + cache writes +
  cache reads) >= `maxAllowedSize`. No check before the first request.
* Truncation (`getNextTruncationRange`): the first user/assistant pair (messages 0 and 1)
  is always kept; of the messages after it (after what earlier truncations removed: the
  deleted range only grows), the oldest half is removed ("half"), or three quarters
  ("quarter") when halving is not enough. Cline picks "quarter" when `totalTokens / 2 >
  maxAllowedSize`, i.e. when half the context would still be over the limit. Counts are
  rounded down to whole user/assistant pairs, and the removed range ends on an assistant
  message so that the user/assistant alternation holds.
* No summary, no LLM call: what is removed is gone from the model's view. Everything after
  the kept pair changes, so the cache is written again from there on.
* Cline's Anthropic provider marks the last two user messages for the cache.

Modelling choices (ours):

* Cline counts messages; here the unit is an API-round group (`Conversation.groups()`: a
  response with the tool results that answer it, or a run of user content), which is one
  assistant message plus the user message answering it, i.e. one of Cline's pairs, and
  never separates a tool_use from its tool_result. The first pair is the first
  `keep_first_groups` = 2 groups (the first user message and the first response). Half
  removes floor(n / 2) of the n later groups, three quarters floor(3 n / 4)
  (`truncate_fraction`, `truncate_fraction_more`); the newest group always stays.
* When is half "not enough"? `quarter_rule` "fit" (default): when the view after removing
  half would still be at or above the limit; "halved": Cline's own test, the previous
  usage / 2 > limit (an estimate of the same thing that assumes tokens spread evenly).
* `trigger` "last_usage" (Cline) compares the previous simulated request's context plus
  its output; "context" compares the view about to be sent.
* Not modelled: Cline's earlier optimisation that replaces repeated reads of one file by a
  notice, and the truncation notice it appends to the first assistant message (the kept
  pair is sent unchanged here).
* The two marks sit on the last two items (`cache.message_marks`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import CACHE_TTL, MESSAGE_MARKS, PREFIX_RESETS, ConversationSession
from simulator.params import Declarations, Param, choice, count, fraction, tokens
from simulator.policy import (
    Emitter,
    Limits,
    Policy,
    PolicyError,
    SessionContext,
    SessionPolicy,
    register,
)

#: Cline's `getContextWindowInfo`: window -> reserve below it, for the windows it names.
RESERVES = {64_000: 27_000, 128_000: 30_000, 200_000: 40_000}
#: For other windows: max(window - DEFAULT_RESERVE, MIN_SHARE x window).
DEFAULT_RESERVE = 40_000
MIN_SHARE = 0.8


def max_allowed(window: int, reserve: int | None) -> int:
    """Cline's `maxAllowedSize` for a window (a fixed `reserve`, or Cline's table)."""
    if reserve is not None:
        return window - reserve
    if window in RESERVES:
        return window - RESERVES[window]
    return max(window - DEFAULT_RESERVE, int(MIN_SHARE * window))


class ClineSession(ConversationSession):
    """One session's truncation state: the limit and what each truncation removed."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        reserve = params["reserve_tokens"]
        self.limit = max_allowed(self.window, None if reserve is None else int(reserve))
        self.keep = params["keep_first_groups"]
        self.half = params["truncate_fraction"]
        self.more = params["truncate_fraction_more"]
        self.quarter_rule = params["quarter_rule"]
        self.trigger = params["trigger"]
        #: (request, groups removed, fraction used) per truncation.
        self.truncations: list[tuple[int, int, float]] = []

    def threshold_tokens(self) -> int:
        """The smallest count that truncates: `maxAllowedSize` (Cline truncates at
        usage >= it), in the units `trigger` compares (the last usage + output, or the
        view)."""
        return self.limit

    def limits(self) -> Limits:
        """Cline truncates at `maxAllowedSize` and never refuses to send (the window)."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        if self.trigger == "context":
            used = conv.total()
        elif self.last_total is None:
            return  # Cline checks the previous request's usage: none before the first
        else:
            used = self.last_total + self.last_output
        if used < self.threshold_tokens():
            return
        groups = conv.groups()
        rest = len(groups) - self.keep
        if rest <= 0:
            return
        bounds = [*groups, len(conv.items)]
        fraction = self.half
        drop = int(rest * fraction)
        if self.quarter_rule == "halved":
            over = used / 2 > self.limit
        else:
            freed = self.tokens(conv.items[bounds[self.keep] : bounds[self.keep + drop]])
            over = conv.total() - freed >= self.limit
        if over:
            fraction = self.more
            drop = int(rest * fraction)
        drop = min(drop, rest - 1)
        if drop <= 0:
            return
        conv.replace_range(bounds[self.keep], bounds[self.keep + drop], [], edit="truncate")
        self.truncations.append((k, drop, fraction))


#: Cline's parameters (simulator/params.py); values in `Cline.defaults`.
PARAMS: dict[str, Param] = {
    "reserve_tokens": tokens(
        "limit = window - this reserve; null: Cline's table (40,000 on 200k)",
        "Cline context-window-utils.ts maxAllowedSize",
        optional=True,
    ),
    "keep_first_groups": count(
        "API-round groups at the start always kept (the first user/assistant pair)",
        "Cline ContextManager.ts: messages 0 and 1 kept",
        unit="groups",
    ),
    "truncate_fraction": fraction(
        "share of the later groups a truncation removes",
        "Cline getNextTruncationRange: half",
        open_low=True,
    ),
    "truncate_fraction_more": fraction(
        "share removed when half is not enough",
        "Cline getNextTruncationRange: three quarters",
        open_low=True,
    ),
    "quarter_rule": choice(
        ("fit", "halved"),
        "when half is not enough: fit (the view would still be over) or halved (usage / 2)",
        "ours: fit; halved is Cline's own estimate of the same (module docstring)",
    ),
    "trigger": choice(
        ("last_usage", "context"),
        "what is compared with the limit: the last usage + output, or the view to send",
        "Cline ContextManager.ts: the previous request's usage",
    ),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class Cline(Policy):
    """Cline's truncation of half / three quarters of the conversation (module docstring)."""

    name = "cline"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "reserve_tokens": None,  # None: Cline's table (40,000 for a 200k window)
        "keep_first_groups": 2,
        "truncate_fraction": 0.5,
        "truncate_fraction_more": 0.75,
        "quarter_rule": "fit",
        "trigger": "last_usage",
        "cache.message_marks": 2,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p["quarter_rule"] not in ("fit", "halved"):
            raise PolicyError(
                f"cline: quarter_rule must be fit or halved, not {p['quarter_rule']!r}"
            )
        if p["trigger"] not in ("last_usage", "context"):
            raise PolicyError(f"cline: trigger must be last_usage or context, not {p['trigger']!r}")
        if not 0 < p["truncate_fraction"] <= p["truncate_fraction_more"] < 1:
            raise PolicyError("cline: need 0 < truncate_fraction <= truncate_fraction_more < 1")
        if p["keep_first_groups"] < 0:
            raise PolicyError("cline: keep_first_groups must be >= 0")

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return ClineSession(ctx, self.params)
