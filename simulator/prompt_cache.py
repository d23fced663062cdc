"""Mocked prompt caches: which part of a request's input is read from cache, written to
it, or sent uncached. One instance per session (a cache domain), fed requests in trace time.

Anthropic (explicit breakpoints), per its prompt-caching documentation:
* The prompt is cached as prefixes in the order tools, system, messages; a change anywhere
  changes every later prefix (the prefix hashes of simulator/view.py give exactly that).
* Only prefixes ending at a breakpoint (at most 4 per request, placed by the request
  builder) are written. For each breakpoint the lookup checks the block boundaries from
  the breakpoint back `lookback` (about 20) blocks and reads the longest cached prefix
  found; a turn that adds more blocks than that misses.
* Each written entry lives `ttl` (5 minutes, or 1 hour) after its last use; a read
  refreshes it for free. The use is the request's start for current models and was its
  response's end for the 2025 ones (`ANTHROPIC_REFRESH_AT_END`: the evidence). Writes
  cost 1.25x input (5 minutes) or 2x (1 hour), reads 0.1x.
* Prefixes shorter than the model's minimum (simulator/models.py) are not cached.
* `cache_edits` deletions zero an item's tokens without changing its hash (View.edit_out):
  the cached prefix stays valid and the deleted tokens are simply not billed.
* A request the client sends without logging it can write an entry the next logged one
  reads: Claude Code's prompt suggestion, sent when a turn ends with its marker on the
  response, writes the conversation through that response (policies/as_recorded.py
  `post_turn_writes`). The replay seeds it as written at the turn's end with the turn's
  TTL (`PromptCache.warm` at that time, through the engine's `written`), unpriced.

OpenAI (automatic): every prompt is cached as it goes; a later prompt sharing a prefix of
at least 1,024 tokens reads it in steps (128 tokens by OpenAI's guide; whole 512- and
1,024-token chunks on gpt-5.5 and 5.6, `OPENAI_FAMILIES`); the older serving (every gpt-5 model
before GPT-5.5's launch) also holds each response, which the next prompt reads into; no write
fee; entries live some minutes after last use (`retention_ms`, fitted per family), a
prefix kept warm by other sessions as long as it is seeded for. Gemini 2.5+ implicit
caching works alike with its own minimum. Both are modelled at block granularity: the
cached prefix is the longest run of identical leading items, floored to the step.
"""

from __future__ import annotations

import itertools
import re
from typing import NamedTuple

from simulator.view import (
    ANTHROPIC_LOOKBACK,
    FIVE_MINUTES,
    MAX_BREAKPOINTS,
    ONE_HOUR,
    Breakpoint,
    View,
)

__all__ = [
    "ANTHROPIC_LOOKBACK",
    "FIVE_MINUTES",
    "ONE_HOUR",
    "AnthropicCache",
    "AutomaticCache",
    "Breakpoint",
]


class Usage(NamedTuple):
    """Input split of one request, Anthropic-style (uncached excludes cached tokens).

    A named tuple: one is made per simulated call, so it must be cheap."""

    uncached: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int

    @property
    def total(self) -> int:
        return self.uncached + self.cache_read + self.cache_write_5m + self.cache_write_1h


class Response(NamedTuple):
    """What a request generates, for a cache that holds responses (`PromptCache.
    holds_responses`): its output tokens and the history blocks [first, end) that hold
    that output from the next request on."""

    tokens: int
    first: int
    end: int


