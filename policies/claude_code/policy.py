"""Claude Code's context pipeline as a policy, with versioned presets.

Before each request, cheapest first (DESIGN.md section 4): 0 the tool-result budget, 1 snip,
2 microcompact, 3 context collapse, 4 autocompact. Every stage can be switched off and every
constant is a named parameter (`ctxsim policies show claude-code`); the presets fix them to
what a Claude Code version did:

* `claude-code@1.0`: 1.0.x: no tool-result budget yet; otherwise as 2.1.6.
* `claude-code@2.1.6`: the 2.1.5-2.1.9 behaviour: the autocompact reserve is the whole
  32,000-token max output, so compaction near 155k on a 200k window; 5-minute cache TTL.
* `claude-code@2.1.88`: reserve min(max output, 20,000), compaction at 167k; the stages
  gated off by default (snip, time-based and cached microcompact, collapse, the
  per-message budget, session memory) stay off; cache TTL as the recording wrote it.
* `claude-code`: the newest preset.

The agent's actions are replayed unchanged (open loop); the policy decides only what each
request sends: the conversation it keeps (policies/conversation.py), rewritten
by the stages, under the recorded system prefix.
"""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import ConversationSession
from policies.calibration.summary import BEYOND_FILE_RULE, compaction_output_tokens
from policies.claude_code.autocompact import Autocompact, Limits
from policies.claude_code.budget import Budget
from policies.claude_code.collapse import Collapse
from policies.claude_code.microcompact import Microcompact
from policies.claude_code.recorded import recorded_compactions
from policies.claude_code.snip import Snip
from simulator.policy import Call, Emitter, Policy, SessionContext, SessionPolicy, register
from simulator.view import Breakpoint, View, chain

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
    "autocompact.restore_extra_tokens": BEYOND_FILE_RULE,
    "autocompact.reattach_first_message": True,
    "autocompact.as_recorded_before": None,  # request: recorded compactions before it replayed
    "autocompact.skills_tokens": 0,
    "autocompact.session_memory.enabled": False,
    "autocompact.session_memory.min_tail_tokens": 10_000,
    "autocompact.session_memory.min_tail_text_messages": 5,
    "autocompact.session_memory.max_tail_tokens": 40_000,
    "autocompact.session_memory.memory_tokens": 4_000,
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
        self.limits: Limits = self.auto.limits(ctx.facts.window, ctx.facts.max_output)
        self._marks_of: list[int] = []
        self._marks_by_ttl: dict[int, list[Breakpoint]] = {}
        self.recorded = recorded_compactions(ctx.session, p["autocompact.as_recorded_before"])

    def on_enter(self, blocks: list[int]) -> None:
        self.budget.on_enter(self.conv, blocks)

    def breakpoints(self, view: View, ttl: int, *, fork: bool = False) -> list[Breakpoint]:
        """System markers, then one message marker on the last item (a fork such as the
        summary request marks the second-to-last: it reads the prefix, writes no tail).
        Unlike the base rule, the last item is marked even when it is in the prefix."""
        last = len(view.ids) - (2 if fork else 1)
        marks = self._system_marks(ttl)
        if marks and marks[-1].position > last:
            marks = [m for m in marks if m.position <= last]
        if last >= 0 and (not marks or marks[-1].position < last):
            return [*marks, Breakpoint(last, ttl)]
        return list(marks)

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

    def step(self, k: int, out: Emitter) -> None:
        conv = self.conv
        self.sync(k)
        ttl = self.ttl(k)
        self.warm_once(out)
        limits = self.limits
        estimate = self.estimate(k)
        estimate -= self.snip.run(conv, estimate, limits.effective)
        prev_end = self.ctx.ts_end[k - 1] if k else None  # last assistant message
        estimate -= self.micro.run(conv, self.ctx.ts[k], prev_end)
        flags: dict[str, bool] = {}
        if k in self.recorded and self.conv.items:
            # The recording's own compaction (the user's /compact happens whatever stages
            # are on). What it logged after its summary (the command lines, the next
            # prompt) came after the compaction: it stays.
            rec = self.recorded[k]
            after = [key for key in conv.items if key > rec.summary_block >= 0]
            conv.remove_blocks(set(after))
            flags.update(self._compact(out, ttl, rec.stage, rec.summary, attached=rec.attached))
            conv.append(after)
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
        elif self.auto.due(estimate, limits):
            snapshot = conv.sync().copy()
            if self.auto.session_memory(conv):
                self._memory_call(out, snapshot, ttl)
                self.auto.succeeded()
            else:
                flags.update(self._compact(out, ttl))
        view = conv.sync()
        if view.total > limits.blocking:
            flags["overflow"] = True
        self.send(k, out, view, flags)

    def _compact(
        self,
        out: Emitter,
        ttl: int,
        stage: str = "autocompact",
        summary: int | None = None,
        *,
        attached: int | None = None,
    ) -> dict[str, bool]:
        """A full compaction. With `attached` the tokens put back after the summary are
        given (a recorded compaction's), else they are modelled."""
        attempts = self.auto.compact(
            self.conv, self.ctx.rng, self.limits.window, summary, attached=attached
        )
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
            out.call(a.view, Call("compaction", name, marks, output))
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
        conv = self.conv
        before = conv.sync().copy()
        committed = self.collapse.commit_span(conv)
        if committed is None:
            return
        span, summary = committed
        view = before
        view.append(-1, chain(conv.ctx.root, 0xC011), int(self.p["collapse.prompt_tokens"]))
        out.call(
            view, Call("compaction", "collapse", self.breakpoints(view, ttl, fork=True), summary)
        )
        del span


class ClaudeCode(Policy):
    """Claude Code's five-stage context pipeline (parameters: see BASE)."""

    name = "claude-code"
    version = "2.1.88"
    defaults: ClassVar[dict[str, Any]] = dict(BASE)

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
        "budget.enabled": False,
        "autocompact.reserve_cap_tokens": None,
        "autocompact.threshold_fraction": 0.92,
        "autocompact.analysis_stripped": False,
        "autocompact.reattach_first_message": False,
    }


@register
class ClaudeCodeNewest(ClaudeCode):
    """`claude-code`: the newest preset."""

    name = "claude-code"
    version = "2.1.88"


def preset_for(client: str) -> str:
    """The preset matching a recording's client ("claude-code 2.1.29" -> its version's)."""
    version = client.split()[-1] if client.strip() else ""
    try:
        parts = tuple(int(x) for x in version.split("."))
    except ValueError:
        return ClaudeCodeNewest.name
    if parts < (2,):
        return ClaudeCode10.name
    if parts <= (2, 1, 9):
        return ClaudeCode216.name
    return ClaudeCode2188.name
