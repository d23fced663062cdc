"""Stage 4, autocompact (Claude Code 2.1.88; older presets change the reserve).

reserve = min(model max output, 20,000) (p99.99 of summaries is 17,387; 2.1.5-2.1.9
reserved the whole 32,000 max output); effective window = window - reserve; threshold =
effective - 13,000 buffer (1.0.x: 92% of the effective window, 154,560 on 200k); blocking
limit = effective - 3,000. The trigger compares an
estimate: the last API usage (input + cache read + cache write + output) plus length/4 of
newer messages (images 2,000 tokens), minus what snip freed.

2.1.2xx counts more (`autocompact.estimate_recounts_response`, preset claude-code@2.1.221):
the client walks back from the last line with usage to the first line of that response
(one line per content block, all with its message id) and estimates every message after
that first line, so the response's later blocks are counted again on top of the output
tokens that already hold them. The recorded preTokens (the same estimate, logged) show it:
../shared/traces/claude-code/flutter-docker 390ab778 (2.1.226) logged 167,009, 166,612 and
166,907 where usage plus length/4 from the first line gives 167,008, 166,623 and 166,906,
and from the last line 166,880, 165,235 and 166,871. promptgrimoire ffc93f57 (2.1.29)
logged 167,325 and 168,167: from the last line 167,321 and 168,167, from the first
167,351 and 168,247, so 2.1.29 counted from the last line.

The usage is the one the client held, which is the one it logged
(`autocompact.estimate_logged_output`): 2.1.x before 2.1.92 logs each line with a streaming
snapshot whose output_tokens is 1-8 (DESIGN.md 2), and ffc93f57's preTokens hold exactly
that: 167,320 + 1 (+ 4) and 168,166 + 1, where the responses' own output, counted by the
tokenizer, is 242 and 131 tokens (the replay's 168,297 at 269 against the logged
168,167). At request 162 the counted output (514) puts the estimate at 167,037, over the
trigger, where the client did not compact; the logged 1 gives 166,524, and the client
compacted on the next request. 1.0.53 logs no preTokens and its threshold was read with
the counted output (policies/calibration/README.md), so claude-code@1.0 keeps that.

2.1.2xx also pads what the last usage does not hold (`autocompact.estimate_padding`, 4/3
in claude-code@2.1.221): the trigger compares usage + output + ceil(4/3 x length/4 of the
messages after the response's first line) with the 167,000 threshold, while the logged
preTokens is the same sum unpadded. 390ab778 fired at requests 147, 244 and 354 (preTokens
167,009, 166,612, 166,907) and did not at 146 and 353, whose unpadded estimates are
166,135 and 166,150; unpadded, 167,000 misses 244 (166,611) and 354 (166,906). With usage
+ output of 166,759, 165,174, 166,256, 165,445, 166,083 and the newer part 249, 1,437,
650, 690, 67 (in that order), a factor f fits all five decisions exactly when
1.2707 <= f < 2.2536; 4/3 gives 167,091, 167,090 and 167,123 (fire) and 166,365 and
166,173 (no fire). 4/3 is not fitted: it is the client's own conservative padding of
estimated messages (2.1.88 pads microcompact's estimate by 4/3; the reading of the
client's tokens code in manavgup.github.io/shipai, "Context & Autocompact", describes the
threshold check's estimate of messages since the last usage as length/4 with 4/3
padding). The other reading, an undocumented threshold in (166,150, 166,612] (a
server-tuned window, claude-code#86863, says the default window can change without a
release), would need a constant read off this one session. Only flutter-docker holds
2.1.2xx auto-compactions, so the rule is in-sample there; the older presets are not
padded, as nothing recorded before 2.1.200 asks for it.

Compaction: session-memory compaction first when enabled (keep a tail of at least 10,000
tokens and 5 text messages, at most 40,000; the session memory replaces the rest), else a
full compaction: one summary request of its own (no tools), whose cache marker sits on the
second-to-last item so it reads the conversation's cached prefix without writing its tail.
A prompt that is too long is retried up to 3 times, each time dropping the oldest
API-round groups until it fits; other failures come from a seeded probability. After 3
consecutive failed compactions the circuit breaker turns autocompact off for the session;
a success resets the count. After compaction the conversation is the summary, up to 5
recently touched files (5,000 tokens each, 50,000 in all) at their whole size as the
transcript shows it (a Read result scaled to the file's line count, a Write's content, the
file after an Edit: `Session.blocks["file_tokens"]`), and invoked skills; the policy adds
the measured rest (policies/calibration/README.md: 1.0.53's restores are this rule within
a few hundred tokens in four of six compactions). 2.1.2xx keeps the newest API-round
group verbatim after the summary (`autocompact.preserve_tail_groups`) and does not attach
the first message again (preset claude-code@2.1.221).

What 2.1.2xx attaches after a compaction, as flutter-docker 390ab778 (2.1.226, Opus 5)
logs it in attachment lines after each compact_boundary: up to 5 `file` attachments with
the file's whole content, re-read from disk (android.Dockerfile: read 50 of its 237
lines, attached whole); a file too big for the 5,000-token cap is not cut but named by a
`compact_file_reference` (the four references, build.yml, research.md, update-version.yml
and a 419-line design.md, are files last read in part whose line counts put them above
5,000 tokens; the 19 attached files are all below it), `autocompact.restore_reference_tokens`;
`invoked_skills` (1.6k-4.8k tokens by length/4, growing with each compaction),
`deferred_tools_delta`, `agent_listing_delta` and `mcp_instructions_delta` (the same
17.5k characters, about 4.4k tokens, after each of the last three: the tool, agent and MCP
announcements sent again) and hook output. The reference rule is off in the preset: alone
it takes 94's context after from +15% to -1% of the recording but 147 and 354 to -14%,
because two other parts are still missing: the re-sent announcements and skills above,
and Opus 5's summaries, 5.9k-7.1k tokens (raw count x 1.207) against the fit's median of
2,915 (1.0.53 and 2.1.29; 2.1.232 Opus 4.6 in entirecontext: 2.3k-2.7k), a model effect
that only flutter-docker holds and that cannot be fitted leave-one-source-out.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from policies.calibration.summary import recent_file_sizes, summary_tokens
from policies.claude_code.settings import env_truthy, pct_share
from policies.conversation import Conversation
from simulator.model import Kind
from simulator.view import View, chain


@dataclass
class Limits:
    window: int
    reserve: int
    effective: int
    threshold: int
    warning: int
    blocking: int


@dataclass
class Attempt:
    """What a compaction did: its request view (if one was sent) and the outcome."""

    view: View | None
    output_tokens: int
    ok: bool
    reason: str  # "", "prompt-too-long", "failure"


def limits_for(
    window: int,
    model_max_output: int | None,
    *,
    max_output: int,
    reserve_cap: int | None,
    buffer: int,
    fraction: float | None,
    warning_offset: int,
    blocking_offset: int,
    pct: float | None = None,
) -> Limits:
    """Autocompact's thresholds on a window: the reserve is the output the summary may need
    (`max_output`, never more than the model can write, capped at `reserve_cap`); the
    threshold is the effective window less `buffer`, or `fraction` of it (1.0.x). `pct`
    (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE as a share) can only lower the threshold:
    min(floor(effective x pct), effective - buffer) (the client's Math.min, claude-code#31806;
    the 2.1.221 decompile in BaseInfinity/claude-sdlc-harness#520). One function, so the
    charts draw the lines the policy uses."""
    out = max_output if model_max_output is None else min(max_output, model_max_output)
    reserve = out if reserve_cap is None else min(out, reserve_cap)
    effective = window - reserve
    threshold = effective - buffer if fraction is None else int(fraction * effective)
    if pct is not None:
        threshold = min(math.floor(effective * pct), threshold)
    return Limits(
        window,
        reserve,
        effective,
        threshold,
        threshold - warning_offset,
        effective - blocking_offset,
    )


class Autocompact:
    def __init__(self, p: dict[str, Any]) -> None:
        # Off by the stage switch or by Claude Code's own settings: the autoCompactEnabled
        # setting, DISABLE_AUTO_COMPACT, or DISABLE_COMPACT (which also refuses /compact).
        self.enabled = (
            bool(p["autocompact.enabled"])
            and env_truthy(p["autoCompactEnabled"])
            and not env_truthy(p["DISABLE_AUTO_COMPACT"])
            and not env_truthy(p["DISABLE_COMPACT"])
        )
        self.pct = pct_share(p["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"], str(p["autocompact.pct_format"]))
        self.thrash_enabled = bool(p["autocompact.thrashing.enabled"])
        self.thrash_turns = int(p["autocompact.thrashing.requests"])
        self.thrash_times = int(p["autocompact.thrashing.times"])
        self._last_auto: int | None = None
        self._rapid = 0
        self.buffer = int(p["autocompact.buffer_tokens"])
        fraction = p["autocompact.threshold_fraction"]
        self.fraction = None if fraction is None else float(fraction)
        env_output = p["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
        self.max_output = int(
            p["autocompact.max_output_tokens"] if env_output is None else env_output
        )
        cap = p["autocompact.reserve_cap_tokens"]
        self.reserve_cap = None if cap is None else int(cap)
        self.warning_offset = int(p["autocompact.warning_offset_tokens"])
        self.blocking_offset = int(p["autocompact.blocking_offset_tokens"])
        self.prompt_tokens = int(p["autocompact.summary_prompt_tokens"])
        fixed = p["autocompact.summary_tokens"]
        self.fixed_summary = None if fixed is None else int(fixed)
        self.ptl_retries = int(p["autocompact.ptl_retries"])
        self.ptl_drop = float(p["autocompact.ptl_drop_fraction"])
        self.breaker_after = int(p["autocompact.breaker_failures"])
        self.failure_p = float(p["autocompact.failure_probability"])
        self.restore_files = int(p["autocompact.restore_files"])
        self.restore_file_tokens = int(p["autocompact.restore_file_tokens"])
        self.restore_total = int(p["autocompact.restore_total_tokens"])
        reference = p["autocompact.restore_reference_tokens"]
        self.reference_tokens = None if reference is None else int(reference)
        self.skills_tokens = int(p["autocompact.skills_tokens"])
        self.extra_tokens = int(p["autocompact.restore_extra_tokens"])
        self.reattach_first_message = bool(p["autocompact.reattach_first_message"])
        self.preserve_groups = int(p["autocompact.preserve_tail_groups"])
        self.sm_enabled = bool(p["autocompact.session_memory.enabled"])
        self.sm_min_tail = int(p["autocompact.session_memory.min_tail_tokens"])
        self.sm_min_text = int(p["autocompact.session_memory.min_tail_text_messages"])
        self.sm_max_tail = int(p["autocompact.session_memory.max_tail_tokens"])
        self.sm_memory = int(p["autocompact.session_memory.memory_tokens"])
        self.failures = 0
        self.tripped = False
        self.compactions = 0

    def limits(self, window: int, model_max_output: int | None = None) -> Limits:
        """The thresholds for a model (see `limits_for`)."""
        return limits_for(
            window,
            model_max_output,
            max_output=self.max_output,
            reserve_cap=self.reserve_cap,
            buffer=self.buffer,
            fraction=self.fraction,
            warning_offset=self.warning_offset,
            blocking_offset=self.blocking_offset,
            pct=self.pct,
        )

    def thrashing(self, k: int) -> bool:
        """Count an auto-compaction at request k; True when it makes the thrashing detector
        turn autocompact off: the context refilled to the threshold within `requests`
        requests of the previous compaction, `times` times in a row ("Autocompact is
        thrashing: the context refilled to the limit within 3 turns of the previous
        compact, 3 times in a row", from 2.1.144: claude-code#60485, #60600, #82131;
        jundot/omlx#2400 saw it disable auto-compact for the rest of the session)."""
        if not self.thrash_enabled:
            return False
        last, self._last_auto = self._last_auto, k
        rapid = last is not None and k - last <= self.thrash_turns
        self._rapid = self._rapid + 1 if rapid else 0
        if self._rapid >= self.thrash_times and not self.tripped:
            self.tripped = True
            return True
        return False

    def due(self, estimate: int, limits: Limits) -> bool:
        return self.enabled and not self.tripped and estimate >= limits.threshold

    # -- session memory ---------------------------------------------------------------

    def session_memory(self, conv: Conversation) -> bool:
        """Keep a recent tail verbatim and put the session memory before it."""
        if not self.sm_enabled:
            return False
        groups = conv.groups()
        bounds = [*groups, len(conv.items)]
        tail_tokens = tail_text = 0
        cut = len(groups)
        for g in range(len(groups) - 1, -1, -1):
            span = conv.items[bounds[g] : bounds[g + 1]]
            size = sum(conv.item(k)[1] for k in span)
            if tail_tokens + size > self.sm_max_tail:
                break
            tail_tokens += size
            tail_text += sum(1 for k in span if k >= 0 and conv.kinds[k] == Kind.TEXT)
            cut = g
            if tail_tokens >= self.sm_min_tail and tail_text >= self.sm_min_text:
                break
        if cut == 0 or tail_tokens < self.sm_min_tail or tail_text < self.sm_min_text:
            return False
        memory = conv.add_synthetic(self.sm_memory, "summary", 0x5E55)
        conv.replace_all([memory, *conv.items[bounds[cut] :]])
        return True

    # -- full compaction --------------------------------------------------------------

    def compact(
        self,
        conv: Conversation,
        rng: random.Random,
        window: int,
        summary: int | None = None,
        *,
        attached: int | None = None,
    ) -> list[Attempt]:
        """Run a full compaction; returns every attempt that was sent (priced) or refused.
        `summary` fixes the summary's size and `attached` what comes back after it (a
        recorded compaction's), else both are modelled."""
        attempts: list[Attempt] = []
        items = list(conv.items)
        pre_tokens = conv.total()
        for _ in range(1 + self.ptl_retries):
            view = self._request_view(conv, items)
            if view.total > window:
                attempts.append(Attempt(None, 0, False, "prompt-too-long"))
                items = self._drop_oldest(conv, items, view.total - window)
                continue
            if self.failure_p > 0 and rng.random() < self.failure_p:
                attempts.append(Attempt(view, 0, False, "failure"))
                break
            size = self._summary_tokens(pre_tokens, rng) if summary is None else summary
            attempts.append(Attempt(view, size, True, ""))
            self._install(conv, size, attached)
            return attempts
        return attempts

    def _summary_tokens(self, pre_tokens: int, rng: random.Random) -> int:
        if self.fixed_summary is not None:
            return self.fixed_summary
        return summary_tokens(pre_tokens, rng)

    def _request_view(self, conv: Conversation, items: list[int]) -> View:
        """The summary request: the conversation (possibly cut) and the summary prompt."""
        if items == conv.items:
            view = conv.sync().copy()
        else:
            view = conv.sync().copy()
            view.truncate(conv.n_prefix)
            view.extend((k if k >= 0 else -1, *conv.sent(k)) for k in items)
        view.append(-1, chain(conv.ctx.root, 0x5C0A), self.prompt_tokens)
        return view

    def _drop_oldest(self, conv: Conversation, items: list[int], gap: int) -> list[int]:
        """Drop the oldest API-round groups until `gap` tokens are gone. Claude Code drops
        20% of the groups when the API does not say by how much the prompt is over; the
        simulation always knows the gap, so the fraction applies only when it is unknown."""
        groups = conv.groups(items)
        bounds = [*groups, len(items)]
        at_least = max(1, int(len(groups) * self.ptl_drop)) if gap <= 0 else 1
        freed = 0
        g = 0
        while g < len(groups) - 1 and (freed < gap or g < at_least):
            freed += sum(conv.sent(k)[1] for k in items[bounds[g] : bounds[g + 1]])
            g += 1
        return items[bounds[g] :]

    def _install(self, conv: Conversation, summary: int, attached: int | None = None) -> None:
        """The conversation after compaction: the summary, then what the client attaches:
        restored files, skills, the calibrated rest and (2.x) the first-message context;
        or, for a recorded compaction, the `attached` tokens it showed."""
        preserved: list[int] = []
        if attached is None and self.preserve_groups > 0:
            # 2.1.2xx keeps the newest messages verbatim (compactMetadata.preservedSegment:
            # 3-7 messages after flutter-docker's auto-compactions, about one API round).
            groups = conv.groups()
            if self.preserve_groups <= len(groups):
                cut = groups[-self.preserve_groups]
                preserved = [k for k in conv.items[cut:] if k >= 0]
        keys = [conv.add_synthetic(summary, "summary", self.compactions), *preserved]
        if attached is None:
            for tokens in self._restored(conv):
                keys.append(conv.add_synthetic(tokens, "restored", self.compactions))
            if self.skills_tokens:
                keys.append(conv.add_synthetic(self.skills_tokens, "skills", self.compactions))
            attached = self.extra_tokens
            if self.reattach_first_message:
                prefix = conv.prefix.prefix
                attached += prefix.total - prefix.system
        if attached:
            keys.append(conv.add_synthetic(attached, "restored", 0xE7))
        conv.replace_all(keys)
        self.compactions += 1

    def _restored(self, conv: Conversation) -> list[int]:
        """Sizes of the files re-attached after compaction: the most recently touched
        files (read, written or edited), each at its last observed whole size, capped per
        file and in total, or (2.1.2xx, `autocompact.restore_reference_tokens`) a file
        over the per-file cap comes back as a reference naming it. A file whose size was
        never observed is re-read from disk by the client; here it counts what its last
        Read result showed, else nothing."""
        recent = recent_files(conv, self.restore_files)
        sizes: list[int] = []
        budget = self.restore_total
        for tokens in recent:
            if self.reference_tokens is not None and tokens > self.restore_file_tokens:
                size = min(self.reference_tokens, budget)
            else:
                size = min(tokens, self.restore_file_tokens, budget)
            if size <= 0:
                continue
            sizes.append(size)
            budget -= size
        return sizes

    def succeeded(self) -> None:
        """A compaction worked (full or session memory): the breaker's count restarts."""
        self.failures = 0

    def record(self, attempts: list[Attempt]) -> bool:
        """Count the outcome; True if this compaction tripped the breaker."""
        if attempts and attempts[-1].ok:
            self.succeeded()
            return False
        self.failures += 1
        if self.failures >= self.breaker_after and not self.tripped:
            self.tripped = True
            return True
        return False


def recent_files(conv: Conversation, limit: int) -> list[int]:
    """Sizes of the `limit` files most recently touched in the conversation (see
    `recent_file_sizes`); a Read result without a whole size counts what it showed."""

    def shown(key: int) -> int:
        return conv.tokens[key] if conv.is_read_result(key) else -1

    keys = (k for k in reversed(conv.items) if k >= 0)
    return recent_file_sizes(keys, conv.path_hash, conv.file_tokens, shown, limit)