class PromptCache:
    """A session's cache state; `request` prices one request and updates the state."""

    #: Whether the cache keeps what a request generates (the engine then passes `response`).
    holds_responses = False

    def request(
        self,
        view: View,
        breakpoints: list[Breakpoint],
        now_ms: int,
        done_ms: int | None = None,
        response: Response | None = None,
    ) -> Usage:
        """Price one request sent at `now_ms`; the entries it reads or writes count as used
        until `done_ms` (its response's end; default `now_ms`). `response`: what it
        generates, for a cache that holds responses."""
        raise NotImplementedError

    def warm(
        self, view: View, position: int, now_ms: int, ttl_ms: int, done_ms: int | None = None
    ) -> None:
        """Seed an entry (a prefix cached before the session began, e.g. by another session
        sharing the system prompt, or written by a request sent at `now_ms` whose response
        ended at `done_ms`: it lives from the time `request` would count it used)."""
        at = self.used_at(now_ms, done_ms)
        self.warm_entry(view.chains[: position + 1], view.cum[position], at, ttl_ms)

    def used_at(self, now_ms: int, done_ms: int | None) -> int:
        """When a request sent at `now_ms` (its response ending at `done_ms`) counts as
        having used the entries it read or wrote: its send, for caches without a rule of
        their own."""
        return now_ms

    def warm_entry(self, chains: list[int], tokens: int, now_ms: int, ttl_ms: int) -> None:
        """Seed the prefix whose prefix hashes are `chains` (its last hash names it)."""
        raise NotImplementedError


class AnthropicCache(PromptCache):
    """Anthropic's explicit-breakpoint cache. `refresh_at_send`: an entry a request reads
    or writes lives `ttl` from the request's send time (else from its response's end);
    `for_provider` sets it per model (`ANTHROPIC_REFRESH_AT_END`)."""

    def __init__(
        self,
        min_tokens: int = 1024,
        lookback: int = ANTHROPIC_LOOKBACK,
        refresh_at_send: bool = False,
    ) -> None:
        self.min_tokens = min_tokens
        self.lookback = lookback
        self.refresh_at_send = refresh_at_send
        #: prefix hash -> [expiry ms, ttl ms]
        self.entries: dict[int, list[int]] = {}

    def warm_entry(self, chains: list[int], tokens: int, now_ms: int, ttl_ms: int) -> None:
        if chains and tokens >= self.min_tokens:
            self.entries[chains[-1]] = [now_ms + ttl_ms, ttl_ms]

    def used_at(self, now_ms: int, done_ms: int | None) -> int:
        """The send for current models, the response's end for the 2025 ones
        (`ANTHROPIC_REFRESH_AT_END`)."""
        return now_ms if self.refresh_at_send or done_ms is None or done_ms < now_ms else done_ms

    def request(
        self,
        view: View,
        breakpoints: list[Breakpoint],
        now_ms: int,
        done_ms: int | None = None,
        response: Response | None = None,
    ) -> Usage:
        # `used_at`, inlined: the per-call path
        done = now_ms if self.refresh_at_send or done_ms is None or done_ms < now_ms else done_ms
        if len(breakpoints) > MAX_BREAKPOINTS:
            _check_breakpoints(breakpoints)
        chains, cum = view.chains, view.cum
        entries = self.entries
        lookback = self.lookback
        # The read is the deepest live entry within `lookback` of any breakpoint: the last
        # breakpoint first, as it usually finds it (the previous request's last write) and
        # leaves nothing deeper for the others to find. An earlier breakpoint searches only
        # below what a later one already searched.
        hit = -1
        below = len(chains)  # positions from here on are searched
        for i in range(len(breakpoints) - 1, -1, -1):
            p = breakpoints[i][0]
            q = p if p < below else below - 1
            lo = p - lookback
            if lo < 0:
                lo = 0
            if lo < below:
                below = lo
            while q >= lo:
                entry = entries.get(chains[q])
                if entry is not None:
                    if entry[0] >= now_ms:
                        hit = q
                        break
                    del entries[chains[q]]
                q -= 1
            if hit >= 0:
                break
        if hit >= 0:
            read = cum[hit]
            entry = entries[chains[hit]]
            entry[0] = done + entry[1]
        else:
            read = 0
        written = read
        w5 = w1 = 0
        min_tokens = self.min_tokens
        previous_p, previous_ttl = -1, ONE_HOUR
        for p, ttl in breakpoints:
            if p < previous_p or ttl > previous_ttl:
                _check_breakpoints(breakpoints)  # raises: the API's order, and ours
            previous_p, previous_ttl = p, ttl
            if p <= hit:
                entry = entries.get(chains[p])
                if entry is not None and entry[0] >= now_ms:
                    entry[0] = done + entry[1]
                continue
            c = cum[p]
            if c < min_tokens or c <= written:
                continue
            entries[chains[p]] = [done + ttl, ttl]
            if ttl > FIVE_MINUTES:
                w1 += c - written
            else:
                w5 += c - written
            written = c
        total = view.total
        return Usage(total - read - w5 - w1, read, w5, w1)


