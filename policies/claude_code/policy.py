"""Claude Code's context pipeline as a policy, with versioned presets.

Before each request, cheapest first (DESIGN.md section 4): 0 the tool-result budget, 1 snip,
2 microcompact, 3 context collapse, 4 autocompact. Every stage can be switched off and every
constant is a named parameter (`ctxsim policies show claude-code`); the presets fix them to
what a Claude Code version did:

* `claude-code@1.0`: 1.0.x: no tool-result budget yet; otherwise as 2.1.6.
* `claude-code@2.1.6`: the 2.1.5-2.1.9 behaviour: the autocompact reserve is the whole
  32,000-token max output, so compaction near 155k on a 200k window; 5-minute cache TTL.
* `claude-code@2.1.88`: 2.1.10-2.1.91: reserve min(max output, 20,000), compaction at 167k,
  on at most 200k even on a 1M model; the stages gated off by default (snip, time-based
  and cached microcompact, collapse, the per-message budget, session memory) stay off;
  cache TTL as the recording wrote it.
* `claude-code@2.1.92`: 2.1.92-2.1.143: 1M windows in full, Opus 4.6's capped at 400k.
* `claude-code@2.1.144`: 2.1.144-2.1.199: plus the thrashing detector.
* `claude-code@2.1.221`: 2.1.200 on: CLAUDE_CODE_AUTO_COMPACT_WINDOW's clamp and its
  100k-199k hole, sonnet-5's 967k; `claude-code@latest` is this newest preset.
* `claude-code`: each session under the preset of its own recorded version.

Claude Code's settings are parameters under their real names (settings.py), so
`-P CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=60` is the what-if of that line in a settings.json.

The agent's actions are replayed unchanged (open loop); the policy decides only what each
request sends: the conversation it keeps (policies/conversation.py), rewritten
by the stages, under the recorded system prefix.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from policies.base import ConversationSession, MatchedVersion, previous_message_end, ttl_ms
from policies.calibration.summary import BEYOND_FILE_RULE, compaction_output_tokens
from policies.claude_code.autocompact import Autocompact, Limits
from policies.claude_code.budget import Budget
from policies.claude_code.collapse import Collapse
from policies.claude_code.microcompact import Microcompact
from policies.claude_code.params import PARAMS
from policies.claude_code.recorded import recorded_compactions
from policies.claude_code.settings import client_window, env_truthy, standard_window_from
from policies.claude_code.snip import Snip
from policies.prompt_suggestion import post_turn_writes
from simulator.model import Session, version_tuple
from simulator.models import STANDARD_WINDOW
from simulator.params import Declarations
from simulator.policy import (
    Call,
    Emitter,
    Policy,
    SessionContext,
    SessionPolicy,
    register,
)
from simulator.policy import Limits as StatedLimits
from simulator.view import ANTHROPIC_LOOKBACK, MAX_BREAKPOINTS, Breakpoint, View, chain

COMPACTABLE_TOOLS = [
    "Read",
    "Bash",
    "PowerShell",
    "Grep",
    "Glob",
    "WebSearch",
    "WebFetch",
    "Edit",
    "Write",
]

BASE: dict[str, Any] = {
    "cache.ttl": "recorded",  # "5m", "1h" or "recorded" (each request's recorded TTL)
    "prefix_resets": True,
    "warm_start": True,
    "prompt_suggestion": True,
    "budget.enabled": True,
    "budget.max_result_chars": 50_000,
    "budget.tool_limits": {"Bash": 30_000, "Grep": 20_000, "Read": None},
    "budget.preview_chars": 2_000,
    "budget.per_message.enabled": False,
    "budget.per_message.max_chars": 200_000,
    "snip.enabled": False,
    "snip.trigger_fraction": 0.85,
    "snip.target_fraction": 0.70,
    "snip.keep_head_groups": 2,
    "snip.keep_tail_groups": 10,
    "microcompact.tools": COMPACTABLE_TOOLS,
    "microcompact.time_based.enabled": False,
    "microcompact.time_based.gap_minutes": 60,
    "microcompact.time_based.keep": 5,
    "microcompact.cached.enabled": False,
    "microcompact.cached.trigger_count": 12,
    "microcompact.cached.keep": 5,
    "collapse.enabled": False,
    "collapse.commit_fraction": 0.90,
    "collapse.block_fraction": 0.95,
    "collapse.span_groups": 10,
    "collapse.summary_ratio": 0.1,
    "collapse.keep_tail_groups": 10,
    "collapse.prompt_tokens": 500,
    "autocompact.enabled": True,
    "autocompact.buffer_tokens": 13_000,
    "autocompact.threshold_fraction": None,  # a share of the effective window instead
    "autocompact.max_output_tokens": 32_000,
    "autocompact.reserve_cap_tokens": 20_000,
    "autocompact.warning_offset_tokens": 20_000,
    "autocompact.blocking_offset_tokens": 3_000,
    "autocompact.summary_prompt_tokens": 700,
    "autocompact.summary_tokens": None,  # None: drawn from the calibration (seeded)
    "autocompact.analysis_stripped": True,
    "autocompact.ptl_retries": 3,
    "autocompact.ptl_drop_fraction": 0.2,
    "autocompact.breaker_failures": 3,
    "autocompact.failure_probability": 0.0,
    "autocompact.restore_files": 5,
    "autocompact.restore_file_tokens": 5_000,
    "autocompact.restore_total_tokens": 50_000,
    "autocompact.restore_reference_tokens": None,  # None: an oversize file is cut to the cap
    "autocompact.restore_extra_tokens": BEYOND_FILE_RULE,
    "autocompact.reattach_first_message": True,
    "autocompact.preserve_tail_groups": 0,  # newest API-round groups kept verbatim (2.1.2xx)
    "autocompact.estimate_recounts_response": False,  # 2.1.2xx: see autocompact.py
    "autocompact.estimate_padding": 1.0,  # 2.1.2xx: 4/3 on what the usage does not hold
    "autocompact.estimate_logged_output": True,  # the usage's output_tokens as logged
    "autocompact.as_recorded_before": None,  # request: recorded compactions before it replayed
    "autocompact.skills_tokens": 0,
    "autocompact.invoked_skills": False,  # 2.1.2xx: the Skill tool's skills attached again
    "autocompact.skill_cap_tokens": 5_000,
    "autocompact.skills_budget_tokens": 25_000,
    "autocompact.restore_session_tokens": False,  # 2.1.2xx: the session's own tokenizer
    "autocompact.skill_listing_tokens": None,  # 2.1.2xx: the listing is not sent again
    "autocompact.skill_listing_recorded": False,  # 2.1.2xx: its size as the recording logged
    "autocompact.session_memory.enabled": False,
    "autocompact.session_memory.min_tail_tokens": 10_000,
    "autocompact.session_memory.min_tail_text_messages": 5,
    "autocompact.session_memory.max_tail_tokens": 40_000,
    "autocompact.session_memory.memory_tokens": 4_000,
    # Which window autocompact computes on, and its newer rules (settings.py).
    "window_1m": None,  # None: as the recording shows; true / false: the 1M window on / off
    "autocompact.window_cap_tokens": 200_000,  # None: none; 2.1.x before 2.1.92: 200k
    "autocompact.window_cap_models": "",  # regex of the models the cap applies to; "": all
    "autocompact.model_windows": {},  # model regex -> its own autocompact window
    "autocompact.env_window_min_tokens": 100_000,
    "autocompact.env_window_max_tokens": 1_000_000,
    "autocompact.env_window_disables_below": None,  # a set window below this: autocompact off
    "autocompact.pct_format": "percent",
    "autocompact.thrashing.enabled": False,
    "autocompact.thrashing.requests": 3,
    "autocompact.thrashing.times": 3,
    "autocompact.call_ttl": "request",  # TTL of the summary call's writes; "request": its own
    # Claude Code's settings under their real names, values as a settings.json env block
    # writes them (None: not set).
    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": None,
    "CLAUDE_CODE_AUTO_COMPACT_WINDOW": None,
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": None,
    "DISABLE_AUTO_COMPACT": None,
    "DISABLE_COMPACT": None,
    "autoCompactEnabled": True,
}


class _State(ConversationSession):
    """The pipeline over the shared conversation mechanics (policies/base.py): history
    sync, warm start, estimate, sending; the stages run between sync and send."""

    def __init__(self, ctx: SessionContext, p: dict[str, Any]) -> None:
        self.budget = Budget(p)  # before the base syncs anything: on_enter uses it
        super().__init__(ctx, p)
        self.snip = Snip(p)
        self.micro = Microcompact(p)
        self.collapse = Collapse(p)
        self.auto = Autocompact(p)
        model = ctx.models[0] if ctx.models else ""
        blocking = self.auto.limits(STANDARD_WINDOW, ctx.facts.max_output).blocking
        window, allowed = client_window(ctx.session, model, ctx.facts.window, p, blocking=blocking)
        self.auto.enabled = self.auto.enabled and allowed
        self.limits_: Limits = self.auto.limits(window, ctx.facts.max_output)
        #: Before this request another client process sent the recording, on its own
        #: longer window (settings.py `standard_window_from`): `limits_sent` apply.
        self.standard_from = 0
        self.limits_sent = self.limits_
        if p["window_1m"] is None and window < ctx.facts.window:
            self.standard_from = standard_window_from(ctx.session)
            if self.standard_from:
                sent, _ = client_window(ctx.session, model, ctx.facts.window, p, as_sent=True)
                self.limits_sent = self.auto.limits(sent, ctx.facts.max_output)
        self._next = 0  # the request the engine asks `limits` for (it asks before `step`)
        self._current = self.limits_
        #: The stated limits `limits` returns, by (limits, autocompact on): made once, not
        #: per request (the engine asks before every request).
        self._stated: dict[tuple[int, bool], StatedLimits] = {}
        self.recounts_response = bool(p["autocompact.estimate_recounts_response"])
        self.padding = float(p["autocompact.estimate_padding"])
        #: Per request, the output tokens the trigger adds (the logged ones where the
        #: request has usage, else -1: the policy's own count), or None: its own count.
        self.logged_output: list[int] | None = None
        if p["autocompact.estimate_logged_output"]:
            r = ctx.session.requests
            self.logged_output = np.where(r["has_usage"], r["output_recorded"], -1).tolist()
        # Read once for the per-request path (`step`).
        self._ts = ctx.ts
        self._ts_end = ctx.ts_end
        self._micro_on = self.micro.time_based or self.micro.cached
        self._ttl_now = 0  # request k's TTL, read once by `transform` for `step`
        self.compact_off = env_truthy(p["DISABLE_COMPACT"])
        self.call_ttl = str(p["autocompact.call_ttl"])
        self._marks_of: list[int] = []
        self._marks_by_ttl: dict[int, list[Breakpoint]] = {}
        self.recorded = recorded_compactions(ctx.session, p["autocompact.as_recorded_before"])
        #: Requests a new client process sent first (autocompact.py `Autocompact.restart`).
        self.restarts = frozenset(ctx.session.restarted_at)
        self.post_turn = post_turn_writes(ctx.session) if p["prompt_suggestion"] else {}
        self._roles: list[int] = ctx.session.blocks["role"].tolist()
        #: The item the previous request's final message marker was on (`breakpoints`).
        self._final_mark: int | None = None
        self._final_at = -1  # its index among the items then

    def _suggestion_write(self, k: int, out: Emitter) -> None:
        """The prompt-suggestion fork (policies/prompt_suggestion.py) wrote the
        conversation through the response that ended the last turn, at that response's
        end, with the TTL of the request before: where this policy's conversation still
        holds that response, the entry is there for request k to read (not priced: the
        fork is not in the recording, as under as-recorded)."""
        conv = self.conv
        i = conv.find_recent(self.post_turn[k])  # the last turn's response: near the end
        if i is not None:
            out.written(conv.sync(), conv.n_prefix + i, self._ts_end[k - 1], self.ttl(k - 1))

    def on_enter(self, blocks: list[int]) -> None:
        self.budget.on_enter(self.conv, blocks)

    def estimate(self, k: int) -> int:
        """The trigger's estimate (policies/base.py's, inlined: it runs every request);
        from 2.1.2xx plus length/4 of the last response's blocks after its first line
        (autocompact.py: the client's walk back to the response's first line counts its
        later lines again), and the part the last usage does not hold padded by
        `autocompact.estimate_padding` (autocompact.py: 4/3 in 2.1.2xx)."""
        conv = self.conv
        last_total = self.last_total
        if last_total is None:
            return conv.total()
        origin, estimate_chars = conv.origin, conv.estimate_chars
        previous = k - 1
        newer = 0
        again: list[int] = []
        for key in self.since_last:
            if key < 0 or origin[key] != previous:
                newer += estimate_chars(key) // 4
            else:
                again.append(key)
        known = last_total + self.last_output
        estimate = known + newer
        logged = self.logged_output
        if logged is not None and logged[previous] >= 0:
            # The usage as the client held it: a streaming snapshot's output_tokens.
            estimate += logged[previous] - self.last_output
            known = last_total + logged[previous]
        if self.recounts_response and len(again) > 1:
            estimate += sum(estimate_chars(key) // 4 for key in again[1:])
        if self.padding == 1.0:
            return estimate
        return known + math.ceil((estimate - known) * self.padding)

    def limits(self) -> StatedLimits:
        """Where this session compacts and blocks: collapse's commit and blocking points
        when collapse is on, else autocompact's threshold while it is on (not tripped, not
        switched off by a setting or the version's window rule) and the blocking limit."""
        lim = self.limits_sent if self._next < self.standard_from else self.limits_
        on = self.auto.enabled and not self.auto.tripped
        key = (id(lim), on)
        stated = self._stated.get(key)
        if stated is None:
            if self.collapse.enabled:
                stated = StatedLimits(
                    math.floor(self.collapse.commit * lim.effective),
                    math.floor(self.collapse.block * lim.effective),
                )
            else:
                stated = StatedLimits(lim.threshold if on else None, lim.blocking)
            self._stated[key] = stated
        return stated

    def _limits_at(self, k: int) -> Limits:
        """The limits of the client process that sent request k."""
        return self.limits_sent if k < self.standard_from else self.limits_

    def breakpoints(self, view: View, ttl: int, *, fork: bool = False) -> list[Breakpoint]:
        """System markers, then one message marker on the last item (a fork such as the
        summary request marks the second-to-last: it reads the prefix, writes no tail),
        and on the message before it where the last one's lookback cannot reach what the
        previous request wrote (`_previous_message_mark`). Unlike the base rule, the last
        item is marked even when it is in the prefix."""
        last = len(view.ids) - (2 if fork else 1)
        marks = self._system_marks(ttl)
        if marks and marks[-1].position > last:
            marks = [m for m in marks if m.position <= last]
        if last >= 0 and (not marks or marks[-1].position < last):
            if fork:
                return [*marks, Breakpoint(last, ttl)]
            before = self._previous_message_mark(view, last)
            conv = self.conv
            at = last - conv.n_prefix
            self._final_mark = conv.items[at] if at >= 0 else None
            self._final_at = at
            if before < 0:
                return [*marks, Breakpoint(last, ttl)]
            kept = marks[-(MAX_BREAKPOINTS - 2) :]
            return [*kept, Breakpoint(before, ttl), Breakpoint(last, ttl)]
        return list(marks)

    def _previous_message_mark(self, view: View, last: int) -> int:
        """The view position of the last block of the message before the last one, where
        a marker there changes what this request reads, else -1: Claude Code marks the last
        two messages (policies/as_recorded.py `_previous_message_mark` has the source and
        the evidence), so a turn that adds more blocks than the lookback
        (simulator/view.py ANTHROPIC_LOOKBACK) still reads the previous request's entry
        through the assistant message's marker (promptgrimoire request 229 of
        ../shared/traces/claude-code, 24 blocks: under one marker this pipeline read only
        the 36k prefix of its 143k). Placed, as there, only where the final marker's
        lookback misses the previous request's final marker or the prefix was re-chained
        onto an older thinking mode's entries; elsewhere it would only write what the final
        one writes too (and take the place of a prefix marker: the API allows 4)."""
        conv = self.conv
        n = conv.n_prefix
        previous = self._final_mark
        at: int | None = None
        if previous is not None:
            at = self._final_at
            items = conv.items
            if not (at < len(items) and items[at] == previous):
                at = conv.find_recent(previous)  # items left or moved since: near the end
        if not conv.prefix.restored and (at is None or last - (n + at) <= ANTHROPIC_LOOKBACK):
            return -1
        return previous_message_end(view.ids, n, self._roles, conv.kinds)

    def _system_marks(self, ttl: int) -> list[Breakpoint]:
        """The system markers (ascending) with `ttl`: made once per TTL, not per request,
        until a prefix reset gives the conversation new marks."""
        if self.conv.marks is not self._marks_of:
            self._marks_of = self.conv.marks
            self._marks_by_ttl.clear()
        marks = self._marks_by_ttl.get(ttl)
        if marks is None:
            marks = self._marks_by_ttl[ttl] = [Breakpoint(p, ttl) for p in self._marks_of]
        return marks

    def transform(self, k: int, out: Emitter) -> dict[str, bool]:
        """The five stages before request k (the shared step, policies/base.py, syncs,
        warms and sends): snip and microcompact trim, then the recording's own compaction,
        collapse, or autocompact when due."""
        conv = self.conv
        if k in self.post_turn:  # the prompt suggestion sent when the last turn ended
            self._suggestion_write(k, out)
        ttl = self._ttl_now = self.ttl(k)
        limits = self._current = self.limits_sent if k < self.standard_from else self.limits_
        estimate = self.estimate(k)
        if self.snip.enabled:
            estimate -= self.snip.run(conv, estimate, limits.effective)
        if self._micro_on:
            prev_end = self._ts_end[k - 1] if k else None  # last assistant message
            estimate -= self.micro.run(conv, self._ts[k], prev_end)
        flags: dict[str, bool] = {}
        recorded = k in self.recorded and conv.items and not self.compact_off
        restarted = k in self.restarts
        if restarted:  # a new process: before its compaction, and its prompt's listing
            self.auto.restart(k)
            if not recorded:
                self.auto.announce_listing(conv)
        if recorded:
            # The recording's own compaction (the user's /compact happens whatever stages
            # are on). What it logged after its summary (the command lines, the next
            # prompt) came after the compaction: it stays.
            rec = self.recorded[k]
            after = [key for key in conv.items if key > rec.summary_block >= 0]
            conv.remove_blocks(set(after))
            flags.update(
                self._compact(
                    out, ttl, rec.stage, rec.summary, attached=rec.attached, at_ms=rec.at_ms
                )
            )
            conv.append(after)
            if restarted:
                self.auto.announce_listing(conv)
        elif self.collapse.enabled:
            while self.collapse.due(estimate, limits.effective):
                size = conv.total()
                self._collapse(out, ttl)
                freed = size - conv.total()
                if freed <= 0:
                    break
                estimate -= freed
            if self.collapse.blocked(estimate, limits.effective):
                flags["overflow"] = True
        elif estimate >= limits.threshold and self.auto.due(estimate, limits):
            snapshot = conv.sync().copy()
            if self.auto.session_memory(conv):
                self._memory_call(out, snapshot, ttl)
                self.auto.succeeded()
            else:
                flags.update(self._compact(out, ttl))
                if self.auto.thrashing(k):
                    flags["breaker_trip"] = True
        self._next = k + 1
        return flags

    def blocking_limit(self) -> int:
        """The client's blocking limit for this request (`_limits_at`), not the window."""
        return self._current.blocking

    def _compact(
        self,
        out: Emitter,
        ttl: int,
        stage: str = "autocompact",
        summary: int | None = None,
        *,
        attached: int | None = None,
        at_ms: tuple[int, int] | None = None,
    ) -> dict[str, bool]:
        """A full compaction. With `attached` the tokens put back after the summary are
        given (a recorded compaction's), else they are modelled; with `at_ms` its calls go
        out when the recording's did (else at the request's time)."""
        attempts = self.auto.compact(
            self.conv, self.ctx.rng, self._current.window, summary, attached=attached
        )
        if self.call_ttl != "request":
            ttl = ttl_ms(self.call_ttl, ttl)
        for a in attempts:
            if a.view is None:
                continue  # refused as too long: an API error, not billed
            output = (
                compaction_output_tokens(a.output_tokens, analysis_stripped=self.stripped_analysis)
                if a.ok
                else 0
            )
            name = stage if a.ok else f"{stage}-failed"
            marks = self.breakpoints(a.view, ttl, fork=True)
            out.call(a.view, Call("compaction", name, marks, output, at_ms=at_ms))
        if attempts and attempts[-1].ok:
            self.since_last = []
        return {"breaker_trip": True} if self.auto.record(attempts) else {}

    def _memory_call(self, out: Emitter, before: View, ttl: int) -> None:
        """Session-memory compaction sends no summary request; the memory it installs was
        written by a background extraction call, priced here as one fork of the
        conversation (its output is the memory)."""
        before.append(
            -1, chain(self.ctx.root, 0x5E55), int(self.p["autocompact.summary_prompt_tokens"])
        )
        memory = int(self.p["autocompact.session_memory.memory_tokens"])
        out.call(
            before,
            Call("compaction", "session-memory", self.breakpoints(before, ttl, fork=True), memory),
        )
        self.since_last = []

    @property
    def stripped_analysis(self) -> bool:
        return bool(self.p["autocompact.analysis_stripped"])

    def _collapse(self, out: Emitter, ttl: int) -> None:
        """Commit the next span and price its summary request: the conversation before
        the commit, forked with the summary prompt. The commit changes the items, not the
        view (it is re-chained at the next sync), so the request is the live view with
        the prompt appended, and the prompt is taken off after it is priced: no copy of
        the whole view per commit (issue 16: that copy was most of what still grew with
        the session once the span search was indexed)."""
        conv = self.conv
        span = self.collapse.span(conv)
        if span is None:
            return
        view = conv.sync()
        summary = self.collapse.replace(conv, span)
        n = len(view)
        view.append(-1, chain(conv.ctx.root, 0xC011), int(self.p["collapse.prompt_tokens"]))
        out.call(
            view, Call("compaction", "collapse", self.breakpoints(view, ttl, fork=True), summary)
        )
        view.truncate(n)


