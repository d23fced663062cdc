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

Per-version rules (the window Codex runs with, what 0.118+ keeps and where, the user's
/compact replayed, the compaction call the recording does not bill) are documented with
their evidence at `PRESETS`.

Modelling choices (ours): the initial context is the first user message (the user-role
text and images of the first message that has any); user messages are the human-written
blocks (Flag.HUMAN), so tool results, injected reminders and summaries are never kept;
"the oldest items" are dropped a whole API-round group at a time, which never separates a
tool_use from its tool_result. The trigger compares the harness estimate of
`ConversationSession.estimate` by default; the 0.118+ presets compare Codex's own count
(`CodexSession.codex_count`, see `PRESETS`). The summary's size is drawn from the Claude Code
calibration (policies/calibration/summary.py) with the session's seeded rng, unless the
`summary_tokens` parameter fixes it; the compaction call's output is the summary itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from policies.base import (
    CACHE_TTL,
    MESSAGE_MARKS,
    PREFIX_RESETS,
    SUMMARY_CAP_TOKENS,
    SUMMARY_TOKENS,
    WARM_START,
    ConversationSession,
    MatchedVersion,
)
from policies.calibration.summary import SUMMARY_CAP
from simulator.model import CompactionEvent, Flag, Kind, Role, Session, version_tuple
from simulator.params import Declarations, Param, choice, count, flag, fraction, tokens
from simulator.policy import (
    Call,
    Emitter,
    Limits,
    Policy,
    SessionContext,
    SessionPolicy,
    register,
)
from simulator.view import View, chain

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
KEPT_SALT = 0xC0D5