class AutomaticCache(PromptCache):
    """OpenAI-style automatic prefix caching (and Gemini implicit caching).

    `tail_tokens`: the last tokens of a prompt that a later prompt cannot read (the cache
    holds the prompt but for its tail); `offset`: reads are `offset + k * step` tokens.
    Both 0 reproduce plain floor-to-step reads of the longest shared prefix.
    `response_tail`: None, the cache holds prompts only; else it holds each prompt with the
    response generated after it, and a later prompt that goes on with that response reads
    into it up to `response_tail` tokens before its end. The OpenAI values per model
    family, and their evidence, are in `OPENAI_FAMILIES`.
    """

    def __init__(
        self,
        min_tokens: int = 1024,
        step: int = 128,
        retention_ms: int = 10 * 60 * 1000,
        tail_tokens: int = 0,
        offset: int = 0,
        response_tail: int | None = None,
    ) -> None:
        self.min_tokens = min_tokens
        self.step = step
        self.retention_ms = retention_ms
        self.tail_tokens = tail_tokens
        self.offset = offset
        self.response_tail = response_tail
        self.holds_responses = response_tail is not None
        #: prefix hash -> last use (ms); every position of every prompt is stored
        self.entries: dict[int, int] = {}
        #: prefix hash -> tokens of it readable, for prefixes that reach into a tail
        self.covered: dict[int, int] = {}
        #: prefix hash -> until when it stays warm whatever this session does (`warm_entry`)
        self.kept: dict[int, int] = {}
        #: hash of a prompt's whole prefix -> (first, end) history blocks of the response
        #: generated after it and the tokens of that response readable
        self.responses: dict[int, tuple[int, int, int]] = {}

    def warm_entry(self, chains: list[int], tokens: int, now_ms: int, ttl_ms: int) -> None:
        """Seed a prefix found cached; one seeded for longer than the retention (kept warm
        by other sessions) stays so that long. One that is a read (a whole number of
        128-token blocks) lies on the session's chunk grid, so it sets the grid's offset."""
        for h in chains:
            self.entries[h] = now_ms
        if ttl_ms > self.retention_ms:
            kept = self.kept
            for h in chains:
                kept[h] = max(kept.get(h, 0), now_ms + ttl_ms)
        if tokens >= self.min_tokens and tokens % 128 == 0:
            self.offset = tokens % self.step

    def _deepest(self, view: View, now_ms: int) -> int:
        """Deepest position whose prefix is cached and alive.

        Every request stamps every position of its prompt, so along one prompt both
        presence and liveness are monotone in the position: two binary searches (a third
        for a prefix kept warm from elsewhere, a leading run of the view too).
        """
        chains, entries = view.chains, self.entries
        lo, hi = -1, len(view) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chains[mid] in entries:
                lo = mid
            else:
                hi = mid - 1
        present = lo
        oldest = now_ms - self.retention_ms
        lo, hi = -1, present
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if entries[chains[mid]] >= oldest:
                lo = mid
            else:
                hi = mid - 1
        kept = self.kept
        if kept and lo < present:  # a prefix kept warm (a prefix of the view) may go deeper
            k_lo, hi = lo, present
            while k_lo < hi:
                mid = (k_lo + hi + 1) // 2
                if kept.get(chains[mid], 0) >= now_ms:
                    k_lo = mid
                else:
                    hi = mid - 1
            lo = k_lo
        return lo

    def _into_response(self, view: View, position: int) -> int:
        """Tokens readable through the response cached after the prompt that ends at
        `position`, when the view goes on with that response (its first block next); the
        prompt's own tokens when it does not."""
        cum = view.cum
        held = self.responses.get(view.chains[position])
        if held is None:
            return cum[position]
        first, end, readable = held
        ids = view.ids
        q = position + 1
        if q >= len(ids) or ids[q] != first:
            return cum[position]
        while q < len(ids) and first <= ids[q] < end:
            q += 1
        return cum[position] + min(readable, cum[q - 1] - cum[position])

    def request(
        self,
        view: View,
        breakpoints: list[Breakpoint],
        now_ms: int,
        done_ms: int | None = None,
        response: Response | None = None,
    ) -> Usage:
        done = now_ms if done_ms is None else max(done_ms, now_ms)
        deepest = self._deepest(view, now_ms)
        read = 0
        chains, cum = view.chains, view.cum
        covered = self.covered
        if deepest >= 0:
            tokens = covered.get(chains[deepest], -1)
            if tokens < 0:
                tokens = self._into_response(view, deepest) if self.responses else cum[deepest]
            if tokens >= self.min_tokens:
                read = tokens - (tokens - self.offset) % self.step
        entries = self.entries
        if self.tail_tokens:
            limit = view.total - self.tail_tokens
            i = len(cum)
            while i > 0 and cum[i - 1] > limit:
                i -= 1
                h = chains[i]
                if h not in entries or h in covered:  # else an earlier prompt holds it whole
                    covered[h] = max(covered.get(h, 0), limit)
            # The tail of an earlier prompt this one extends is readable whole now (a tail
            # spans the last items of a prompt: 64 positions back is ample).
            for j in range(max(0, i - 64), i):
                covered.pop(chains[j], None)
        for h in chains:
            entries[h] = done
        if response is not None and self.response_tail is not None and chains:
            readable = response.tokens - self.response_tail
            if readable > 0 and response.first < response.end:
                self.responses[chains[-1]] = (response.first, response.end, readable)
        return Usage(view.total - read, read, 0, 0)


