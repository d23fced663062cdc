"""Goose: compact at 80% of the window into a summary plus the latest user message.

Facts (goose's source, `crates/goose/src/context_mgmt/mod.rs`, `agents/agent.rs`,
`providers/formats/anthropic.rs`; DESIGN.md section 5):

* Trigger: `check_if_compaction_needed` compares the session's token count (the last
  provider usage, input + output; a tokenizer estimate when there is none) with the
  context limit: compaction when tokens / limit > `GOOSE_AUTO_COMPACT_THRESHOLD` (default
  0.8; a value <= 0 or >= 1 turns it off). It runs when a user message arrives (`reply`),
  not before each request of the tool loop.
* Recovery: a request refused for exceeding the context (`ContextLengthExceeded`) is
  compacted and retried; a second refusal in a row ends the turn.
* Compaction (`compact_messages`): one summarisation request (`complete_fast`) whose
  system prompt is the `compaction.md` template holding the whole agent-visible
  conversation as text, with one user message ("Please summarize the conversation
  history provided in the system prompt.") and no tools: it shares no prefix with the
  agent's requests. If that request is itself too long, tool responses are removed from
  the middle out (10%, 20%, 50%, then 100% of them) and it is retried.
* After compaction the model sees: the summary (a user message), an assistant
  continuation message ("Your context was compacted. ...", 44 cl100k tokens), and a
  fresh copy of the most recent user message that is text only (no tool content). The
  originals stay visible to the user only.
* Anthropic requests carry `cache_control` on the last tool, the system prompt, and the
  last content block of the last and second-to-last user messages (tool results are
  user messages). The summarisation request is marked the same way.

Modelling choices (ours):

* A "user message arrives" when a human-written block (`Flag.HUMAN`) enters the
  conversation at the request; `check_every_request` checks before every request instead.
  The token count is the previous request's input + output, as goose reads it from the
  session; before the first response it is the conversation's size.
* Recovery happens at most once per request, when the request's view exceeds the window.
* "The most recent text-only user message" is the newest human-written message: its text
  blocks are re-sent after the summary (same content, so the same item).
* The middle-out retry drops each removed tool response's tool_use with it (the request
  renders the history as text, so the pair costs a few tokens more or less); failed
  attempts are refused by the API and not billed.
* The summary's size is drawn from the compaction calibration (`policies/calibration/
  summary.py`, seeded `ctx.rng`; fitted to Claude Code's summaries), capped at
  `summary_cap_tokens` and so that the compacted conversation is never larger than the one
  it replaces; `summary_tokens` fixes it. It is priced at the session's model (goose uses
  its fast model).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from policies.base import (
    CACHE_TTL,
    PREFIX_RESETS,
    SUMMARY_CAP_TOKENS,
    SUMMARY_TOKENS,
    ConversationSession,
)
from policies.calibration.summary import SUMMARY_CAP
from simulator import params as kinds
from simulator.model import Flag, Kind, Role
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
from simulator.view import Breakpoint, View

#: Salts of the summary and continuation items' hashes (each compaction adds its count).
SUMMARY_SALT = 0x6005E
CONTINUATION_SALT = 0x6006E
#: Share of the tool responses removed at each retry of a too-long summary request.
MIDDLE_OUT = (0.0, 0.1, 0.2, 0.5, 1.0)


def middle_out(count: int, fraction: float) -> list[int]:
    """Indexes (into `count` tool responses) that goose's `filter_tool_responses` removes:
    max(1, count * fraction) of them, alternately just before and at the middle."""
    if count == 0 or fraction <= 0:
        return []
    n = max(1, int(count * fraction))
    middle = count // 2
    removed: list[int] = []
    for i in range(n):
        offset = i // 2
        if i % 2 == 0:
            if middle > offset:
                removed.append(middle - offset - 1)
        elif middle + offset < count:
            removed.append(middle + offset)
    return removed


class GooseSession(ConversationSession):
    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params)
        self.threshold = params["threshold"]
        self.every_request = params["check_every_request"]
        self.recovery = params["recovery"]
        self.prompt_tokens = params["summary.prompt_tokens"]
        self.continuation = params["continuation_tokens"]
        self.summary_cached = params["summary.cached"]
        self.marked_user_messages = params["cache.user_messages"]
        roles: list[int] = ctx.session.blocks["role"].tolist()
        self.roles = roles
        self.user_turn = False
        self.compactions = 0
        #: Role of each item the policy made (summary: user; continuation: assistant).
        self.synthetic_role: dict[int, int] = {}

    def on_enter(self, blocks: list[int]) -> None:
        flags = self.conv.flags
        self.user_turn = any(flags[b] & Flag.HUMAN for b in blocks)

    # -- the rule -------------------------------------------------------------------------

    def tokens_now(self) -> int:
        """Goose's count: the last usage (input + output), else the conversation's size."""
        if self.last_total is None:
            return self.conv.total()
        return self.last_total + self.last_output

    def threshold_tokens(self) -> int | None:
        """The smallest count that compacts, None when the threshold turns compaction off
        (<= 0 or >= 1): goose compacts when tokens / limit > threshold, so the first whole
        count whose ratio (as floats, as goose divides) is over it."""
        share, window = float(self.threshold), self.window
        if not 0 < share < 1:
            return None
        at = math.floor(share * window) + 1
        while at > 0 and (at - 1) / window > share:
            at -= 1
        while not at / window > share:
            at += 1
        return at

    def limits(self) -> Limits:
        """Compaction at `threshold_tokens` of goose's count (checked when a user message
        arrives, unless `check_every_request`); the recovery compaction is at the window,
        which refuses the request, not goose."""
        return Limits(threshold=self.threshold_tokens())

    def transform(self, k: int, out: Emitter) -> None:
        at = self.threshold_tokens()
        checked = self.user_turn or self.every_request
        if at is not None and checked and self.tokens_now() >= at:
            self.compact(k, out, "compact")
        if self.recovery and self.conv.total() > self.window:
            self.compact(k, out, "recover")

    def latest_user_text(self) -> list[int]:
        """The text blocks of the newest human-written message."""
        conv = self.conv
        items = conv.items
        for i in range(len(items) - 1, -1, -1):
            key = items[i]
            if key >= 0 and conv.flags[key] & Flag.HUMAN and conv.kinds[key] == Kind.TEXT:
                msg = conv.msg[key]
                return [
                    b
                    for b in items
                    if b >= 0
                    and conv.msg[b] == msg
                    and conv.flags[b] & Flag.HUMAN
                    and conv.kinds[b] == Kind.TEXT
                ]
        return []

    def summary_input(self) -> list[int]:
        """What the summarisation request holds: everything, or (when that is over the
        window) everything but tool responses removed from the middle out."""
        conv = self.conv
        items = list(conv.items)
        results = [key for key in items if conv.is_tool_result(key)]
        kept = items
        for fraction in MIDDLE_OUT:
            drop: set[int] = set()
            for i in middle_out(len(results), fraction):
                drop.add(results[i])
                use = conv.link[results[i]]
                if use >= 0:
                    drop.add(use)
            kept = [key for key in items if key not in drop]
            if self.tokens(kept) + self.prompt_tokens <= self.window:
                break
        return kept

    def compact(self, k: int, out: Emitter, stage: str) -> None:
        conv = self.conv
        before = self.tokens(conv.items)
        preserved = self.latest_user_text()
        room = before - self.tokens(preserved) - self.continuation
        if room < 0:
            return  # the compacted conversation could not be smaller than this one
        size = self.summary_size(before)
        size = max(0, min(size, room))
        self.summary_call(
            out,
            k,
            self.summary_input(),
            size,
            stage=stage,
            prompt_tokens=self.prompt_tokens,
            with_prefix=False,
            cached=self.summary_cached,
        )
        summary = conv.add_synthetic(size, "summary", SUMMARY_SALT + self.compactions)
        continuation = conv.add_synthetic(
            self.continuation, "summary", CONTINUATION_SALT + self.compactions
        )
        self.synthetic_role[summary] = int(Role.USER)
        self.synthetic_role[continuation] = int(Role.ASSISTANT)
        conv.replace_all([summary, continuation, *preserved])
        self.compactions += 1

    # -- cache markers ----------------------------------------------------------------

    def role(self, key: int) -> int:
        return self.synthetic_role.get(key, int(Role.USER)) if key < 0 else self.roles[key]

    def breakpoints(self, view: View, ttl: int, *, fork: bool = False) -> list[Breakpoint]:
        """The prefix's markers, then the last block of each of the last
        `cache.user_messages` user messages (goose's Anthropic format)."""
        if fork:
            return super().breakpoints(view, ttl, fork=True)
        conv = self.conv
        items = conv.items
        wanted: list[int] = []
        i = len(items) - 1
        while i >= 0 and len(wanted) < self.marked_user_messages:
            key = items[i]
            if self.role(key) == Role.USER:
                wanted.append(conv.n_prefix + i)
                message = conv.msg[key] if key >= 0 else key
                while i >= 0 and self.role(items[i]) == Role.USER:
                    other = items[i]
                    if (conv.msg[other] if other >= 0 else other) != message:
                        break
                    i -= 1
                continue
            i -= 1
        last = len(view.ids) - 1
        marks = [Breakpoint(p, ttl) for p in conv.marks if p <= last]
        for p in sorted(wanted):
            if not marks or marks[-1].position < p:
                marks.append(Breakpoint(p, ttl))
        return marks[-4:]


#: Goose's parameters (simulator/params.py); values in `Goose.defaults`.
PARAMS: dict[str, Param] = {
    "threshold": kinds.fraction(
        "compact when tokens / context limit exceeds this (<= 0 or >= 1: off)",
        "goose GOOSE_AUTO_COMPACT_THRESHOLD: 0.8 (context_mgmt/mod.rs)",
    ),
    "check_every_request": flag(
        "check before every request instead of when a user message arrives",
        "goose agent.rs: the check runs in reply, when a user message arrives",
    ),
    "recovery": flag(
        "compact and retry a request refused for exceeding the context",
        "goose agent.rs: ContextLengthExceeded recovery",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "summary.prompt_tokens": tokens(
        "the compaction.md template and the user request of the summary call",
        "ours: an estimate",
    ),
    "summary.cached": flag(
        "the summarisation request is marked for the prompt cache",
        "goose providers/formats/anthropic.rs marks it like every request",
    ),
    "continuation_tokens": tokens(
        "the assistant continuation message after the summary",
        "goose CONVERSATION_CONTINUATION_TEXT: 44 cl100k tokens",
    ),
    "cache.user_messages": count(
        "last user messages whose last block carries a cache marker",
        "goose providers/formats/anthropic.rs: the last and second-to-last",
        high=4,
        unit="markers",
    ),
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class Goose(Policy):
    """Goose's auto-compaction (module docstring: facts and choices)."""

    name = "goose"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "threshold": 0.8,  # GOOSE_AUTO_COMPACT_THRESHOLD
        "check_every_request": False,  # goose checks when a user message arrives
        "recovery": True,  # compact and retry on ContextLengthExceeded
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "summary.prompt_tokens": 500,  # compaction.md template + the user request
        "summary.cached": True,  # the summarisation request is marked too
        "continuation_tokens": 44,  # CONVERSATION_CONTINUATION_TEXT
        "cache.user_messages": 2,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.params["cache.user_messages"] < 0:
            raise PolicyError("goose: cache.user_messages must be >= 0")

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return GooseSession(ctx, self.params)