class CodexSession(ConversationSession):
    """Codex CLI's compaction rule over the shared conversation mechanics."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=int(params["cache.message_marks"]))
        self.config_limit = params["model_auto_compact_token_limit"]
        self.fraction = float(params["window_fraction"])
        self.use_logged = bool(params["logged_window"])
        #: The window Codex runs with when none was logged: a share of the model facts'.
        self.fallback_window = int(float(params["window_share"]) * self.window)
        self.raw_window = bool(params["limit_of_raw_window"])
        self.window_share = float(params["window_share"])
        self.limit = self.limit_at(0) if ctx.session.n_requests else self.fallback_window
        self.keep_answers = bool(params["keep_turn_answers"])
        self.initial_late = bool(params["initial_before_last_user"])
        self.as_text = bool(params["kept_as_text"])
        self.raw: list[int] = ctx.session.blocks["tokens_raw"].tolist()
        self.call_priced = str(params["compaction_call"]) == "billed"
        #: Request -> summary tokens of the user's /compact, replayed where it happened.
        self.manual = manual_compactions(ctx.session) if params["replay_manual"] else {}
        #: Request -> summary of the recording's automatic compactions replayed as recorded
        #: (`replay_recorded_before`): a check of the trigger one compaction at a time.
        self.recorded = recorded_compactions(ctx.session, params["replay_recorded_before"])
        self.user_budget = int(params["user_message_budget_tokens"])
        self.truncate_crossing = bool(params["truncate_crossing_message"])
        self.prompt_tokens = int(params["compact_prompt_tokens"])
        self.prefix_tokens = int(params["summary_prefix_tokens"])
        roles: list[int] = ctx.session.blocks["role"].tolist()
        self.roles = roles
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
        self.next_k = 0  # the request the next step sends (for `limits`)
        self.count_dropped = bool(params["count_dropped_reasoning"])
        #: Tokens of the reasoning the API stopped counting since the last compaction.
        self.dropped = 0
        #: `trigger_count` "codex": the count codex-rs compares with the limit (`codex_count`).
        self.codex_count_on = str(params["trigger_count"]) == "codex"
        self.reasoning_factor = float(params["reasoning_estimate_factor"])
        b = ctx.session.blocks
        thinking = np.flatnonzero(b["kind"] == Kind.THINKING)
        #: Request -> recorded reasoning tokens of its response (its THINKING blocks'
        #: `tokens_raw`: the reader sizes them from ``reasoning_output_tokens``).
        self.reasoning_of: dict[int, int] = {}
        for blk in thinking.tolist():
            o = int(b["origin"][blk])
            self.reasoning_of[o] = self.reasoning_of.get(o, 0) + self.raw[blk]
        #: Reasoning tokens in Codex's history since the last compaction: of the user turn
        #: in progress (`reasoning_open`) and of the turns before it (`reasoning_closed`).
        self.reasoning_open = 0
        self.reasoning_closed = 0
        #: Requests sent first after a resume from a rewritten rollout (`PRESETS`): the
        #: reasoning recorded before each leaves Codex's count.
        self.restored: set[int] = (
            set(ctx.session.restored_at) if params["restored_reasoning_uncounted"] else set()
        )
        #: Request -> blocks Codex dropped there without logging it (`apply_unlogged_edits`).
        self.unlogged: dict[int, list[int]] = {}
        if params["apply_unlogged_edits"]:
            unlogged = np.flatnonzero((b["flags"] & Flag.UNLOGGED) != 0)
            for blk in unlogged.tolist():
                self.unlogged.setdefault(int(b["compacted_at"][blk]), []).append(blk)
        self.retexted: set[int] = set()  # kept messages already re-sized to their text

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

    def limit_at(self, k: int) -> int:
        """The compaction limit for request k: min(the configured limit, window_fraction x
        the window Codex ran request k's model with: the logged one where the recording
        has it, else `window_share` of the model facts' window)."""
        window = self.ctx.session.logged_window(k) if self.use_logged else -1
        window = window if window > 0 else self.fallback_window
        if self.raw_window:  # the catalog window the effective (logged) one is a share of
            window = round(window / self.window_share)
        bound = int(self.fraction * window)
        return bound if self.config_limit is None else min(int(self.config_limit), bound)

    def limits(self) -> Limits:
        """The compaction limit of the next request (its model's window); the model's
        window stops it."""
        n = self.ctx.session.n_requests
        return Limits(threshold=self.limit_at(min(self.next_k, n - 1)) if n else self.limit)

    def codex_count(self, k: int) -> int:
        """The count codex-rs compares with the limit before request k (`PRESETS`, "the
        count"): the last response's total, plus length/4 of what the history gained
        since that the response did not write, plus the estimated reasoning of the user
        turns before the latest one; the user message that opens a turn and what comes
        with it are not in it (Codex checks before recording them). Moves the reasoning of
        the turn that ends at k into the earlier turns' share."""
        conv = self.conv
        entering: list[int] = self.schedule.enter[k]
        opens_turn = any(conv.flags[b] & int(Flag.HUMAN) for b in entering)
        reasoning = round(self.reasoning_factor * self.reasoning_closed)
        if opens_turn:
            self.reasoning_closed += self.reasoning_open
            self.reasoning_open = 0
        if self.last_total is None:
            return conv.total()
        added = 0
        for key in entering:
            if conv.origin[key] == k - 1:
                continue  # the previous response's own items: in its total already
            if opens_turn and conv.kinds[key] != Kind.TOOL_RESULT:
                continue  # recorded with the new turn, after the check
            added += conv.estimate_chars(key) // 4
        return self.last_total + self.last_output + added + reasoning

    def transform(self, k: int, out: Emitter) -> None:
        self.next_k = k + 1
        if k in self.unlogged:
            self.conv.remove_blocks(set(self.unlogged[k]))
        if self.codex_count_on:
            self.reasoning_open += self.reasoning_of.get(k - 1, 0)
            if k in self.restored:  # rebuilt without encrypted content: never counted again
                self.reasoning_open = self.reasoning_closed = 0
        if self.count_dropped:
            kinds, tokens = self.conv.kinds, self.ctx.session.blocks["tokens"]
            self.dropped += sum(
                int(tokens[b]) for b in self.schedule.leave[k] if kinds[b] == Kind.THINKING
            )
        if not self.conv.items:
            return
        if k in self.manual:
            self.replay_manual(k, out)
            return
        if k in self.recorded:
            self.replay_recorded(k, out)
            return
        self.limit = self.limit_at(k)
        count = self.codex_count(k) if self.codex_count_on else self.estimate(k) + self.dropped
        if count < self.limit:
            self.attempted = False
            return
        if self.attempted:
            return  # still over the limit after compacting: Codex does not retry this turn
        self.compact(k, out)
        self.attempted = True

    def compact(
        self, k: int, out: Emitter, *, stage: str = "compact", summary: int | None = None
    ) -> None:
        """Replace the history by the initial context (not for a manual /compact: the next
        turn sends it again), the recent user messages and a summary of `summary` tokens
        (None: drawn)."""
        conv = self.conv
        items = self.request_items()
        if summary is None:
            summary = self.summary_size(self.tokens(items))
        if self.call_priced:
            self.summary_call(out, k, items, summary, stage=stage, prompt_tokens=self.prompt_tokens)
        else:  # the recording shows no usage for the call: a row of nothing, priced 0
            view = View(chain(self.ctx.root, SUMMARY_SALT))
            out.call(view, Call("compaction", stage, [], 0, cached=False))
        live = set(conv.items)
        initial = [] if stage == "manual" else [b for b in self.initial if b in live]
        kept = self.recent_user_messages(set(initial))
        key = conv.add_synthetic(summary + self.prefix_tokens, "summary", SUMMARY_SALT)
        if self.initial_late and kept:  # before the last user message (0.118+)
            conv.replace_all([*kept[:-1], *initial, kept[-1], key])
        else:
            conv.replace_all([*initial, *kept, key])
        self.compactions += 1
        self.dropped = 0  # the compacted history holds no reasoning
        self.reasoning_open = self.reasoning_closed = 0

    def replay_manual(self, k: int, out: Emitter) -> None:
        """The user's /compact at the request where the recording made it, with the
        recording's summary; what was logged after it (the next turn) stays after it."""
        after = self._replay(k, out, "manual", *self.manual[k])
        # The next turn sends the initial context again (agentv 0.142.5 logs the developer
        # message and AGENTS.md right after its /compact): those copies are now the
        # initial context a later compaction keeps.
        self.initial, self.initial_msg, self.seen_human = [], None, False
        self.on_enter(after)
        self.attempted = False

    def replay_recorded(self, k: int, out: Emitter) -> None:
        """The recording's automatic compaction at the request where it happened, with its
        summary, the rest as Codex's compaction keeps it (the initial context, the recent
        user messages). The state after it is Codex's after a compaction of its own."""
        self._replay(k, out, "as-recorded", *self.recorded[k])
        self.attempted = True

    def _replay(
        self, k: int, out: Emitter, stage: str, summary: int, summary_block: int
    ) -> list[int]:
        """A recorded compaction with its summary; what was logged after the summary block
        stays after it (returned)."""
        conv = self.conv
        after = [key for key in conv.items if key > summary_block >= 0]
        conv.remove_blocks(set(after))
        self.compact(k, out, stage=stage, summary=max(summary - self.prefix_tokens, 0))
        conv.append(after)
        return after

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
        crosses the budget is kept truncated to what is left. With `keep_turn_answers`,
        each human message's preceding turn answer too (`turn_answers`)."""
        conv = self.conv
        remaining = self.user_budget
        kept: list[int] = []
        answers = self.turn_answers() if self.keep_answers else set()
        for key in reversed(conv.items):
            if remaining <= 0:
                break
            if key < 0 or key in initial:
                continue
            if not (conv.flags[key] & int(Flag.HUMAN) or key in answers):
                continue
            size = conv.sent(key)[1]
            if self.as_text and key not in self.retexted and size != self.raw[key]:
                # a new item of the message's text: its own size, a new hash
                size = self.raw[key]
                conv.mask(key, size, KEPT_SALT)
                self.retexted.add(key)
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

    def turn_answers(self) -> set[int]:
        """The assistant text that ends each turn: the last assistant TEXT block before
        each human-written block (the turn in progress has none yet)."""
        conv = self.conv
        answers: set[int] = set()
        last: int | None = None
        for key in conv.items:
            if key < 0:
                continue
            if conv.flags[key] & int(Flag.HUMAN):
                if last is not None:
                    answers.add(last)
                last = None
            elif conv.kinds[key] == Kind.TEXT and self.roles[key] == Role.ASSISTANT:
                last = key
        return answers


def manual_compactions(session: Session) -> dict[int, tuple[int, int]]:
    """Request -> (summary tokens, summary block) of each recorded manual compaction."""
    return _summaries(session, lambda e: e.trigger == "manual")


def recorded_compactions(session: Session, before: int | None) -> dict[int, tuple[int, int]]:
    """Request -> (summary tokens, summary block) of each recorded automatic compaction
    before request `before` (none for None)."""
    if before is None:
        return {}
    return _summaries(session, lambda e: e.trigger != "manual" and e.request < before)


def _summaries(
    session: Session, chosen: Callable[[CompactionEvent], bool]
) -> dict[int, tuple[int, int]]:
    """Request -> (summary tokens, summary block) of the `chosen` recorded compactions.

    Codex logs no summary text (0.118+: an opaque ``compaction`` item or nothing), so the
    builder books what the recorded context after holds beyond the logged replacement
    history as INJECTED artifacts entering at the event's request (traces/codex.py
    `_compacted`): that, with the summary block's own tokens, is the recording's summary.
    """
    tokens = session.blocks["tokens"]
    out: dict[int, tuple[int, int]] = {}
    for e in session.events:
        if not chosen(e):
            continue
        summary = session.injected_at(e.request)
        if e.summary_block >= 0:
            summary += int(tokens[e.summary_block])
        out[e.request] = (summary, e.summary_block)
    return out


#: The 0.47-0.117 limit as a share of the logged window (fitted before the count was
#: Codex's: see `PRESETS`).
WINDOW_FRACTION_047 = 0.935
#: Tokens Codex's estimate books per recorded reasoning token (fitted: see `PRESETS`).
REASONING_ESTIMATE_FACTOR = 1.2
#: Parameters by Codex CLI version: (first version, overrides of `Codex.defaults`), in
#: ascending order; `preset_for` takes the last row at or below a version.
#:
#: * Before 0.47 the limit was a per-model constant with no window bound: 350,000 for
#:   gpt-5-codex (openai/codex#4156, raised from 220,000 the day after #4093), above its
#:   272,000 window: in effect no automatic compaction (no recorded one to check it on).
#: * From 0.47 (openai/codex#5292, "auto compact at ~90%") the limit is a share of the
#:   window Codex runs with. That window is the ``model_context_window`` the rollout logs
#:   (`logged_window`; traces/codex.py): 95% of the catalog one (openai/codex#19319:
#:   272,000 x 0.95 = 258,400 on gpt-5.4-5.6; 121,600 on gpt-5.3-codex-spark, whose
#:   128,000 neither genai-prices 0.2.3 nor simulator/models.py knows); where none is
#:   logged, 95% of the model facts' window (`window_share`). 0.47-0.117 recorded no
#:   compaction: their share, 0.935 of the logged window, is the one fitted for 0.118+
#:   when the count was the harness estimate (kept unchanged: nothing to check it on).
#: * The limit (0.118+): codex-rs ModelInfo.auto_compact_token_limit is min(the model's
#:   configured limit, 9/10 of its catalog context window), while the logged window is
#:   the catalog one times its effective percent (95): 0.9 x 272,000 = 244,800 against a
#:   logged 258,400 (openai/codex#40095, on 0.149: "auto_compact_token_limit is derived
#:   from the raw window"), 0.9 x 128,000 = 115,200 on spark (`limit_of_raw_window`,
#:   window_fraction 0.9). No rollout logs a configured limit (turn_context has no such
#:   key), so none applies.
#: * The count (0.118+, `trigger_count` "codex", `codex_count`), from codex-rs
#:   context_manager/history.rs `get_total_token_usage` and session/turn.rs: the last
#:   response's ``total_tokens`` (input + output, its reasoning included), plus the
#:   length/4 estimate of every history item after the last model-written one (tool
#:   outputs; openai/codex#11132), plus, unless the server says the usage includes it, the
#:   estimated size of the reasoning items before the last user message (the API drops
#:   them from its count: openai/codex#7113). It is checked after each sampling request
#:   that needs a follow-up (mid-turn) and before each turn, before the turn's context
#:   updates and user message are recorded; so the reasoning of a turn joins the count
#:   only after the next user message is in the history, one request into that turn. On
#:   gpt-5.6, which keeps earlier turns' reasoning in its usage, Codex adds it again
#:   (openai/codex#39767, 0.144.5: 76 of 76 compactions of a rollout cross the limit only
#:   with it); the same rule does that here, as the THINKING blocks stay in its context.
#:   Read in codex-rs main (2026: context_manager/history.rs, session/turn.rs,
#:   protocol openai_models.rs); the two PRs that made the count so are older than 0.118
#:   (#7113 2025-11, #11132 2026-02; git-sync's 0.118 rollouts are of 2026-04); at the
#:   fitted factor 4 of 0.118's 4 compactions fall within one request, 14 of 0.140-0.144's
#:   15 (the earlier rule, which left 0.118's reasoning out, was chosen on git-sync alone).
#:   codex-rs sizes a reasoning item by its encrypted content (3/4 of its base64 length less
#:   650 bytes, /4), which the 2026 rollouts redact; here it is the recorded reasoning tokens
#:   times `reasoning_estimate_factor`, fitted on the 19 recorded automatic compactions (grid
#:   1.00-1.60 by 0.05, `python -m simulator.app.measure.codex_compactions
#:   ../shared/traces/codex --fit`; with the resume rule below; run seed 0, traces named as
#:   `ctxsim run` names them): 1.2 compacts within one request of 18 of 19, 1.25 17,
#:   1.1-1.15 and 1.3 16, 1.0 13, 1.4-1.6 10-13 (hk's two only at 1.5-1.55); 1.2 taken: the
#:   fit (`choose` in simulator/app/measure/codex_compactions.py) takes the most within one
#:   request, then the least total offset, then the middle, the lower of two.
#:   Leave-one-source-out: agentv held out 1.25 (11 of 12: fnox, git-sync and hk tie 1.2
#:   and 1.25 on the count, 6, and 1.25 is 4 requests off in all against 5), fnox 1.2 (1 of
#:   1), git-sync 1.2 (4 of 4), hk 1.2 (1 of 2): 17 of 19. Each summary's size is drawn from
#:   the session's seeded rng and moves the next compaction, so one seed is one draw: over run
#:   seeds 0-9, 17.0 of 19 held out on average (16-18; `--fit --seeds 10`). The 71 reasoning
#:   items of agentic-neurodata (0.40-0.42, gpt-5-codex), whose rollouts keep the encrypted
#:   content, give the same slope: codex-rs's estimate of them is
#:   26 + 1.15 x their reasoning tokens (least squares; 1.19 x on the 14 of 256 tokens or
#:   more); if the 650 bytes are the ciphertext's fixed part, 1.2 is 4.8 decoded bytes per
#:   token, near the 4.9-5.0 UKGovernmentBEIS/inspect_ai#3809 measured. Booking those 26 tokens
#:   per item as well (at 1.2) moved agentv 115 and git-sync 173 2 and 4 requests early and
#:   left hk at 134 (15 of 19): not used. The earlier rule (the harness estimate of the next
#:   request, the dropped reasoning at its recorded size, 0.935 of the logged window) had 12 of
#:   19 in sample, 8 held out.
#: * A resume from a rewritten rollout (0.118+, `restored_reasoning_uncounted`): codex-rs
#:   rebuilds the history of a resumed thread from its rollout (rollout_reconstruction.rs
#:   `reconstruct_history_from_rollout`) and restores the last token count from it
#:   (`last_token_info_from_rollout`), and `get_non_last_reasoning_items_tokens` sizes only
#:   reasoning items with ``encrypted_content: Some(_)``. Codex's own rollout keeps that
#:   content (the 0.40-0.42 rollouts of agentic-neurodata hold it; the 2026 ones were published
#:   through Entire, which strips it or writes REDACTED, whatever the version), but the copy
#:   Entire's ``entire resume`` writes back does not (entireio/cli#878, 2026-04-08:
#:   SanitizePortableTranscript deletes it from every reasoning item), so after such a resume
#:   the reasoning recorded before it never counts again; what the model reasons afterwards
#:   does. The reader marks those resumes (`Session.restored_at`, from the line the copy leaves
#:   without a final newline: traces/codex.py `joined_entries`). One session of
#:   shared/traces/codex has one: git-sync 019d6d29 (0.118, recorded the day the PR was
#:   merged), resumed at request 232 after 94 minutes with 13.8k tokens of earlier turns'
#:   reasoning and 0.8k of the turn before in the count: with them the preset compacted at 324
#:   for the recorded 351, without them at 351. Codex's own resumes (fnox 019f1f6f and hk
#:   019f5cfd re-log ``session_meta`` 6 and 12 times, VS Code) keep the content: their
#:   compactions fall within one request with every earlier turn's reasoning counted. Read in
#:   codex-rs main (2026), whose recorder also ends an unterminated rollout with a newline
#:   before appending to it (ensure_rollout_is_newline_terminated; not in 0.118, which left the
#:   joined line): with such a version a resume from a rewritten copy leaves no mark, and the
#:   preset would count that reasoning.
#: * Codex's own unlogged edits (0.118+, `apply_unlogged_edits`): Codex's count is the
#:   server's usage, so what the client dropped without logging it (Flag.UNLOGGED, inferred
#:   by traces/builder.py from the recorded usage) is out of it; a policy that keeps those
#:   blocks counts more than Codex did (git-sync 019d7739: 2,070 tokens of an interrupted
#:   round from request 100 on, and it compacted 4 requests early). At factor 1.25,
#:   applying them moved git-sync 173 and 163 from 169 and 160 to 172 and 163.
#: * What is kept (0.47+): every client message before the first human one (developer
#:   instructions, AGENTS.md, environment context), the recent user messages, the
#:   summary. With only the first user message kept, the context after was 15-30% short
#:   on 17 of 19.
#: * 0.118+ (the 2026 rollouts), from the 20 replacement histories in shared/traces/codex:
#:   the initial context stands just before the last user message, not first (all 19
#:   automatic ones: users..., developer, AGENTS.md/environment, last user;
#:   `initial_before_last_user`), so the compacted request reads about the system prefix
#:   from the cache at most (18 of 20 read 9.5-10.6k against a 9.6-12.1k prefix; one
#:   4.5k, one 12.7k); a manual /compact keeps no initial context (the next turn sends
#:   it again: `replay_manual`). Kept
#:   messages are new items of their text (`kept_as_text`): their copies are 1.1x their
#:   cl100k size, while the anchoring gave git-sync's live answers 1.4x (the share of
#:   unlogged reasoning), and the context after was 8-17% over on three git-sync rows.
#:   The compaction call is not in the recorded usage: the ``token_count`` after every
#:   compaction has zero last usage and unchanged totals, whatever the version (0.118,
#:   0.140-0.144; remote compaction: the server runs it), so it is priced as recorded,
#:   as nothing (`compaction_call` "unrecorded").
#: * 0.118-0.139 also keep each turn's last assistant message (`keep_turn_answers`): the 4
#:   git-sync 0.118 histories hold 11 of 11, 37 of 40, 7 of 8 and 30 of 31 turn answers,
#:   and no other assistant message; the 0.140+ histories none (16 compactions). Without
#:   them the context after was 16-30% short on three of the four; with them (at their
#:   text size) all four are within 15%. 0.119-0.139 recorded no compaction: taken as
#:   0.118. The kept answers share the 20,000-token budget with the user messages (ours:
#:   no history reaches it; the largest keeps 10.3k).
_V047: dict[str, Any] = {
    "model_auto_compact_token_limit": None,
    "window_fraction": WINDOW_FRACTION_047,
    "window_share": 0.95,
    "initial_context_before_human": True,
}
_V0118: dict[str, Any] = {
    **_V047,
    "window_fraction": WINDOW_FRACTION,
    "limit_of_raw_window": True,
    "trigger_count": "codex",
    "apply_unlogged_edits": True,
    "restored_reasoning_uncounted": True,
    "compaction_call": "unrecorded",
    "initial_before_last_user": True,
    "kept_as_text": True,
}
PRESETS: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((0,), {"model_auto_compact_token_limit": 350_000, "window_fraction": 1.0}),
    ((0, 47), _V047),
    ((0, 118), {**_V0118, "keep_turn_answers": True}),
    ((0, 140), _V0118),
]