class OpenAIFamily(NamedTuple):
    """Cache behaviour of one OpenAI model family (see `OPENAI_FAMILIES`)."""

    retention_ms: int
    tail_tokens: int
    step: int
    offset: int
    #: None: prompts only; else the response is held too, readable to this many tokens
    #: before its end (`AutomaticCache`).
    response_tail: int | None = None


#: 2026-04-23T00:00Z: GPT-5.5's launch (BerriAI/litellm#26339, gsd-build/gsd-2#4728); gpt-5.4
#: is served on 5.5's cache from then on (`OPENAI_FAMILIES`).
GPT_5_5_LAUNCH_MS = 1_776_902_400_000

#: OpenAI automatic caching per model family, as (model pattern, from when, behaviour):
#: the first row whose pattern matches the model and whose start is not after the session's
#: first request with it wins. Fitted to the recorded ``cached_input_tokens`` of
#: ../shared/traces/codex, 6,050 requests in 7 source folders (policies/calibration/codex.md:
#: method; codex_fit.json: figures): retention with the prompt tail (or, on a cache that holds
#: responses, the response tail) chosen on a grid per row, minimising the summed |read error|.
#: Leave-one-source-out the choice is the same for every held-out folder but three
#: (git-sync: gpt-5.4 on 5.5's cache 10 minutes, from agentv's 10 requests alone, and the
#: older gpt-5.4 row 10 minutes with a 96-token response tail, from agentic-neurodata's
#: gpt-5-codex alone; hk: gpt-5.6 10 minutes; agentv: gpt-5.5 45 minutes, tail 64).
#: The grid offset of a chunked family is the session's where its warm start says
#: (`AutomaticCache.warm_entry`): git-sync's review sessions, whose first read is 1,536,
#: 3,584 or 6,656 (18 of 23; the other 5 read nothing first), read k x 512. The latest
#: warm start seeded sets it: a model the session switches to gets its own after the
#: first model's (agentv 019eef3d: spark's 4,480, then gpt-5.5's 2,432).
#:
#: * Step and offset: the cache holds a prompt in whole chunks, at fixed positions, and a
#:   later prompt reads the chunks it shares. gpt-5.5 reads 384 + k x 512 tokens (2,785
#:   reads) and, from one source only, k x 512 (312: the 23 codex_exec review sessions of
#:   git-sync, cli 0.139; every session keeps one of the two: the row's offset is the
#:   majority's, a session's warm start may set its own, above): between consecutive reads
#:   every gain is a multiple of 512 (2,175 of 2,175), and on 92% of the gains it is
#:   floor(new tokens of the previous prompt / 512) x 512;
#:   a previous prompt that added 512 tokens or fewer adds nothing to the next read (99% of
#:   430). gpt-5.6 reads 768 + k x 1,024 (853 of 853; gains multiples of 1,024, 91% exactly
#:   the whole chunks added). So both are plain floors to their chunk grid of the shared
#:   prefix, step 512 / 1,024 with those offsets. gpt-5-codex and 5.3-codex-spark read
#:   multiples of 128, in every residue of 512: step 128. Reads start at 1,024 tokens
#:   (OpenAI's minimum).
#: * gpt-5.4 moved to 5.5's cache when GPT-5.5 launched (`GPT_5_5_LAUNCH_MS`): its 9
#:   sessions of 2026-04-08 to 04-16 (git-sync, cli 0.118-0.120) read multiples of 128 in
#:   all four residues of 512 (1,363 reads), its 7 of 2026-04-30 to 06-18 (git-sync 0.125-
#:   0.130, agentv 0.140) 384 + k x 512 only (437 of 437), and read the previous prompt
#:   less a tail instead of its response. No session spans the date; the cut is the launch,
#:   inside the recordings' gap (openai/codex#20301, 2026-05: gpt-5.4 and 5.5 sessions both
#:   stuck at 4,608 cached tokens, 384 + 8 x 512).
#: * The serving before GPT-5.5's launch held responses, whatever the gpt-5 model: the two
#:   recorded there, seven months apart (gpt-5-codex of 2025-09, gpt-5.4 of 2026-04), both
#:   read into them (below), and every model recorded after it (gpt-5.4 again, 5.5, 5.6,
#:   5.3-codex-spark) reads prompts only. So the row holding responses is every gpt-5 model
#:   before the launch (gpt-5, 5.1, 5.2, 5.3-codex and their -codex and -mini: none
#:   recorded here), and after it a model without a row of its own reads prompts only.
#:   Spark is kept out (served on other hardware: Cerebras; recorded only after the launch).
#:   Models older than gpt-5 stay on the generic row. Held out: agentic-neurodata's
#:   gpt-5-codex under the row fitted on git-sync's gpt-5.4 alone matches 74.6% of its
#:   requests, under the prompts-only row 56.3% (policies/calibration/codex.md).
#: * Responses (the older gpt-5.4 row, and gpt-5-codex): the cache holds the prompt with the
#:   response generated after it, and the next prompt, which goes on with that response,
#:   reads into it up to 48 tokens before its end (`AutomaticCache.response_tail`). Of the
#:   1,203 gpt-5.4 requests that append to the previous prompt and go on with its response,
#:   1,098 (91%) read exactly floor(prompt + min(output - 48, the response's tokens) / 128)
#:   x 128, against 304 that read the prompt's floor (tails 40 / 56 / 64: 1,040 / 1,083 /
#:   1,018); 630 of the 665 with an output of 200 tokens or more read into it. gpt-5-codex:
#:   32 of 46 against 18. A view that drops the response's first block (the reasoning of a
#:   turn before a user message) reads the prompt only (gpt-5.4: 15 such requests read
#:   the prompt's floor, 4 more, 11 less).
#:   gpt-5.5, 5.6, spark and gpt-5.4 on 5.5's cache never read into a response (any tail:
#:   fewer exact reads than none). The replay gives the cache each request's output and
#:   its history blocks (simulator/replay.py `_response`).
#: * Tail: the last tokens of a prompt a later one cannot read (what the next prompt renders
#:   differently). On gpt-5.6 with its grid, of the requests that only append to the
#:   previous one, 97% read exactly the grid floor of the previous prompt less 128 (86%
#:   less nothing, 93% less 64, 91% less 192); each of its two folders alone picks 128.
#:   gpt-5.4 on 5.5's cache: 64 (fitted; git-sync and agentv alone both pick it). gpt-5.5
#:   and the others: none (0 is best in sample and held out; one git-sync Desktop session,
#:   019ddeed, reads as if its last ~225 tokens were never resent, its siblings do not).
#: * Retention after the last use: hit rate (read >= half the context) after an idle gap
#:   of 5-10 minutes 57% for gpt-5.4 (30 gaps), 86% for 5.5 (36); after 30-60 minutes 43%
#:   (7) and 88% (8); after more than an hour 0 of 13 and 0 of 10: not a sharp cut, so
#:   the fit weighs misses both ways. Fitted: gpt-5.4 15 minutes before GPT-5.5 (and
#:   gpt-5-codex), 60 on its cache, 5.5 60, 5.6 15 (few long gaps: 7), others 15
#:   (5.3-codex-spark, 187 requests). A shared prefix kept warm by other sessions (the
#:   replay seeds it for years: policies/base.py `KEPT_WARM_MS`) outlives the retention
#:   (`AutomaticCache.warm_entry`): after idle gaps of 1.7-14 hours, agentv's gpt-5.5
#:   sessions read their 2,432-token shared start, git-sync's gpt-5.4 ones 9,472 or 9,600,
#:   where the model read nothing (24 requests after a gap over an hour read only a shared
#:   start of at most 12k: 22 unmatched without the rule, 2 with it).
#: * Not modelled: a request routed to a machine that lacks the session's latest state.
#:   OpenAI routes by a hash of the prompt's start and prompt_cache_key and overflows to
#:   other machines (its prompt-caching guide); 9-10% of the requests that only append read
#:   the state of a prompt 2-9 requests back, or only the shared system prefix, flat in the
#:   gap since the previous request (5 s: 12%, 10-45 s: 6-10%) and in the requests of the
#:   last minute, so no lag or rate rule predicts them; an expected value of them
#:   (read less a share of the previous prompt's gain) lowered the matched share by 4.6
#:   points at a share of 5% and was not kept. 26 more read exactly a start that another
#:   session of the model read on one of its first requests (agentv's 23,936; 25 on
#:   gpt-5.5): a machine that holds only a start shared across sessions. After a read of
#:   less than half the previous context within the retention the session stays where it
#:   went: the next request reads the low request's own prompt (gpt-5.5 103 of 130,
#:   gpt-5.4 before GPT-5.5 31 of 45) more often than the state before it (14, 7), as
#:   the replay's inferred prefix reset has it (simulator/prefix.py).
#: * Not modelled either: gpt-5.5 at times reads one chunk less than the previous prompt's
#:   floor, the more often the less that prompt reaches into its last chunk: of the
#:   requests that only append, by the previous prompt's tokens past its last chunk
#:   boundary (0-63, 64-127, ..., 448-511), 49 / 23 / 25 / 18 / 16 / 5 / 11 / 8 read a
#:   chunk less against 280 / 325 / 281 / 301 / 288 / 285 / 310 / 318 the floor: a tail of
#:   varying length that no fixed one fits (0 is best), where gpt-5.6's is sharp (below
#:   128 past the boundary 107 of 114 read a chunk less, above it 4 of 708). And the grid
#:   of a session whose warm start reads nothing: 5 of git-sync's 23 review sessions read
#:   k x 512 from their second request on where the row's 384 + k x 512 stands (18
#:   requests over by 384-1,920).
#: * What breaks the prefix is the view's business: a model switch starts another cache
#:   (one per model, simulator/replay.py); reasoning items dropped at a user turn (all
#:   models but gpt-5.6: traces/codex.py `REASONING_AT_USER_TURN`) and compactions change
#:   the view. A hosted web search's results are never resent, so the next read stops
#:   where they were (traces/codex.py).
OPENAI_FAMILIES: list[tuple[str, int, OpenAIFamily]] = [
    (r"gpt-5\.6", 0, OpenAIFamily(15 * 60 * 1000, 128, 1024, 768)),
    (r"gpt-5\.5", 0, OpenAIFamily(60 * 60 * 1000, 0, 512, 384)),
    (r"gpt-5\.4", GPT_5_5_LAUNCH_MS, OpenAIFamily(60 * 60 * 1000, 64, 512, 384)),
    (r"", GPT_5_5_LAUNCH_MS, OpenAIFamily(15 * 60 * 1000, 0, 128, 0)),
    (r"gpt-5(?!\.3-codex-spark)", 0, OpenAIFamily(15 * 60 * 1000, 0, 128, 0, 48)),
    (r"", 0, OpenAIFamily(15 * 60 * 1000, 0, 128, 0)),
]


