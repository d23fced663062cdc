"""`codex`: Codex CLI's automatic compaction (DESIGN.md section 5).

Facts (Codex CLI, codex-rs `compact`):

* Trigger: compact when the token count reaches min(model_auto_compact_token_limit, 0.9 x
  context window). `model_auto_compact_token_limit` is a config key; unset means only the
  90% bound applies (parameters `model_auto_compact_token_limit`, `window_fraction`).
* The compacted history keeps the initial context, the most recent user messages up to
  20,000 tokens (newest first; the message that crosses the budget is kept truncated to
  what is left), and a handoff summary written by one LLM call over the history, put after
  them behind a fixed "another language model started to solve this problem" prefix.
  Earlier summaries are not user messages: the new summary replaces them.
* If the compaction request itself overflows the window, Codex drops the oldest history
  items from it and retries until it fits.
* A compaction that leaves the count at or above the limit is not retried within the same
  user turn (Codex ends the turn with an error instead); the next user message may
  compact again.
* Caching: Codex relies on OpenAI's automatic prefix caching. The replay engine picks the
  cache model by the recorded model's provider, so on Claude traces the Anthropic cache
  applies; the policy marks one message breakpoint (the last item), the nearest analogue
  of a cache that extends to the end of every prompt.

Modelling choices (ours): the initial context is the first user message (the user-role
text and images of the first message that has any); user messages are the human-written
blocks (Flag.HUMAN), so tool results, injected reminders and summaries are never kept;
"the oldest items" are dropped a whole API-round group at a time, which never separates a
tool_use from its tool_result. The trigger compares the harness estimate of
`ConversationSession.estimate`. The summary's size is drawn from the Claude Code
calibration (policies/calibration/summary.py) with the session's seeded rng, unless the
`summary_tokens` parameter fixes it; the compaction call's output is the summary itself.
"""

from __future__ import annotations

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
from simulator.model import Flag, Kind, Role
from simulator.params import Declarations, Param, flag, fraction, tokens
from simulator.policy import Emitter, Policy, SessionContext, SessionPolicy, register

#: Codex keeps at most this many tokens of recent user messages after compaction.
USER_MESSAGE_BUDGET = 20_000
#: Fraction of the context window at which Codex compacts when no lower limit is set.
WINDOW_FRACTION = 0.9
#: Approximate tokens of Codex's compaction prompt (templates/compact/prompt.md).
COMPACT_PROMPT_TOKENS = 120
#: Approximate tokens of the fixed text put before the summary in the compacted history.
SUMMARY_PREFIX_TOKENS = 80
#: Salts of the items this policy makes or rewrites (stable hashes: determinism).
SUMMARY_SALT = 0xC0D3
TRUNCATE_SALT = 0xC0D4