class ClaudeCode(Policy):
    """Claude Code's five-stage context pipeline (parameters: see BASE)."""

    name = "claude-code"
    version = "2.1.88"
    defaults: ClassVar[dict[str, Any]] = dict(BASE)
    declared: ClassVar[Declarations] = PARAMS  # policies/claude_code/params.py

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _State(ctx, self.params)


@register
class ClaudeCode2188(ClaudeCode):
    """Claude Code 2.1.88: reserve min(max output, 20,000), compaction at 167k on 200k."""

    name = "claude-code@2.1.88"
    version = "2.1.88"


@register
class ClaudeCode216(ClaudeCode):
    """Claude Code 2.1.5-2.1.9: the whole 32,000 max output reserved (compaction near 155k),
    5-minute cache TTL."""

    name = "claude-code@2.1.6"
    version = "2.1.6"
    defaults: ClassVar[dict[str, Any]] = {
        **BASE,
        "cache.ttl": "5m",
        "autocompact.reserve_cap_tokens": None,
    }


@register
class ClaudeCode10(ClaudeCode):
    """1.0.x (1.0.53 recorded in ../shared/traces): no tool-result budget yet, the whole
    32,000-token max output reserved, compaction at 92% of the 168,000-token effective
    window (154,560: the six 1.0.53 auto-compactions put the threshold between 154,390
    and 154,558 plus the newer content's estimate), summaries kept their <analysis>
    section, the first-message context is not attached again, 5-minute TTL."""

    name = "claude-code@1.0"
    version = "1.0.53"
    defaults: ClassVar[dict[str, Any]] = {
        **BASE,
        "cache.ttl": "5m",
        "prompt_suggestion": False,
        "budget.enabled": False,
        "autocompact.reserve_cap_tokens": None,
        "autocompact.threshold_fraction": 0.92,
        "autocompact.analysis_stripped": False,
        "autocompact.reattach_first_message": False,
        "autocompact.estimate_logged_output": False,
    }


