"""OpenHands' `LLMSummarizingCondenser`: a rolling summary of the forgotten middle.

Facts (OpenHands V0 `openhands/memory/condenser/impl/llm_summarizing_condenser.py` and the
software-agent SDK's `openhands/sdk/context/condenser/llm_summarizing_condenser.py`;
DESIGN.md section 5):

* Trigger: condense when the view holds more than `max_size` events (`len(view) >
  max_size`). The condenser's default is `max_size = 120`; the SDK's default agent builds it
  with 240 (parameter `max_size`).
* What stays: the first `keep_first = 4` events (the task) and the newest
  `max_size // 2 - keep_first - 1` events ("events_from_tail": the target size is half of
  `max_size`, minus the head, minus one slot for the summary). Everything between them is
  forgotten and replaced by one summary event, inserted right after the head
  (`summary_offset = keep_first`). The condenser refuses `keep_first >= max_size // 2`.
* Rolling: the previous summary sits at `summary_offset`, so it is in the forgotten range
  of the next condensation, and its text is passed to the summary prompt
  (`previous_summary`): each summary folds in the one before it.
* The condenser's request is a single user message (the summarising prompt with the
  previous summary and the forgotten events rendered as text), sent without the agent's
  system prompt or tools and without `cache_control`: it shares no cached prefix with the
  conversation and uses no prompt cache at all (parameters `condense.with_prefix`,
  `condense.cached`).
* Cut points: the SDK moves both ends of the forgotten range forward to the next
  "manipulation index" (`View.find_next_manipulation_index`) so that a tool call and its
  observation are never split; here that is the next API-round group start
  (`Conversation.groups()`).

Modelling choices (ours):

* An *event* is one item of the conversation: a block (a text, thinking, tool_use or
  tool_result block of the trace) or the policy's summary. OpenHands' events are coarser in
  places (one action event can carry a thought and a tool call), so with Claude Code traces
  the trigger fires somewhat earlier than OpenHands would on the same work.
* The summary's size is drawn from the compaction calibration
  (`policies/calibration/summary.py`, seeded `ctx.rng`), clipped to `summary_cap_tokens` and
  to the tokens it summarises; `summary_tokens` fixes it instead. The call's output is the
  summary itself (OpenHands keeps the whole response).
* Which message the conversation's own requests mark for the cache is a parameter
  (`cache.message_marks`, the last item by default).
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import (
    CACHE_TTL,
    MESSAGE_MARKS,
    PREFIX_RESETS,
    SUMMARY_CAP_TOKENS,
    SUMMARY_TOKENS,
    ConversationSession,
)
from policies.calibration.summary import SUMMARY_CAP
from simulator.params import Declarations, Param, count, flag, tokens
from simulator.policy import (
    Emitter,
    Limits,
    Policy,
    PolicyError,
    SessionContext,
    SessionPolicy,
    register,
)

#: Salt of the summary items' hashes (each condensation adds its count).
SUMMARY_SALT = 0x0C0D


class OpenHandsSession(ConversationSession):
    """One session's condenser state: the live summary item and the condensation count."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.max_size = params["max_size"]
        self.keep_first = params["keep_first"]
        self.prompt_tokens = params["prompt_tokens"]
        self.with_prefix = params["condense.with_prefix"]
        self.condense_cached = params["condense.cached"]
        #: The summary item now in the conversation (None before the first condensation).
        self.summary: int | None = None
        self.condensations = 0

    def limits(self) -> Limits:
        """No token threshold: the condenser fires on the number of events (more than
        `max_size`), whatever their size; nothing refuses to send (the window)."""
        return Limits(threshold=None)

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        items = conv.items
        n = len(items)
        if n <= self.max_size:
            return
        groups = conv.groups()
        tail = self.max_size // 2 - self.keep_first - 1
        start = next((g for g in groups if g >= self.keep_first), None)
        end = next((g for g in groups if g >= n - tail), None)
        if end is None:  # the newest group alone is longer than the tail: keep it whole
            end = groups[-1]
        if start is None or end <= start:
            return
        forgotten = items[start:end]
        previous = self.summary  # still in `items`: only a condensation removes it
        if all(key == previous for key in forgotten):
            return  # nothing but the old summary to forget: no progress possible
        # The summary prompt sees the previous summary (rolling) and every forgotten event.
        sources = forgotten if previous is None or previous in forgotten else [previous, *forgotten]
        pre_tokens = self.tokens(sources)
        size = self.summary_size(pre_tokens)
        self.summary_call(
            out,
            k,
            sources,
            size,
            stage="condense",
            prompt_tokens=self.prompt_tokens,
            with_prefix=self.with_prefix,
            cached=self.condense_cached,
        )
        summary = conv.add_synthetic(size, "summary", SUMMARY_SALT + self.condensations)
        kept = [key for key in items[:start] if key != previous]
        after = [summary, *(key for key in items[end:] if key != previous)]
        new = [*kept, *after]
        first_change = (i for i, (a, b) in enumerate(zip(items, new, strict=False)) if a != b)
        lo = next(first_change, min(n, len(new)))
        conv.replace_range(lo, n, new[lo:])
        self.summary = summary
        self.condensations += 1


#: The condenser's parameters (simulator/params.py); values in `OpenHands.defaults`.
PARAMS: dict[str, Param] = {
    "max_size": count(
        "condense when the view holds more than this many events",
        "OpenHands LLMSummarizingCondenser: 120 (the SDK's default agent: 240)",
        low=1,
        unit="events",
    ),
    "keep_first": count(
        "first events (the task) always kept",
        "OpenHands LLMSummarizingCondenser: 4",
        unit="events",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "prompt_tokens": tokens("the summarising prompt", "ours: an estimate"),
    "condense.with_prefix": flag(
        "the condenser request sends the agent's system + tools prefix",
        "OpenHands: a single user message, no system prompt or tools",
    ),
    "condense.cached": flag(
        "the condenser request is marked for the prompt cache",
        "OpenHands: no cache_control on the condenser request (DESIGN.md 5)",
    ),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class OpenHands(Policy):
    """OpenHands' LLMSummarizingCondenser (module docstring: facts and choices)."""

    name = "openhands"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "max_size": 120,
        "keep_first": 4,
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "prompt_tokens": 500,
        "condense.with_prefix": False,
        "condense.cached": False,
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        max_size, keep_first = self.params["max_size"], self.params["keep_first"]
        if keep_first < 0 or max_size // 2 - keep_first - 1 <= 0:
            raise PolicyError(
                f"openhands: keep_first ({keep_first}) must be >= 0 and less than "
                f"max_size // 2 ({max_size // 2}) to leave room for condensation"
            )

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return OpenHandsSession(ctx, self.params)
