"""Aider: summarise the head of the chat history once it outgrows a small token budget.

Facts (aider's source: `aider/models.py`, `aider/history.py` `ChatSummary`,
`aider/prompts.py`; DESIGN.md section 5):

* Budget: `max_chat_history_tokens = min(max(max_input_tokens / 16, 1024), 8192)`, where
  `max_input_tokens` is the model's input limit (`--max-chat-history-tokens` overrides
  it). On a 200,000-token window: min(max(12,500, 1,024), 8,192) = 8,192.
* Trigger: the history is summarised when its tokens exceed the budget (`too_big`:
  total > max_tokens).
* Split: walking back from the newest message, the tail takes messages while it stays
  under half the budget (`tail_tokens + tokens < max_tokens // 2`); the head (everything
  before, ending with an assistant message) is summarised, the tail kept verbatim. The
  summariser sees at most the newest `max_input_tokens - 512` tokens of the head.
* The summary request is its own prompt: a system message (the `summarize` prompt, 175
  cl100k tokens) and one user message holding the head as text, sent to the weak model
  with no tools and no `cache_control`. Its answer, behind the prefix "I spoke to you
  previously about a number of things." (11 tokens), replaces the head as one user
  message.
* Aider re-summarises (summary + tail) while the result still exceeds the budget (at most
  3 levels, then everything); summarisation runs in a background thread after each
  exchange and is joined before the next request.
* Prompt caching is off unless `--cache-prompts` is given (it then marks the system
  prompt, the repo map / read-only files and the chat files).

What "history" means here: aider's chat history is only the conversation (its
`done_messages`); the repo map and the files added to the chat are sent separately and
never summarised. A replayed trace from another harness (Claude Code) has no repo map or
chat files: its whole conversation, tool calls and results included, is the "history",
and the recorded system + tools prefix stays as it is. Because Claude Code's tool results
are large next to an 8,192-token budget, the history is summarised every few requests.

Modelling choices (ours):

* The check runs before every recorded request (aider checks between exchanges; the
  replayed trace's requests are its exchanges).
* The split is at API-round groups (`Conversation.groups()`), never between a tool_use and
  its tool_result; the newest group (what the request answers) always stays in the tail,
  even when it alone is over half the budget (aider would summarise it too, but the
  replayed request still has to answer it). Nothing happens when the head is empty.
* One summary call per trigger (no recursion): its summary is capped at half the budget
  (`summary_cap_tokens`, default None = budget // 2), which is what ends aider's recursion
  in one step, and at the tokens it summarises. Its size is drawn from the compaction
  calibration (`policies/calibration/summary.py`, seeded `ctx.rng`; fitted to Claude
  Code's summaries: aider's own summary sizes are not measured), or fixed by
  `summary_tokens`. The call is priced at the session's model (aider uses its weak model),
  uncached and without the agent's prefix (`summary.with_prefix`, `summary.cached`).
* `cache.prompts` False (aider's default) sends every request uncached; True marks the
  system prefix and the last item.
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import CACHE_TTL, PREFIX_RESETS, SUMMARY_TOKENS, ConversationSession
from simulator.params import Declarations, Param, count, flag, fraction, tokens
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
SUMMARY_SALT = 0xA1DE


def history_budget(window: int, divisor: int = 16, low: int = 1_024, high: int = 8_192) -> int:
    """Aider's `max_chat_history_tokens`: min(max(window / divisor, low), high), in whole
    tokens (aider compares token counts against the float; the floor is equivalent)."""
    return int(min(max(window / divisor, low), high))


class AiderSession(ConversationSession):
    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=1, cache=params["cache.prompts"])
        fixed_budget = params["history.max_tokens_override"]
        self.budget = (
            int(fixed_budget)
            if fixed_budget is not None
            else history_budget(
                ctx.facts.window,
                params["history.divisor"],
                params["history.min_tokens"],
                params["history.max_tokens"],
            )
        )
        self.tail_limit = int(self.budget * params["tail_fraction"])
        if params["summary_cap_tokens"] is None:  # the base reads a set cap
            self.summary_cap = self.budget // 2
        self.prefix_tokens = params["summary.prefix_tokens"]
        self.prompt_tokens = params["summary.prompt_tokens"]
        self.input_limit = ctx.facts.window - params["summary.input_margin_tokens"]
        self.with_prefix = params["summary.with_prefix"]
        self.summary_cached = params["summary.cached"]
        self.summaries = 0

    def threshold_tokens(self) -> int:
        """The smallest history that is summarised: aider's `too_big` is total >
        max_chat_history_tokens, so the budget + 1. The history is the conversation
        without the system + tools prefix (module docstring), so on a chart of the whole
        view this line sits the prefix below the context it is compared with."""
        return self.budget + 1

    def limits(self) -> Limits:
        """Summarisation at `threshold_tokens` of history; aider refuses nothing itself
        (the window)."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        items = conv.items
        history = self.tokens(items)
        if history < self.threshold_tokens():
            return
        groups = conv.groups()
        if len(groups) < 2:
            return
        bounds = [*groups, len(items)]
        sizes = [self.tokens(items[bounds[g] : bounds[g + 1]]) for g in range(len(groups))]
        # The tail: whole groups from the newest while it stays under half the budget; the
        # newest group always.
        cut = len(groups) - 1
        tail = sizes[cut]
        while cut > 0 and tail + sizes[cut - 1] < self.tail_limit:
            cut -= 1
            tail += sizes[cut]
        if cut == 0:
            return
        head_tokens = sum(sizes[:cut])
        if head_tokens <= self.prefix_tokens:
            return  # a summary could not be smaller than what it replaces
        # What the summariser is sent: the newest groups of the head within its input limit.
        first = cut
        sent = 0
        while first > 0 and sent + sizes[first - 1] <= self.input_limit:
            first -= 1
            sent += sizes[first]
        size = self.summary_size(head_tokens)
        size = max(0, min(size, head_tokens - self.prefix_tokens))
        self.summary_call(
            out,
            k,
            items[bounds[first] : bounds[cut]],
            size,
            stage="summarize",
            prompt_tokens=self.prompt_tokens,
            with_prefix=self.with_prefix,
            cached=self.summary_cached,
        )
        summary = conv.add_synthetic(
            size + self.prefix_tokens, "summary", SUMMARY_SALT + self.summaries
        )
        conv.replace_range(0, bounds[cut], [summary])
        self.summaries += 1