def preset_for(cli_version: str) -> dict[str, Any]:
    """The parameter overrides of the Codex CLI version a session was recorded with (the
    newest preset when the version is unknown)."""
    version = version_tuple(cli_version)
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
    "logged_window": flag(
        "compact against the window the recording logged for the request's model"
        " (Session.context_windows), where it logged one",
        "Codex rollouts log model_context_window with every token count (traces/codex.py)",
    ),
    "window_share": fraction(
        "the window Codex runs with where none was logged: this share of the model's",
        "openai/codex#19319: Codex's effective window is 95% of the catalog one (0.47+)",
        open_low=True,
    ),
    "keep_turn_answers": flag(
        "the compacted history also keeps each turn's last assistant message",
        "the replacement histories of Codex 0.118 (shared/traces/codex/git-sync)",
    ),
    "initial_before_last_user": flag(
        "the compacted history puts the initial context just before the last user message"
        " (not first)",
        "the 19 automatic replacement histories of shared/traces/codex (0.118-0.144)",
    ),
    "kept_as_text": flag(
        "kept messages are new items sized by their text (not by their anchored share of"
        " the recorded usage)",
        "the replacement histories of shared/traces/codex: kept copies ~1.1x their cl100k"
        " size, while anchoring gave the live git-sync answers 1.4x",
    ),
    "count_dropped_reasoning": flag(
        "the count compared with the limit adds the reasoning of earlier turns, which the"
        " API no longer counts but the history still holds",
        "codex-rs ContextManager.get_total_token_usage (non-last reasoning items)",
    ),
    "trigger_count": choice(
        ("estimate", "codex"),
        "the count compared with the limit: the harness estimate of the next request"
        " (`count_dropped_reasoning` adds the reasoning the API dropped), or the count"
        " codex-rs makes (the last response's total, what was added since, the earlier"
        " turns' reasoning as Codex sizes it; checked before the user message of a turn)",
        "codex-rs ContextManager.get_total_token_usage, session/turn.rs (see `PRESETS`)",
    ),
    "reasoning_estimate_factor": fraction(
        "tokens Codex's size estimate books per recorded reasoning token of the earlier"
        " turns (it sizes a reasoning item by its encrypted content)",
        "fitted on the recorded compactions of shared/traces/codex (see `PRESETS`)",
        high=4.0,
        unit="ratio",
    ),
    "apply_unlogged_edits": flag(
        "drop the blocks the recording's client dropped without logging it, where it did"
        " (Flag.UNLOGGED: an interrupted turn's items, an unexplained drop of the recorded"
        " context); they are Codex's own edits, so Codex's count never saw them",
        "traces/builder.py infers them from the recorded usage; see `PRESETS`",
    ),
    "restored_reasoning_uncounted": flag(
        "Codex's count leaves out the reasoning recorded before a resume from a rewritten"
        " rollout (Session.restored_at), whose reasoning items lost their encrypted content",
        "codex-rs get_non_last_reasoning_items_tokens counts encrypted_content: Some only;"
        " entireio/cli#878 strips it from restored rollouts (see `PRESETS`)",
    ),
    "limit_of_raw_window": flag(
        "window_fraction applies to the catalog window (the logged one / window_share),"
        " not to the logged effective window",
        "openai/codex#40095: 0.9 x 272,000 = 244,800 against a logged 258,400",
    ),
    "compaction_call": choice(
        ("billed", "unrecorded"),
        "the compaction call: billed as a request over the history, or unrecorded (the"
        " recording shows no usage for it: a row priced 0)",
        "Codex 0.118-0.144 rollouts: zero last usage, unchanged totals after every compaction",
    ),
    "replay_manual": flag(
        "replay the recording's manual /compact where it happened, with its summary",
        "a user's command is a recorded action, not a policy decision",
    ),
    "replay_recorded_before": count(
        "replay the recording's automatic compactions before this request, where they"
        " happened and with their summaries; null: none",
        "ours: a check of the trigger one compaction at a time"
        " (simulator/app/measure/codex_compactions.py)",
        optional=True,
        unit="request index",
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


class Codex(Policy):
    """Codex CLI: compact at min(model_auto_compact_token_limit, 0.9 x window) into the
    initial context, the newest 20,000 tokens of user messages and a handoff summary.

    The rules as documented (DESIGN.md 5), which each version's preset overrides
    (`PRESETS`); registered as those presets and as `codex`, which matches each session
    to its own version's."""

    name = "codex"
    version = "2"
    defaults: ClassVar[dict[str, Any]] = {
        "model_auto_compact_token_limit": None,  # None: only the window bound applies
        "window_fraction": WINDOW_FRACTION,
        "user_message_budget_tokens": USER_MESSAGE_BUDGET,
        "truncate_crossing_message": True,
        "initial_context_before_human": False,
        "logged_window": True,
        "window_share": 1.0,
        "keep_turn_answers": False,
        "compaction_call": "billed",
        "replay_manual": True,
        "replay_recorded_before": None,
        "initial_before_last_user": False,
        "kept_as_text": False,
        "count_dropped_reasoning": False,
        "trigger_count": "estimate",
        "reasoning_estimate_factor": REASONING_ESTIMATE_FACTOR,
        "limit_of_raw_window": False,
        "apply_unlogged_edits": False,
        "restored_reasoning_uncounted": False,
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


def _client_version(client: str) -> str:
    """The Codex CLI version of a recording's client ("codex 0.144.2"); "" for a session of
    another client, which `preset_for` gives the newest preset."""
    words = client.split()
    return words[-1] if len(words) == 2 and words[0] == "codex" else ""


@register
class Codex046(Codex):
    """Codex CLI before 0.47 (0.40-0.42 recorded in ../shared/traces): a per-model limit of
    350,000 tokens and no window bound (`PRESETS`)."""

    name = "codex@0.46"
    version = "0.46"
    defaults: ClassVar[dict[str, Any]] = {**Codex.defaults, **PRESETS[0][1]}


@register
class Codex047(Codex):
    """Codex CLI 0.47-0.117: compact at a share of the logged window, keep every client
    message before the first human one (`PRESETS`)."""

    name = "codex@0.47"
    version = "0.47"
    defaults: ClassVar[dict[str, Any]] = {**Codex.defaults, **PRESETS[1][1]}


@register
class Codex0118(Codex):
    """Codex CLI 0.118-0.139: codex-rs's own count against 0.9 x the catalog window; the
    compacted history keeps each turn's last answer (`PRESETS`)."""

    name = "codex@0.118"
    version = "0.118"
    defaults: ClassVar[dict[str, Any]] = {**Codex.defaults, **PRESETS[2][1]}


@register
class Codex0140(Codex):
    """Codex CLI 0.140 on (recorded up to 0.146): 0.118's rules without the kept answers
    (`PRESETS`)."""

    name = "codex@0.140"
    version = "0.140"
    defaults: ClassVar[dict[str, Any]] = {**Codex.defaults, **PRESETS[3][1]}


@register
class CodexLatest(Codex0140):
    """`codex@latest`: the newest preset."""

    name = "codex@latest"


@register
class CodexMatched(MatchedVersion, Codex):
    """`codex`: each session under the preset of the Codex CLI version it was recorded with
    (`preset_for`; a session of another client or of an unknown version under the newest);
    parameters given to it apply over that preset, as `claude-code` does for Claude Code."""

    name = "codex"
    version = "matched"

    def preset_defaults(self, session: Session) -> dict[str, Any]:
        return {**Codex.defaults, **preset_for(_client_version(session.client))}

    def preset_session(self, ctx: SessionContext, params: dict[str, Any]) -> SessionPolicy:
        return CodexSession(ctx, params)