class CodexSession(ConversationSession):
    """Codex CLI's compaction rule over the shared conversation mechanics."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=int(params["cache.message_marks"]))
        limit = params["model_auto_compact_token_limit"]
        bound = int(float(params["window_fraction"]) * self.window)
        self.limit = bound if limit is None else min(int(limit), bound)
        self.user_budget = int(params["user_message_budget_tokens"])
        self.truncate_crossing = bool(params["truncate_crossing_message"])
        self.prompt_tokens = int(params["compact_prompt_tokens"])
        self.prefix_tokens = int(params["summary_prefix_tokens"])
        roles: list[int] = ctx.session.blocks["role"].tolist()
        kinds = self.conv.kinds
        #: The initial context is every client-written message before the first human one
        #: (developer instructions too), not only the first user message.
        self.client_initial = bool(params["initial_context_before_human"])
        self.seen_human = False
        initial_roles = (Role.USER, Role.SYSTEM) if self.client_initial else (Role.USER,)
        #: Blocks that can make up the initial context (user-role text or image; with
        #: `client_initial`, system-role too).
        self.user_content = [
            roles[b] in initial_roles and kinds[b] in (Kind.TEXT, Kind.IMAGE)
            for b in range(len(roles))
        ]
        #: The initial context: the blocks of the first user message, once it has entered.
        self.initial: list[int] = []
        self.initial_msg: int | None = None
        #: Codex's "auto compact recently attempted": set by a compaction, cleared when the
        #: estimate is back under the limit or a new user turn starts.
        self.attempted = False
        self.compactions = 0

    def on_enter(self, blocks: list[int]) -> None:
        conv = self.conv
        for b in blocks:
            if conv.flags[b] & int(Flag.HUMAN):
                self.attempted = False  # a new user turn (a new Codex task)
                if self.client_initial:
                    self.seen_human = True
                    continue
            if not self.user_content[b]:
                continue
            if self.client_initial:
                if not self.seen_human:
                    self.initial.append(b)
                continue
            if self.initial_msg is None:
                self.initial_msg = conv.msg[b]
            if conv.msg[b] == self.initial_msg:
                self.initial.append(b)

    def transform(self, k: int, out: Emitter) -> None:
        if not self.conv.items:
            return
        if self.estimate(k) < self.limit:
            self.attempted = False
            return
        if self.attempted:
            return  # still over the limit after compacting: Codex does not retry this turn
        self.compact(k, out)
        self.attempted = True

    def compact(self, k: int, out: Emitter) -> None:
        conv = self.conv
        items = self.request_items()
        pre = self.tokens(items)
        summary = self.summary_size(pre)
        self.summary_call(out, k, items, summary, stage="compact", prompt_tokens=self.prompt_tokens)
        live = set(conv.items)
        initial = [b for b in self.initial if b in live]
        kept = self.recent_user_messages(set(initial))
        key = conv.add_synthetic(summary + self.prefix_tokens, "summary", SUMMARY_SALT)
        conv.replace_all([*initial, *kept, key])
        self.compactions += 1

    def request_items(self) -> list[int]:
        """The history the compaction request sends: all of it, or, if that would not fit
        the window, without its oldest API-round groups (the last group always stays)."""
        conv = self.conv
        items = conv.items
        total = conv.total() + self.prompt_tokens
        if total <= self.window:
            return list(items)
        starts = conv.groups()
        bounds = [*starts, len(items)]
        g = 0
        while total > self.window and g < len(starts) - 1:
            total -= self.tokens(items[bounds[g] : bounds[g + 1]])
            g += 1
        return items[bounds[g] :]

    def recent_user_messages(self, initial: set[int]) -> list[int]:
        """The newest human-written blocks within the budget, oldest first; the block that
        crosses the budget is kept truncated to what is left."""
        conv = self.conv
        remaining = self.user_budget
        kept: list[int] = []
        for key in reversed(conv.items):
            if remaining <= 0:
                break
            if key < 0 or key in initial or not conv.flags[key] & int(Flag.HUMAN):
                continue
            size = conv.sent(key)[1]
            if size <= remaining:
                kept.append(key)
                remaining -= size
                continue
            if self.truncate_crossing:
                # the salt names the cut, so a different cut is different content
                conv.mask(key, remaining, (TRUNCATE_SALT << 32) ^ remaining)
                kept.append(key)
            break
        kept.reverse()
        return kept


#: Parameters by Codex CLI version: (first version, overrides of `Codex.defaults`), in
#: ascending order; `preset_for` takes the last row at or below a version.
#:
#: * Before 0.47 the limit was a per-model constant with no window bound: 350,000 for
#:   gpt-5-codex (openai/codex#4156, raised from 220,000 the day after #4093), above its
#:   272,000 window: in effect no automatic compaction (no recorded one to check it on).
#: * From 0.47 (openai/codex#5292, "auto compact at ~90%") the limit is a share of the
#:   window. Codex's effective window is 95% of the catalog one (openai/codex#19319:
#:   272,000 x 0.95 = 258,400, the ``model_context_window`` every 2026 rollout in
#:   shared/traces/codex logs), so 90% of it would be 0.855 of ours; but the recordings
#:   run past that: git-sync 0.118 sends ten requests at 232-235k before compacting, agentv
#:   0.142.4 one at 238k. Fitted on the 19 recorded automatic compactions (share of them the
#:   preset compacts within one request of), grid 0.84-0.90: 0.84 4, 0.855 5, 0.87 7,
#:   0.88 10, 0.90 4. Leave-one-source-out every held-out folder gets 0.88 (10 of 19).
#:   Codex compares its own running count (the last response's total, output included,
#:   plus an estimate of what was added since), not the next request's context, which is
#:   the likely reason its limit sits higher than 0.855 of the window here.
#: * What is kept (0.47+): every client message before the first human one (developer
#:   instructions, AGENTS.md, environment context: the replacement histories of the 2026
#:   rollouts start with them), the recent user messages, the summary. With only the
#:   first user message kept, the context after was 15-30% short on 17 of 19.
PRESETS: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((0,), {"model_auto_compact_token_limit": 350_000, "window_fraction": 1.0}),
    (
        (0, 47),
        {
            "model_auto_compact_token_limit": None,
            "window_fraction": 0.88,
            "initial_context_before_human": True,
        },
    ),
]


def _version(text: str) -> tuple[int, ...]:
    """ "0.142.5", "0.126.0-alpha.8" -> (0, 142, 5), (0, 126, 0); unreadable parts stop it."""
    out: list[int] = []
    for part in text.split("-", 1)[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def preset_for(cli_version: str) -> dict[str, Any]:
    """The parameter overrides of the Codex CLI version a session was recorded with (the
    newest preset when the version is unknown)."""
    version = _version(cli_version)
    if not version:
        return dict(PRESETS[-1][1])
    chosen = PRESETS[0][1]
    for first, params in PRESETS:
        if version >= first:
            chosen = params
    return dict(chosen)


#: Codex CLI's parameters (simulator/params.py); values in `Codex.defaults`.
PARAMS: dict[str, Param] = {
    "model_auto_compact_token_limit": tokens(
        "compact at min(this, window_fraction x window); null: only the window bound",
        "Codex config model_auto_compact_token_limit (unset by default)",
        optional=True,
    ),
    "window_fraction": fraction(
        "compact at this share of the context window",
        "Codex codex-rs compact: 0.9 x window (DESIGN.md 5)",
        open_low=True,
    ),
    "user_message_budget_tokens": tokens(
        "most tokens of recent user messages kept after compaction",
        "Codex codex-rs compact: 20,000 (DESIGN.md 5)",
    ),
    "truncate_crossing_message": flag(
        "the message that crosses the budget is kept truncated to what is left",
        "Codex codex-rs compact",
    ),
    "initial_context_before_human": flag(
        "the initial context kept is every client message before the first human one"
        " (developer instructions, AGENTS.md, environment), not only the first user message",
        "Codex 0.47+ build_initial_context; the replacement histories of shared/traces/codex",
    ),
    "compact_prompt_tokens": tokens(
        "the compaction prompt", "ours: an estimate of templates/compact/prompt.md"
    ),
    "summary_prefix_tokens": tokens(
        "the fixed text put before the summary in the compacted history",
        "ours: an estimate of Codex's summary prefix",
    ),
    "summary_tokens": SUMMARY_TOKENS,
    "summary_cap_tokens": SUMMARY_CAP_TOKENS,
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
    "warm_start": WARM_START,
}


@register
class Codex(Policy):
    """Codex CLI: compact at min(model_auto_compact_token_limit, 0.9 x window) into the
    initial context, the newest 20,000 tokens of user messages and a handoff summary."""

    name = "codex"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "model_auto_compact_token_limit": None,  # None: only the window bound applies
        "window_fraction": WINDOW_FRACTION,
        "user_message_budget_tokens": USER_MESSAGE_BUDGET,
        "truncate_crossing_message": True,
        "initial_context_before_human": False,
        "compact_prompt_tokens": COMPACT_PROMPT_TOKENS,
        "summary_prefix_tokens": SUMMARY_PREFIX_TOKENS,
        "summary_tokens": None,  # None: drawn from the calibration (seeded)
        "summary_cap_tokens": SUMMARY_CAP,
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
        "warm_start": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return CodexSession(ctx, self.params)
