"""`gemini-cli`: Gemini CLI's chat compression (DESIGN.md section 5).

Facts (Gemini CLI, `ChatCompressionService`):

* Trigger: compress when the prompt's token count reaches compression_threshold x the
  model's token limit; the threshold is 0.5 (older versions: 0.7, the same parameter).
* Before summarising, tool output is cut to a budget: walking from the newest message back,
  function responses are kept whole while their running total stays within 50,000 tokens;
  once over, older large responses are truncated to their last 30 lines (the full output
  is saved to a file), and the truncated form counts towards the budget.
* The newest 30% of the history is kept verbatim; the rest is summarised.
* Two LLM calls: the summary (a `<state_snapshot>`), then a self-check that sends the same
  history, the summary as the model's answer and a request to critically evaluate it and
  emit a final, improved snapshot (or repeat it unchanged).
* Both calls go through a utility client with the compression prompt as the system
  instruction and no tools: they do not share the main conversation's prefix. The second
  call repeats the first one's history, so it can read what the first one cached.
* The new history is the final summary (a user message), a short model acknowledgement
  ("Got it. Thanks for the additional context!") and the kept 30%.
* Caching: Gemini models use implicit caching. The replay engine picks the cache model by
  the recorded model's provider, so on Claude traces the Anthropic cache applies; the
  policy marks one message breakpoint (the last item).

Modelling choices (ours): a truncated output becomes a placeholder of `truncate_lines` x
`tokens_per_line` tokens (30 x 12 = 360) via `Conversation.mask`; outputs no larger than
that are left as they are. The kept 30% is measured in tokens and starts at an API-round
group boundary (`split_at` "group"), which never separates a tool_use from its
tool_result; `split_at` "user" cuts only where a human message starts, as Gemini CLI's
`findCompressSplitPoint` does with its user messages. The boundary is the first one at
which at least 70% of the history lies before it; without one, the last boundary (the turn
in progress is always kept). The self-check's output is taken to be as long as the first
summary (one draw from the calibration, policies/calibration/summary.py, with the
session's seeded rng, unless `summary_tokens` fixes it). Not modelled: the check that
discards a compression that would grow the history (it cannot happen at these summary
sizes), and newer versions sending the untruncated head to the summariser when it fits.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from policies.base import (
    CACHE_TTL,
    MESSAGE_MARKS,
    PREFIX_RESETS,
    SUMMARY_CAP_TOKENS,
    SUMMARY_TOKENS,
    WARM_START,
    ConversationSession,
)
from policies.calibration.summary import SUMMARY_CAP
from simulator.model import Flag
from simulator.params import Declarations, Param, choice, count, flag, fraction, tokens
from simulator.policy import Emitter, Limits, Policy, SessionContext, SessionPolicy, register

#: Fraction of the model's token limit at which Gemini CLI compresses (older: 0.7).
COMPRESSION_THRESHOLD = 0.5
#: Fraction of the history (newest) kept verbatim.
PRESERVE_FRACTION = 0.3
#: Newest tool-output tokens kept whole before older outputs are truncated.
TOOL_OUTPUT_BUDGET = 50_000
#: A truncated tool output keeps its last this many lines ...
TRUNCATE_LINES = 30
#: ... of about this many tokens each (our assumption).
TOKENS_PER_LINE = 12
#: Approximate tokens of the compression system instruction (getCompressionPrompt).
SYSTEM_PROMPT_TOKENS = 1_000
#: Approximate tokens of the user instruction of the summary call and of the self-check.
SUMMARY_INSTRUCTION_TOKENS = 40
VERIFY_INSTRUCTION_TOKENS = 70
#: "Got it. Thanks for the additional context!"
ACK_TOKENS = 9
#: Salts of the items this policy makes or rewrites (stable hashes: determinism).
TRUNCATE_SALT = 0x6E31
DRAFT_SALT = 0x6E32
SUMMARY_SALT = 0x6E33
ACK_SALT = 0x6E34

SPLIT_MODES = ("group", "user")


class GeminiCliSession(ConversationSession):
    """Gemini CLI's compression rule over the shared conversation mechanics."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.fraction = float(params["compression_threshold"])
        self.preserve = params["preserve_fraction"]
        if not 0.0 < self.preserve < 1.0:
            raise ValueError(f"preserve_fraction must be in (0, 1), not {self.preserve}")
        self.budget = params["tool_output_budget_tokens"]
        self.placeholder = params["truncate_lines"] * params["tokens_per_line"]
        self.split_at = params["split_at"]
        if self.split_at not in SPLIT_MODES:
            raise ValueError(f"split_at must be one of {SPLIT_MODES}, not {self.split_at!r}")
        self.system_tokens = params["system_prompt_tokens"]
        self.summary_instruction = params["summary_instruction_tokens"]
        self.verify_instruction = params["verify_instruction_tokens"]
        self.ack_tokens = params["ack_tokens"]
        self.with_prefix = params["send_main_prefix"]
        self.compressions = 0

    def threshold_tokens(self) -> int:
        """The smallest estimate that compresses: Gemini CLI compresses once the count
        reaches compression_threshold x the window, so the ceiling of that product (the
        same test for a whole-token count)."""
        return math.ceil(self.fraction * self.window)

    def limits(self) -> Limits:
        """Compression at `threshold_tokens` of the harness estimate; no refusal of its own
        (the window)."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        if not self.conv.items or self.estimate(k) < self.threshold_tokens():
            return
        self.compress(k, out)

    def compress(self, k: int, out: Emitter) -> None:
        conv = self.conv
        cuts = self.truncation_plan()
        split = self.split_point(cuts)
        if split <= 0:
            return  # nothing older than the kept part: Gemini CLI changes nothing
        for key in cuts:
            conv.mask(key, self.placeholder, TRUNCATE_SALT, edit="truncate")
        head = conv.items[:split]
        kept = conv.items[split:]
        summary = self.summary_size(self.tokens(head))
        self.summary_call(
            out,
            k,
            head,
            summary,
            stage="compress",
            prompt_tokens=self.system_tokens + self.summary_instruction,
            with_prefix=self.with_prefix,
        )
        draft = conv.add_synthetic(summary, "summary", DRAFT_SALT)
        self.summary_call(
            out,
            k,
            [*head, draft],
            summary,
            stage="verify",
            prompt_tokens=self.system_tokens + self.verify_instruction,
            with_prefix=self.with_prefix,
        )
        final = conv.add_synthetic(summary, "summary", SUMMARY_SALT)
        keys = [final]
        if self.ack_tokens:
            keys.append(conv.add_synthetic(self.ack_tokens, "summary", ACK_SALT))
        conv.replace_all([*keys, *kept])
        self.compressions += 1

    def truncation_plan(self) -> list[int]:
        """Tool results to truncate: walking from the newest, outputs are kept while the
        running total stays within the budget; past it, outputs larger than the placeholder
        are cut and count at their cut size (outputs cut before are that size already)."""
        conv = self.conv
        used = 0
        cuts: list[int] = []
        for key in reversed(conv.items):
            if not conv.is_tool_result(key):
                continue
            size = conv.sent(key)[1]
            if used + size <= self.budget or size <= self.placeholder:
                used += size
                continue
            cuts.append(key)
            used += self.placeholder
        return cuts

    def split_point(self, cuts: list[int]) -> int:
        """Index of the first kept item: the first allowed boundary with at least
        (1 - preserve) of the history's tokens before it, else the last allowed one."""
        conv = self.conv
        items = conv.items
        cut = set(cuts)
        sizes = [self.placeholder if key in cut else conv.sent(key)[1] for key in items]
        target = (1.0 - self.preserve) * sum(sizes)
        starts = conv.groups()
        if self.split_at == "user":
            starts = [i for i in starts if items[i] >= 0 and conv.flags[items[i]] & int(Flag.HUMAN)]
        before = 0
        last = 0
        at = 0
        for i in starts:
            before += sum(sizes[at:i])
            at = i
            if i == 0:
                continue
            if before >= target:
                return i
            last = i
        return last


