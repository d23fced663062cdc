"""LLM summarisation as "The Complexity Trap" runs it: summarise N turns, keep M verbatim.

Facts (Lindenbauer, Slinko, Felder, Bogomolov, Zharov, "The Complexity Trap: Simple
Observation Masking Is as Efficient as LLM Summarization for Agent Context Management",
DL4C at NeurIPS 2025, arXiv:2508.21433; its SWE-agent fork's `summarize_every_n_turns`
history processor, configuration `N=21_M=10`; DESIGN.md section 5):

* A turn is one (reasoning + action, observation) pair: one model response and the tool
  output answering it. The system prompt and the first user message (the task) are never
  summarised.
* Trigger: when at least N + M turns are not yet summarised, the oldest N of them are
  summarised and the newest (at least M) stay verbatim. The paper's runs use N = 21,
  M = 10.
* Rolling ("static checkpointing"): only the newest summary is kept, right after the task;
  the summary request's context is the previous checkpoint (or, the first time, the
  problem statement) plus the N turns, so each summary folds in the one before it.
* The summary is a separate query with its own system prompt (the summarising
  instructions) and no tools: it shares no cached prefix with the agent's requests, and
  nothing marks it for the cache (parameters `summary.with_prefix`, `summary.cached`).
* The agent's own requests carry `cache_control` on the last 2 messages (SWE-agent's
  cache-control history processor; `cache.message_marks`).

Modelling choices (ours):

* A turn is an API-round group of the conversation (`Conversation.groups()`: a response
  with the tool results that answer it, or a run of user content), so a tool_use is never
  separated from its tool_result; human messages in the middle of a session count as
  turns too.
* "The task" is the conversation's first group (parameter `keep_first`).
* The summary's size is drawn from the compaction calibration
  (`policies/calibration/summary.py`, seeded `ctx.rng`), clipped to `summary_cap_tokens` and
  to the tokens it summarises; `summary_tokens` fixes it instead. The call's output is the
  summary.
* One summarisation per request at most, as SWE-agent runs its history processors once per
  query.
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

#: Salt of the summary items' hashes (each summary adds its count).
SUMMARY_SALT = 0x5A3B


class LlmSummarySession(ConversationSession):
    """One session's summariser state: the live checkpoint and the summary count."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.n = params["summarize_turns"]
        self.m = params["keep_last_turns"]
        self.keep_first = params["keep_first"]
        self.prompt_tokens = params["prompt_tokens"]
        self.with_prefix = params["summary.with_prefix"]
        self.summary_cached = params["summary.cached"]
        #: The checkpoint item now in the conversation (None before the first summary).
        self.summary: int | None = None
        self.summaries = 0

    def limits(self) -> Limits:
        """No token threshold: summarisation fires on the number of unsummarised turns
        (N + M), whatever their size; nothing refuses to send (the window)."""
        return Limits(threshold=None)

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        items = conv.items
        groups = conv.groups()
        head = groups[1] if self.keep_first and len(groups) > 1 else 0
        if self.keep_first and len(groups) <= 1:
            return
        previous = self.summary
        # Unsummarised turns: the groups after the task, the checkpoint excluded.
        turns = [g for g in groups if g >= head and items[g] != previous]
        if len(turns) < self.n + self.m:
            return
        lo = turns[0]
        hi = turns[self.n] if len(turns) > self.n else len(items)
        chunk = [key for key in items[lo:hi] if key != previous]
        # The summary prompt's context: the previous checkpoint, else the task itself.
        # (A summary item only ever leaves by the next summary: a rewind removes history
        # blocks, never the policy's own items.)
        context = list(items[:head]) if previous is None else [previous]
        sources = [*context, *chunk]
        size = self.summary_size(self.tokens(sources))
        self.summary_call(
            out,
            k,
            sources,
            size,
            stage="summarize",
            prompt_tokens=self.prompt_tokens,
            with_prefix=self.with_prefix,
            cached=self.summary_cached,
        )
        summary = conv.add_synthetic(size, "summary", SUMMARY_SALT + self.summaries)
        rest = [key for key in items[hi:] if key != previous]
        new = [*(key for key in items[:head] if key != previous), summary, *rest]
        first_change = (i for i, (a, b) in enumerate(zip(items, new, strict=False)) if a != b)
        start = next(first_change, min(len(items), len(new)))
        conv.replace_range(start, len(items), new[start:])
        self.summary = summary
        self.summaries += 1


#: The summarisation arm's parameters (simulator/params.py); values in `LlmSummary.defaults`.
PARAMS: dict[str, Param] = {
    "summarize_turns": count(
        "N: turns summarised at once when N + M are not yet summarised",
        "The Complexity Trap (arXiv:2508.21433): N = 21",
        low=1,
        unit="turns",
    ),
    "keep_last_turns": count(
        "M: newest turns always kept verbatim",
        "The Complexity Trap (arXiv:2508.21433): M = 10",
        unit="turns",
    ),
    "keep_first": flag(
        "the first group (the task) is never summarised",
        "The Complexity Trap: the first user message is never summarised",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "prompt_tokens": tokens("the summarising instructions", "ours: an estimate"),
    "summary.with_prefix": flag(
        "the summary request sends the agent's system + tools prefix",
        "The Complexity Trap's fork: its own system prompt, no tools",
    ),
    "summary.cached": flag(
        "the summary request is marked for the prompt cache",
        "The Complexity Trap's fork: nothing marks it",
    ),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class LlmSummary(Policy):
    """ "The Complexity Trap", LLM-summary arm (module docstring: facts and choices)."""

    name = "llm-summary"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "summarize_turns": 21,  # N
        "keep_last_turns": 10,  # M
        "keep_first": True,
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "prompt_tokens": 500,
        "summary.with_prefix": False,
        "summary.cached": False,
        "cache.message_marks": 2,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        n, m = self.params["summarize_turns"], self.params["keep_last_turns"]
        if n <= 0 or m < 0:
            raise PolicyError(
                f"llm-summary: summarize_turns must be > 0 and keep_last_turns >= 0 (got {n}, {m})"
            )

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return LlmSummarySession(ctx, self.params)