def openai_family(model: str, at_ms: int | None = None) -> OpenAIFamily:
    """The cache behaviour of an OpenAI model for a session that starts using it at
    `at_ms` (None: now, the newest row); the generic row for an unknown model."""
    for pattern, since_ms, family in OPENAI_FAMILIES:
        if (at_ms is None or at_ms >= since_ms) and re.search(pattern, model):
            return family
    return OPENAI_FAMILIES[-1][2]


#: Models whose cache entries lived their TTL from the end of the response that used them;
#: every other model's live it from the request's start.
#:
#: Anthropic's prompt-caching documentation (quoted in rossoctl/context-guru#86, 2026-08):
#: "The lifetime is measured from the start of the request that writes or reads the cache
#: entry, not from the end of its response." The recordings of ../shared/traces/claude-code
#: agree for the 2026 models and not for the 2025 ones. Every pair of consecutive requests
#: of one file, side chain and model (copied calls once) whose earlier one wrote with that
#: TTL, classed hit (the later one reads >= 60% of the earlier one's context) or miss (reads
#: < 40% and writes >= 40%), tabulated as hits/misses by the gap from the earlier request's
#: send time (send), from its last response line (end), and from that line to the later
#: request's first line (first: its prompt processed), in seconds, for the pairs with a send
#: or end gap of 270-330 s (5-minute TTL) or 3,000-4,200 s (1 hour):
#:
#:  5 minutes         <270  <290  <295  <300  <305  <310  <320  <330  >=330
#:  dated (vsla, m-claude; Opus/Sonnet 4, 4.5), 16 pairs
#:    send             0/0   6/0   1/1   2/1   0/0   2/0   2/0   0/1   0/0
#:    end              4/0   5/2   2/0   0/0   2/0   0/0   0/1   0/0   0/0
#:    first            3/0   6/2   0/0   2/0   0/0   1/0   0/0   1/1   0/0
#:  undated (starcar, wakil; Opus 4.8, Opus 5), 5 pairs
#:    send             0/0   0/0   1/0   0/0   0/1   0/1   0/2   0/0   0/0
#:    end              0/0   1/2   0/0   0/1   0/0   0/1   0/0   0/0   0/0
#:    first            0/0   0/0   1/0   0/0   0/1   0/0   0/1   0/2   0/0
#:
#:  1 hour           <3000 <3300 <3500 <3600 <3700 <3900 <4200 >=4200
#:  undated (git-sync, wakil, technocore, flutter-docker, entirecontext), 19 pairs
#:    send             0/0   6/1   3/0   2/0   0/0   0/2   0/3   0/2
#:    end              0/0   6/1   4/0   1/0   0/0   0/2   0/5   0/0
#:
#: * Undated models (2026-04 on): the send gap separates them at 300 s, the end gap does
#:   not: starcar 548526c8 missed 300.04 s after the previous send, 278.9 s after its end
#:   (a 21 s response), and again at 308.2 / 285.6 s; wakil 31220796 missed at 316.1 /
#:   296.6 s; the nearest hit is 293.6 s after a send. The TTL therefore restarts within
#:   0.04 s of the send, not at the response's end. The first-line gap is no rule: it is
#:   later on a miss because the miss itself is slower to prefill (22-33 s against 3-12 s).
#: * Dated models (2025-07 to 2026-02): the end gap separates them, the send gap does not:
#:   hits 306.9 s (m-claude 95f81cf4), 308.4 and 312.9 s (vsla 0a725fb5, 5f8cbb78) after a
#:   send, 294.4, 302.5 and 301.1 s after the end; m-claude c71cc98f read its cache right
#:   after a 313 s response. The misses under 300 s of both gaps (m-claude 3cfce0ff at
#:   274.7 s, vsla da4409c0 at 282.1 s) fall back to the system prompt's entry: prefix
#:   resets (simulator/prefix.py), which the replay reproduces under either rule.
#: * vsla's two hits 301.1 and 302.5 s after the end are the engine's misses left
#:   (0a725fb5 request 38, after a 5-minute permission wait on a `cp`; 5f8cbb78 request
#:   110, after a 5-minute Task subagent; both read the entry the previous request wrote).
#:   No clock read from the log explains them: the end is logged to within about 50 ms (in
#:   1.0.x a tool's result line follows its response's last line by 37-56 ms, the output
#:   count of that line a streaming snapshot or not alike), the later request cannot have
#:   left before its tool result was logged, and the send gaps are longer still (308.4 /
#:   312.9 s; 304.2 s from 0a725fb5's first line). So the 2025 API kept entries a few seconds
#:   past 300 s (its documentation then: "a minimum lifetime (TTL) of 5 minutes"): more
#:   than 2.5 s, less than 15.5 s (vsla 0a725fb5 request 92 missed 315.5 s after the end,
#:   a user prompt after an end of turn). Only vsla bounds it: leave-one-source-out the
#:   other dated folders are indifferent to any grace under 35 s (m-claude's nearest pairs
#:   are 294.4 s, hit, and 335.5 / 346.3 s, misses), so no value can be fitted without
#:   the folder it is measured on, and none is modelled.
#: * 1 hour: every hit is under 3,600 s and every miss but one over it by either gap (no
#:   pair tells the two rules apart). The misses under it (wakil 537e8445 at 3,140 s, and
#:   the one dated pair, denubis a0adff31 at 3,069 s) read only the prefix's start: prefix
#:   resets again, reproduced.
#:
#: Leave one source out, the choice per group is the same for every held-out folder: for
#: starcar wakil decides it (send), for wakil starcar; for vsla m-claude (end: with send
#: m-claude's corpus error is +1.07%, with end +0.19%); for m-claude, denubis and
#: promptgrimoire the other dated folders are indifferent, and the engine's earlier rule
#: (end) stands. The line between the groups is the first undated model (Opus 4.7, 2026-04)
#: after the last dated one (Opus 4.5, 2026-02): the date suffix is what tells them apart.
ANTHROPIC_REFRESH_AT_END = r"claude-3|claude-(opus|sonnet|haiku)-4-(1-|5-)?20\d{6}"