#: Aider's parameters (simulator/params.py); values in `Aider.defaults`.
PARAMS: dict[str, Param] = {
    "history.divisor": count(
        "the history budget is the window divided by this (then clamped)",
        "aider/models.py: max_input_tokens / 16",
        low=1,
    ),
    "history.min_tokens": tokens("lower clamp of the history budget", "aider/models.py: 1,024"),
    "history.max_tokens": tokens("upper clamp of the history budget", "aider/models.py: 8,192"),
    "history.max_tokens_override": tokens(
        "a fixed history budget; null: computed from the window",
        "aider --max-chat-history-tokens (unset by default)",
        optional=True,
    ),
    "tail_fraction": fraction(
        "the verbatim tail stays under this share of the budget",
        "aider/history.py ChatSummary: max_tokens // 2",
        open_low=True,
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": tokens(
        "largest summary; null: half the budget (what ends aider's recursion)",
        "ours: one summary call per trigger (module docstring)",
        optional=True,
    ),
    "summary.prefix_tokens": tokens(
        "the prefix put before the summary",
        "aider/prompts.py: 'I spoke to you previously about a number of things.' (11)",
    ),
    "summary.prompt_tokens": tokens(
        "the summarize system prompt", "aider/prompts.py summarize: 175 cl100k tokens"
    ),
    "summary.input_margin_tokens": tokens(
        "the summariser sees at most the window minus this of the head",
        "aider/history.py: max_input_tokens - 512",
    ),
    "summary.with_prefix": flag(
        "the summary request sends the agent's system + tools prefix",
        "aider: the summary is its own prompt (module docstring)",
    ),
    "summary.cached": flag(
        "the summary request is marked for the prompt cache",
        "aider: no cache_control on the summary request (module docstring)",
    ),
    "cache.prompts": flag(
        "mark the system prefix and the last item for the prompt cache",
        "aider --cache-prompts (off by default)",
    ),
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class Aider(Policy):
    """Aider's chat-history summarisation (module docstring: facts and choices)."""

    name = "aider"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "history.divisor": 16,
        "history.min_tokens": 1_024,
        "history.max_tokens": 8_192,
        "history.max_tokens_override": None,  # --max-chat-history-tokens
        "tail_fraction": 0.5,  # the tail stays under max_tokens // 2
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": None,  # None: half the budget
        "summary.prefix_tokens": 11,  # "I spoke to you previously about a number of things."
        "summary.prompt_tokens": 175,  # prompts.summarize
        "summary.input_margin_tokens": 512,  # the head sent is capped at input limit - 512
        "summary.with_prefix": False,
        "summary.cached": False,
        "cache.prompts": False,  # --cache-prompts
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        fraction = self.params["tail_fraction"]
        if not 0 < fraction <= 1:
            raise PolicyError(f"aider: tail_fraction must be in (0, 1], got {fraction}")
        if self.params["history.divisor"] <= 0:
            raise PolicyError("aider: history.divisor must be > 0")

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return AiderSession(ctx, self.params)