@register
class ClaudeCode2192(ClaudeCode):
    """Claude Code 2.1.92-2.1.143 (recorded 2026-04 to 2026-05): 1M windows are computed on
    in full, except that Opus 4.6's autocompact window is capped at 400,000
    (claude-code#43989: 2.1.91 ran 600k+ without compacting, 2.1.92 shows 25.7k/400k;
    compaction at 367k); the summary call writes 5-minute entries (every recorded
    compaction call did). ../shared/traces/claude-code/git-sync (Opus 4.7, 2.1.123-2.1.143)
    reaches 626k without a compaction, so the cap is not applied to Opus 4.7 here
    although claude-code#54056 saw it there on 2.1.119."""

    name = "claude-code@2.1.92"
    version = "2.1.92"
    defaults: ClassVar[dict[str, Any]] = {
        **BASE,
        "autocompact.window_cap_tokens": 400_000,
        "autocompact.window_cap_models": "claude-opus-4-6",
        "autocompact.call_ttl": "5m",
    }


@register
class ClaudeCode21144(ClaudeCode):
    """Claude Code 2.1.144-2.1.199 (2026-05 to 2026-07): 2.1.92's rules plus the thrashing
    detector (autocompact off after the context refilled to the threshold within 3 requests
    of the previous compaction, 3 times in a row; first reported on 2.1.144,
    claude-code#60485). 2.1.144 also counted MCP tool definitions into the trigger so that
    it fell to ~74k with MCP servers (claude-code#61334); no recording here has MCP tools,
    so that over-count is not modelled."""

    name = "claude-code@2.1.144"
    version = "2.1.144"
    defaults: ClassVar[dict[str, Any]] = {
        **ClaudeCode2192.defaults,
        "autocompact.thrashing.enabled": True,
    }


