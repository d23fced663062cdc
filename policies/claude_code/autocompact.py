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

What 2.1.2xx puts back after a compaction (preset claude-code@2.1.221), read from the
attachment lines after each compact_boundary of ../shared/traces/claude-code (counts of
types and cl100k tokens only; 2.1.226-2.1.232: entirecontext da81b1d5, Opus 4.6, two
/compact; flutter-docker aba9151e, the process that continued 390ab778, Opus 5, four auto;
5e12a303, Opus 5, two /compact). The recorded context after is the prefix less the first
message's skill listing, plus what the compaction attached: da81b1d5's first message held
23,765 cl100k tokens of attachments, 10,005 of them the listing, and its compactions
attached 14,103 and 13,768 of the same kinds without it (the deferred-tools, agent-listing
and MCP-instructions announcements, hook output), beside the summary, files and skills.

* The skill listing is not sent again (`autocompact.skill_listing_tokens`, `_drop_listing`):
  none follows a compaction by the process that had sent it (da81b1d5 2 of 2, aba9151e 4
  of 4): the client keeps the names it has announced across a compaction
  (claude-code#76161: not reset, "to save about 4K tokens"; #82017: after an
  auto-compaction only deltas follow; #74990: intended, reproduced on 2.1.233). The names
  are the process's own: a new client process (`Session.restarted_at`, traces/
  claude_code.py: a new version logged, a `SessionStart:resume` or `fork` hook, a resumed
  file) counts the listing its context holds as sent, and where the context lacks it
  (after a compaction) announces the whole listing with its first prompt
  (`announce_listing`). 5e12a303's two /compact each came right after a restart, the
  command before any prompt, and the first prompt after each carries the whole listing
  again (`skill_listing` with isInitial true, 69 skills, 4,464 and 4,494 cl100k tokens);
  git-sync ec48fae0's restart (2.1.150 -> 2.1.153) on a context holding the listing
  announced a delta of 2 skills (isInitial false), and aba9151e's process, started on a
  copy holding it, sent none after the auto-compaction it made at once. The listing a
  new process announced leaves with its own next compaction (an item, replaced). The
  listing's size is the user's (its skills; the client cuts descriptions to 1% of the
  window, 40,000 characters on 1M: claude-code#68135,
  melodic-software/claude-code-plugins#1271): flutter-docker's
  4,281-4,399 cl100k tokens (about 6.8k in Opus 5's), entirecontext's 10,005 (its budget
  on Opus 4.6's 1M window). The client logs the listing it announces (a `skill_listing`
  attachment, isInitial true: traces/claude_code.py `_listing`, `Session.skill_listing`),
  so the preset takes that size, in the session's tokens (`_listing_size`), and the
  client's own 4,000 (claude-code#76161) only where none was logged
  (`autocompact.skill_listing_recorded`): entirecontext's requests under claude-code
  74.4% -> 95.3% matched, its two /compact +15.1% / +13.6% -> +0.7% / +0.6%
  (policies/calibration/README.md). It leaves the prefix once per session, from its end
  and never into the part through the system prompt's marker (`drop_prefix_tail`).
* A file over the 5,000-token cap is named by a `compact_file_reference`, not cut
  (`autocompact.restore_reference_tokens`, 60: the client's note, 41 cl100k tokens as a
  reminder, and the reference's 20-39). da81b1d5's two compactions name 1 and 2 files so,
  aba9151e's 0, 0, 0 and 2 (in flutter-docker files last read in part whose line counts
  put them above the cap, and no attached file above it); the pipeline, from the files'
  sizes in the transcript, names 2 and 2, and 2, 1, 0 and 2 at 390ab778's four.
* The skills the Skill tool loaded come back (`autocompact.invoked_skills`): 390ab778's
  `invoked_skills` hold 1,422, 2,936 and 4,271 cl100k tokens after requests 147, 244 and
  354, where the Skill tool had loaded one skill of 1,406 before 147 and a second of 1,433
  before 244 (`skill_contents`); the rest of 354's, and da81b1d5's 1,026 at its second,
  are skills the user invoked by a command, which a content-free trace cannot tell from
  other text. Each is cut to 5,000 (length/4) and all to 25,000, the oldest left out
  (claude-code#96168, 2.1.280). They are the process's memory: a new client process
  attaches only the skills it loaded itself (`restart`; #96168: "--resume reconstructs
  none"): 5e12a303 loaded one skill at request 86, before its first restart, and neither
  of its /compact after a restart attached `invoked_skills`.
* The calibrated sizes (the drawn summary, the files, the rest) are Claude tokens at the
  fit's 1.207 per cl100k token (policies/calibration/summary.py); Opus 4.6 and Opus 5
  count more (`tokenizer_ratio`: 1.31 and 1.58-1.59), so they are scaled to the session's
  own ratio (`autocompact.restore_session_tokens`); the caps stay in the client's count.
* Still missing, measured: Opus 5's summaries are twice the fit's (raw 3,885-5,876 cl100k
  tokens against its median of 2,415; Opus 4.6's 1,889 and 2,229), a model effect only
  flutter-docker holds, which cannot be fitted leave-one-source-out; and the
  announcements a compaction sends again had grown by 2.6k cl100k tokens in aba9151e
  (tools announced during the session, unlogged context in the compiled trace). They leave
  the pipeline's context after aba9151e's later compactions 4-10% short; da81b1d5's are
  14-15% over, its listing being 2.5 times the preset's; 5e12a303's, with the listing
  back and the skill gone, 5.5% and 5.4% over (61,231 and 69,166 against 58,061 and
  65,611), with a listing of 4,000 where the recording's is about 7k of Opus 5's tokens
  (4,464 cl100k at 1.58): the rest of the model there is about 6k over (its 5 files
  come back at 9,023).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from policies.calibration.summary import TOKENIZER_RATIO, recent_file_sizes, summary_tokens
from policies.claude_code.settings import env_truthy, pct_share
from policies.conversation import Conversation
from simulator.model import Flag, Kind, Session
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
        self.invoked_skills = bool(p["autocompact.invoked_skills"])
        self.skill_cap = int(p["autocompact.skill_cap_tokens"])
        self.skills_budget = int(p["autocompact.skills_budget_tokens"])
        #: Skills invoked so far (content hash -> (tokens, estimate)), oldest first: the
        #: client keeps them across compactions.
        self.skills: dict[int, tuple[int, int]] = {}
        self.session_tokens = bool(p["autocompact.restore_session_tokens"])
        self._scale: float | None = None
        listing = p["autocompact.skill_listing_tokens"]
        self.listing_tokens = None if listing is None else int(listing)
        self.listing_recorded = bool(p["autocompact.skill_listing_recorded"])
        self.listing_dropped = False
        #: What `_drop_listing` took off the prefix, and the item a restarted process
        #: announced the listing again with (`announce_listing`), None before any.
        self.listing_taken = 0
        self.listing_key: int | None = None
        #: The first request of the client process now running (`restart`): the skills
        #: loaded before it are not the process's own.
        self.skills_since = 0
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
        self._remember_skills(conv)
        self._drop_listing(conv)
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
            size = self._summary_tokens(pre_tokens, rng, conv) if summary is None else summary
            attempts.append(Attempt(view, size, True, ""))
            self._install(conv, size, attached)
            return attempts
        return attempts

    def _summary_tokens(self, pre_tokens: int, rng: random.Random, conv: Conversation) -> int:
        if self.fixed_summary is not None:
            return self.fixed_summary
        return round(summary_tokens(pre_tokens, rng) * self.scale(conv))

    def scale(self, conv: Conversation) -> float:
        """What the calibrated sizes (summary, files, rest: Claude tokens at the fit's
        TOKENIZER_RATIO) are multiplied by: 1, or with `autocompact.restore_session_tokens`
        the session's own tokens per cl100k token over that ratio (`tokenizer_ratio`)."""
        if not self.session_tokens:
            return 1.0
        if self._scale is None:
            ratio = tokenizer_ratio(conv.ctx.session)
            self._scale = 1.0 if ratio is None else ratio / TOKENIZER_RATIO
        return self._scale

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
        or, for a recorded compaction, the `attached` tokens it showed (the recorded state:
        nothing else changes)."""
        self._remember_skills(conv)
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
            skills = self.skills_tokens + self._invoked()
            if skills:
                keys.append(conv.add_synthetic(skills, "skills", self.compactions))
            attached = round(self.extra_tokens * self.scale(conv))
            if self.reattach_first_message:
                prefix = conv.prefix.prefix
                attached += prefix.total - prefix.system
            self._drop_listing(conv)
        if attached:
            keys.append(conv.add_synthetic(attached, "restored", 0xE7))
        conv.replace_all(keys)
        self.compactions += 1

    def _drop_listing(self, conv: Conversation) -> None:
        """2.1.2xx (`autocompact.skill_listing_tokens`): the first message's skill listing
        is not sent again after the session's first compaction, so the prefix loses it
        from then on (never more than what follows the system prompt's marker; the module
        docstring has the evidence). A restarted process that finds it gone announces it
        again (`announce_listing`), as an item the next compaction replaces."""
        if self.listing_tokens is None or self.listing_dropped:
            return
        self.listing_dropped = True
        self.listing_taken = drop_prefix_tail(conv, self._listing_size(conv))

    def _listing_size(self, conv: Conversation) -> int:
        """The listing's size in the session's tokens: the recording's own where it logged
        one and `autocompact.skill_listing_recorded` is on (its cl100k count times the
        session's tokens per cl100k token, `tokenizer_ratio`, the fit's where the session
        has no measure), else `autocompact.skill_listing_tokens`."""
        assert self.listing_tokens is not None
        session = conv.ctx.session
        if not self.listing_recorded or session.skill_listing < 0:
            return self.listing_tokens
        ratio = tokenizer_ratio(session)
        return round(session.skill_listing * (TOKENIZER_RATIO if ratio is None else ratio))

    def restart(self, request: int) -> None:
        """A new client process sends `request` (`Session.restarted_at`): the skills the
        Skill tool loaded are held in the old process's memory only, so the new one
        attaches none of them after a compaction, nor any loaded before it
        (claude-code#96168: "--resume reconstructs none"; flutter-docker 5e12a303 loaded
        one skill before its first restart and neither /compact after a restart attached
        `invoked_skills`). Before the compaction at `request`, if any."""
        if not self.invoked_skills:
            return
        self.skills.clear()
        self.skills_since = request

    def announce_listing(self, conv: Conversation) -> None:
        """A new client process's first prompt (`Session.restarted_at`): it announces the
        whole skill listing when the context it holds lacks it, which is so once a
        compaction has left it out (`_drop_listing`) and no restarted process has
        announced it since; where the context holds it, its names count as sent (the
        module docstring has the evidence). Called after a recorded /compact at that
        request (the command came before the prompt) and before an auto-compaction there
        (which the prompt's attachments precede)."""
        if not (self.listing_dropped and self.listing_taken > 0):
            return
        if self.listing_key is not None and self.listing_key in conv.items:
            return
        self.listing_key = conv.add_synthetic(self.listing_taken, "listing", 0x5C15)
        conv.append([self.listing_key])

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
        scale = self.scale(conv)
        for tokens in recent:
            if self.reference_tokens is not None and tokens > self.restore_file_tokens:
                size = min(self.reference_tokens, budget)
                sent = size
            else:
                size = min(tokens, self.restore_file_tokens, budget)
                sent = round(size * scale)  # the caps are the client's count, the bill the model's
            if size <= 0:
                continue
            sizes.append(sent)
            budget -= size
        return sizes

    def _remember_skills(self, conv: Conversation) -> None:
        """Before the conversation is replaced (by any compaction, a recorded one too):
        the skills its items loaded, kept for the compactions after it."""
        if not self.invoked_skills:
            return
        for content, tokens, estimate in skill_contents(conv, self.skills_since):
            self.skills.pop(content, None)  # invoked again: the newest
            self.skills[content] = (tokens, estimate)

    def _invoked(self) -> int:
        """Tokens of the invoked skills attached after a compaction (2.1.2xx,
        `autocompact.invoked_skills`): each skill the Skill tool loaded so far in the
        session (`_remember_skills`), newest first, each cut to `skill_cap_tokens` and all
        of them within `skills_budget_tokens` (the client's length/4 units; an older skill
        beyond the budget is left out), as the model's tokens of that content."""
        if not self.invoked_skills:
            return 0
        total = 0
        budget = self.skills_budget
        for tokens, estimate in reversed(self.skills.values()):
            units = min(estimate, self.skill_cap)
            if units > budget:
                break
            budget -= units
            total += tokens if units == estimate else round(tokens * units / max(estimate, 1))
        return total

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


#: Tool results at least this big (cl100k tokens) measure a session's tokenizer ratio: the
#: unlogged per-request additions the anchoring also spreads over them (hook output, about
#: 80 tokens a tool call in ../shared's 2.1.2xx sessions) are then a few percent of it
#: (simulator/app/measure/calibration_measure.py RATIO_MIN_RAW, the calibration's floor).
RATIO_MIN_RAW = 1_000


def tokenizer_ratio(session: Session) -> float | None:
    """The session's tokens per cl100k token: the median, over its tool results of at
    least RATIO_MIN_RAW cl100k tokens that the recording sent, of the anchored size over
    the tokenizer's count; None when there is none. In ../shared/traces/claude-code (the
    sessions with a compaction): 1.19-1.33 for the 1.0.53 and 2.1.29 ones the calibration's
    1.207 was measured on, 1.31 for Opus 4.6 (entirecontext da81b1d5), 1.58-1.59 for Opus 5
    (flutter-docker 390ab778, 5e12a303)."""
    b = session.blocks
    live = b["first_request"] < np.minimum(b["hidden_from"], b["compacted_at"])
    big = live & (b["kind"] == Kind.TOOL_RESULT) & (b["tokens_raw"] >= RATIO_MIN_RAW)
    if not big.any():
        return None
    return float(np.median(b["tokens"][big] / b["tokens_raw"][big]))


def skill_contents(conv: Conversation, since: int = 0) -> list[tuple[int, int, int]]:
    """(content hash, tokens, length/4) of each skill the conversation's items loaded,
    oldest first, from request `since` on: Claude Code answers a Skill call with a short
    result and puts the skill's content in the user text that follows it
    (../shared/traces/claude-code: 37 of its 40 Skill results are followed by one such
    block, 308-5,535 cl100k tokens but one of 158,562, which the per-skill cap cuts)."""
    tools = conv.tools
    if "Skill" not in tools:
        return []
    skill = tools.index("Skill")
    n = len(conv.kinds)
    first = conv.ctx.session.blocks["first_request"] if since else None
    out: list[tuple[int, int, int]] = []
    for key in conv.items:
        if key < 0 or not conv.result[key] or conv.tool_ids[key] != skill:
            continue
        if first is not None and first[key] < since:
            continue
        j = key + 1
        while (
            j < n
            and conv.kinds[j] == Kind.TEXT
            and conv.origin[j] < 0
            and not conv.flags[j] & Flag.HUMAN
        ):
            out.append((conv.hashes[j], conv.tokens[j], conv.chars[j] // 4))
            j += 1
    return out


def drop_prefix_tail(conv: Conversation, tokens: int) -> int:
    """Take `tokens` off the end of the conversation's prefix from now on (the first
    message's context, which the client sends again after a compaction), never into the
    part through the system prompt's marker; returns the tokens taken. The segment that
    ends there changes size, so it is a new cache entry (written, as every compaction of
    ../shared writes what follows the system prompt); the segments before it stay cached."""
    state = conv.prefix
    layout = state.layout
    keep = max(layout.system, layout.total - max(tokens, 0))
    if keep >= layout.total:
        return 0
    conv.sync()  # pending edits belong to the view they were made on
    state.layout = replace(layout, total=keep, cuts=tuple(c for c in layout.cuts if c < keep))
    conv.view, conv.warm, conv.marks = state.start_view()
    conv.touch(0)
    return layout.total - keep


def recent_files(conv: Conversation, limit: int) -> list[int]:
    """Sizes of the `limit` files most recently touched in the conversation (see
    `recent_file_sizes`); a Read result without a whole size counts what it showed."""

    def shown(key: int) -> int:
        return conv.tokens[key] if conv.is_read_result(key) else -1

    keys = (k for k in reversed(conv.items) if k >= 0)
    return recent_file_sizes(keys, conv.path_hash, conv.file_tokens, shown, limit)