#: Gemini CLI's parameters (simulator/params.py); values in `GeminiCli.defaults`.
PARAMS: dict[str, Param] = {
    "compression_threshold": fraction(
        "compress when the prompt reaches this share of the model's token limit",
        "Gemini CLI ChatCompressionService: 0.5 (older versions 0.7)",
        open_low=True,
    ),
    "preserve_fraction": fraction(
        "share of the history (newest) kept verbatim",
        "Gemini CLI ChatCompressionService: 30%",
    ),
    "tool_output_budget_tokens": tokens(
        "newest tool-output tokens kept whole before older outputs are truncated",
        "Gemini CLI ChatCompressionService: 50,000",
    ),
    "truncate_lines": count(
        "a truncated tool output keeps its last this many lines",
        "Gemini CLI ChatCompressionService: 30 lines",
        unit="lines",
    ),
    "tokens_per_line": tokens(
        "tokens of one kept line of a truncated output",
        "ours: an assumption (module docstring)",
        unit="tokens per line",
    ),
    "split_at": choice(
        SPLIT_MODES,
        "where the kept share starts: an API-round group or a human message",
        "ours: group; user is findCompressSplitPoint's rule (module docstring)",
    ),
    "system_prompt_tokens": tokens(
        "the compression system instruction", "ours: an estimate of getCompressionPrompt"
    ),
    "summary_instruction_tokens": tokens(
        "user instruction of the summary call", "ours: an estimate"
    ),
    "verify_instruction_tokens": tokens(
        "user instruction of the self-check call", "ours: an estimate"
    ),
    "ack_tokens": tokens(
        "the model's acknowledgement after the summary",
        "Gemini CLI: 'Got it. Thanks for the additional context!'",
    ),
    "send_main_prefix": flag(
        "the compression calls send the agent's system + tools prefix",
        "Gemini CLI: a utility client with its own system instruction, no tools",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
    "warm_start": WARM_START,
}


@register
class GeminiCli(Policy):
    """Gemini CLI: compress at `compression_threshold` x window (0.5; 0.7 in older
    versions), keeping the newest 30% after a summary and a self-check call."""

    name = "gemini-cli"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "compression_threshold": COMPRESSION_THRESHOLD,  # 0.7 for older versions
        "preserve_fraction": PRESERVE_FRACTION,
        "tool_output_budget_tokens": TOOL_OUTPUT_BUDGET,
        "truncate_lines": TRUNCATE_LINES,
        "tokens_per_line": TOKENS_PER_LINE,
        "split_at": "group",  # "group" (API-round boundary) or "user" (a human message)
        "system_prompt_tokens": SYSTEM_PROMPT_TOKENS,
        "summary_instruction_tokens": SUMMARY_INSTRUCTION_TOKENS,
        "verify_instruction_tokens": VERIFY_INSTRUCTION_TOKENS,
        "ack_tokens": ACK_TOKENS,
        "send_main_prefix": False,  # the compression calls have their own system prompt
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
        "warm_start": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return GeminiCliSession(ctx, self.params)