@register
class ClaudeCode21221(ClaudeCode):
    """Claude Code 2.1.2xx (2.1.200 on, 2026-07 on; rules of the 2.1.221 decompile,
    BaseInfinity/claude-sdlc-harness#520): window = min(model window,
    CLAUDE_CODE_AUTO_COMPACT_WINDOW clamped to 100k-1M), no 400k cap; threshold =
    min(floor((window - reserve) x pct), window - reserve - 13,000) with the reserve (the
    "system overhead") min(max output, 20,000); a set window of 100k-199,999 turns
    autocompact off; claude-sonnet-5's own autocompact window is 967,000; the thrashing
    detector; 5-minute entries for the summary call. Recorded: the four auto-compactions
    of 2.1.226 in ../shared/traces/claude-code/flutter-docker fire at 166.6k-213.0k.
    The first message's context is not attached again: the recorded context after
    (flutter-docker's two /compact, 2.1.228 and 2.1.232: 58,061 and 65,611) is the prefix (42,855,
    first message included) plus postTokens (12,324 and 13,415) and a few thousand
    tokens, no room for a second copy of its 17.7k first message; the replay lands 2.7%
    and 3.0% over without it, 30-33% over with it (policies/calibration/README.md). After a
    compaction the first message's skill listing is not sent again (4,000 tokens, the
    client's figure), a file over the 5,000-token cap comes back as a 60-token reference,
    the skills the Skill tool loaded come back, and the calibrated sizes are in the
    session's own tokens per cl100k token (autocompact.py: the attachments after the eight
    2.1.2xx compactions of ../shared). The trigger's estimate counts the last response's
    later lines again and pads what the last usage does not hold by 4/3 (autocompact.py:
    390ab778 fired at 166,612 and 166,907 by its logged, unpadded preTokens and not at
    166,150)."""

    name = "claude-code@2.1.221"
    version = "2.1.221"
    defaults: ClassVar[dict[str, Any]] = {
        **BASE,
        "autocompact.window_cap_tokens": None,
        "autocompact.model_windows": {"^claude-sonnet-5$": 967_000},
        "autocompact.env_window_disables_below": 200_000,
        "autocompact.thrashing.enabled": True,
        "autocompact.call_ttl": "5m",
        "autocompact.reattach_first_message": False,
        "autocompact.preserve_tail_groups": 1,
        "autocompact.restore_reference_tokens": 60,
        "autocompact.skill_listing_tokens": 4_000,
        "autocompact.skill_listing_recorded": True,
        "autocompact.invoked_skills": True,
        "autocompact.restore_session_tokens": True,
        "autocompact.estimate_recounts_response": True,
        "autocompact.estimate_padding": 4 / 3,
    }