def anthropic_refresh_at_send(model: str) -> bool:
    """Whether `model`'s cache entries live their TTL from a request's send time, as the
    documentation says and the 2026 recordings show (`ANTHROPIC_REFRESH_AT_END`)."""
    return not re.search(ANTHROPIC_REFRESH_AT_END, model)


def _check_breakpoints(breakpoints: list[Breakpoint]) -> None:
    """The API's own checks (at most 4 markers, longer TTLs before shorter ones), and ours:
    markers come in ascending position."""
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise ValueError(f"{len(breakpoints)} cache breakpoints; the API allows {MAX_BREAKPOINTS}")
    for before, after in itertools.pairwise(breakpoints):
        if after.position < before.position:
            raise ValueError("cache breakpoints must be given in ascending position")
        if after.ttl_ms > before.ttl_ms:
            raise ValueError("a longer-TTL cache breakpoint follows a shorter one")


def for_provider(
    provider: str, min_tokens: int, model: str = "", at_ms: int | None = None
) -> PromptCache:
    """The cache model of a provider ("anthropic", "openai", "google"); for OpenAI, of
    the model's family when `model` is given, as served at `at_ms` (`OPENAI_FAMILIES`)."""
    if provider == "anthropic":
        at_send = anthropic_refresh_at_send(model)
        return AnthropicCache(min_tokens=min_tokens, refresh_at_send=at_send)
    if provider == "openai":
        if not model:
            return AutomaticCache(min_tokens=1024, step=128)
        f = openai_family(model, at_ms)
        return AutomaticCache(
            1024, f.step, f.retention_ms, f.tail_tokens, f.offset, f.response_tail
        )
    if provider == "google":
        return AutomaticCache(min_tokens=min_tokens, step=1)
    raise ValueError(f"no cache model for provider {provider!r}")
