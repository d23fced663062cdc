"""Anthropic's API server-side compaction: the `compact_20260112` context-management edit.

Facts (Anthropic, "Compaction", platform.claude.com/docs/en/build-with-claude/compaction,
beta header `compact-2026-01-12`, edit type `compact_20260112`; DESIGN.md section 5). This
module models that version:

* `trigger`: compaction starts when the request's input tokens exceed the threshold
  (default 150,000 input tokens; at least 50,000).
* The API then, within the same request: generates a summary of the current
  conversation, creates a `compaction` block holding it, and continues the response from
  the compacted context. The summarisation is an extra sampling step, billed on its own
  (it is reported in `usage.iterations`).
* On later requests the client appends the response (compaction block included) as usual
  and the API drops every message block before the compaction block: what is processed
  is the system prompt and tools, the compaction block, and what followed it.
* `instructions` replaces the default summarisation prompt; `pause_after_compaction`
  returns right after the compaction block so the client can add content (not modelled:
  default false).
* Prompt caching works as usual; the documentation advises a cache breakpoint on the
  system prompt so that it survives compactions (everything after it changes).

Modelling choices (ours):

* The trigger compares the request's input as the API processes it (system, tools and
  the messages from the last compaction block on), before the request is sent.
* The summarisation step is a call of its own (stage `server-compact`): the request as
  the client sent it (with its cache marker on its last block) plus the summarisation
  prompt (`instructions_tokens`; the default prompt's size is our estimate), so it reads
  the conversation's cached prefix. Its output is the summary.
* The response step of the same request then processes the system prefix and the
  compaction block only: the client's marker sat on a dropped block, so only the system
  markers apply and nothing new is written; the next request (compaction block, the
  response, new blocks, marker at its end) writes them.
* A compaction whose summarisation input would exceed the window is not attempted (the
  API would refuse the prompt): the request is sent as it is and counts as an overflow.
* The summary's size is drawn from the compaction calibration (`policies/calibration/
  summary.py`, seeded `ctx.rng`; fitted to Claude Code's summaries, the closest measured
  data), capped at `summary_cap_tokens` and at the tokens it summarises;
  `summary_tokens` fixes it.
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
from simulator.params import Declarations, Param, tokens
from simulator.policy import (
    Emitter,
    Limits,
    Policy,
    PolicyError,
    SessionContext,
    SessionPolicy,
    register,
)
from simulator.view import Breakpoint, View

#: The API refuses a smaller trigger.
MIN_TRIGGER_TOKENS = 50_000
#: Salt of the compaction blocks' hashes (each compaction adds its count).
SUMMARY_SALT = 0xC0A1


class ServerCompactionSession(ConversationSession):
    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.trigger: int = params["trigger_tokens"]
        self.instructions = params["instructions_tokens"]
        self.compactions = 0
        #: The request now being sent was compacted: its response step has no message marker.
        self.compacted_now = False

    def threshold_tokens(self) -> int:
        """The smallest input that compacts: compaction starts once the input tokens
        exceed `trigger_tokens`, so that + 1."""
        return self.trigger + 1

    def limits(self) -> Limits:
        """Compaction at `threshold_tokens` of the input as the API processes it; the
        API's only refusal is the window's."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        self.compacted_now = False
        conv = self.conv
        total = conv.total()
        if total < self.threshold_tokens() or total + self.instructions > self.window:
            return
        items = list(conv.items)
        before = self.tokens(items)
        size = self.summary_size(before)
        size = max(0, min(size, before))
        self.summary_call(
            out,
            k,
            items,
            size,
            stage="server-compact",
            prompt_tokens=self.instructions,
        )
        block = conv.add_synthetic(size, "summary", SUMMARY_SALT + self.compactions)
        conv.replace_all([block])
        self.compactions += 1
        self.compacted_now = True

    def breakpoints(self, view: View, ttl: int, *, fork: bool = False) -> list[Breakpoint]:
        if self.compacted_now and not fork:
            last = len(view.ids) - 1
            return [Breakpoint(p, ttl) for p in self.conv.marks if p <= last][-4:]
        return super().breakpoints(view, ttl, fork=fork)


#: The edit's parameters (simulator/params.py); values in `AnthropicServerCompaction.defaults`.
PARAMS: dict[str, Param] = {
    "trigger_tokens": tokens(
        "compaction starts when the request's input tokens exceed this",
        "Anthropic compaction compact_20260112: trigger default 150,000 (at least 50,000)",
        low=MIN_TRIGGER_TOKENS,
    ),
    "instructions_tokens": tokens(
        "the summarisation prompt of the compaction step",
        "ours: an estimate of the default prompt's size",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class AnthropicServerCompaction(Policy):
    """`compact_20260112` (module docstring: facts and choices)."""

    name = "anthropic-server-compaction"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "trigger_tokens": 150_000,  # trigger: input_tokens
        "instructions_tokens": 150,  # the summarisation prompt (ours: an estimate)
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        trigger = self.params["trigger_tokens"]
        if trigger < MIN_TRIGGER_TOKENS:
            raise PolicyError(
                f"anthropic-server-compaction: trigger_tokens must be >= {MIN_TRIGGER_TOKENS:,}"
                f" (the API's minimum), got {trigger:,}"
            )

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return ServerCompactionSession(ctx, self.params)