@register
class ClaudeCodeLatest(ClaudeCode21221):
    """`claude-code@latest`: the newest preset."""

    name = "claude-code@latest"


#: Each preset and the first client version it models, oldest first.
VERSIONED: list[tuple[tuple[int, ...], type[ClaudeCode]]] = [
    ((0,), ClaudeCode10),
    ((2,), ClaudeCode216),
    ((2, 1, 10), ClaudeCode2188),
    ((2, 1, 92), ClaudeCode2192),
    ((2, 1, 144), ClaudeCode21144),
    ((2, 1, 200), ClaudeCode21221),
]


def preset_for(client: str) -> str:
    """The preset matching a recording's client ("claude-code 2.1.29" -> its version's;
    an unreadable version: the newest)."""
    parts = version_tuple(client)
    if not parts:
        return ClaudeCodeLatest.name
    chosen: type[ClaudeCode] = ClaudeCodeLatest
    for first, preset in VERSIONED:
        if parts >= first:
            chosen = preset
    return chosen.name


@register
class ClaudeCodeMatched(MatchedVersion, ClaudeCode):
    """`claude-code`: each session under the preset of its own recorded version
    (`Session.client`, see `preset_for`); parameters given to it apply over that preset."""

    name = "claude-code"
    version = "matched"

    def preset_defaults(self, session: Session) -> dict[str, Any]:
        return dict(_PRESETS[preset_for(session.client)].defaults)

    def preset_session(self, ctx: SessionContext, params: dict[str, Any]) -> SessionPolicy:
        return _State(ctx, params)


_PRESETS: dict[str, type[ClaudeCode]] = {cls.name: cls for _, cls in VERSIONED} | {
    ClaudeCodeLatest.name: ClaudeCodeLatest
}
