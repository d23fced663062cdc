"""Synthetic Claude-Code-like sessions: deterministic, any length, no source files.

`synthetic_session(n, seed)` builds, through the same `SessionBuilder` the readers use, a
main session of `n` recorded requests that looks like a Claude Code agent loop. It exists
for benchmarks (a 10,000-request session is longer than any trace in the corpus) and for
tests that need a session of a chosen size. The same `(n, seed, model)` always gives the
identical session (`Trace.equals`); no tokenizer runs (every block has explicit tokens).

Shape of a session
------------------
* Request 0 carries the human's first prompt. The response of request k (assistant text
  and/or tool_use blocks, `origin=k`) enters the context at k+1 together with the tool
  results it asked for; a response without tool_use ends the turn and request k+1 carries a
  new human message instead. The last response enters at request `n` (after the last
  request), as the Claude Code reader lays a transcript's tail.
* The system + tools prefix is read from cache in full at request 0 (other sessions keep
  it warm), so the inferred prefix is one segment of `prefix_tokens`.
* Recorded usage follows a 5-minute cache with a breakpoint on the last block: context =
  prefix + the visible blocks; if the gap since the previous request is under 5 minutes
  (and nothing was compacted) the previous context is read and the growth written,
  otherwise only the prefix is read and the rest written; `input` (uncached) is 0 and the
  output is the exact size of the response, so anchoring keeps every token count as drawn.
* Compaction: when the next context would pass `COMPACT_AT` tokens, every block visible so
  far (this request's new blocks included) gets `compacted_at = k` and a SUMMARY ARTIFACT
  block enters at k, with a `CompactionEvent(k, "auto", ...)`. Replayed as recorded the
  context is a sawtooth; the logical history (what policies project) keeps everything.

Distributions (first guesses, loosely eyeballed from ../shared/traces/claude-code main
sessions; a later issue fits them to the corpus). "LN(m, s)" is a log-normal with median
m and shape s (sigma of the underlying normal), rounded and clipped to [lo, hi]:

========================  =================================================================
prefix (system + tools)   uniform integer in [14,000, 26,000]
human prompt              LN(25, 1.8) in [2, 15,000]
assistant text            present with p=0.55; LN(45, 1.2) in [5, 7,000]
tool_use per response     0 with p=0.12 (ends the turn), 1 with p=0.78, 2 with p=0.10
tool_use                  LN(110, 1.0) in [20, 8,000]
tool_result               LN(150, 1.6) in [50, 20,000]; error flag with p=0.05
tool                      Read .34, Bash .24, Edit .14, Grep .08, Glob .05, TodoWrite .07,
                          Write .04, Task .04 (Read/Edit/Write name one of 60 paths)
gap inside a turn         LN(7 s, 0.9) in [1 s, 240 s]
gap before a human turn   LN(30 s, 1.0) in [2 s, 240 s]; idle with p=0.15
idle gap                  uniform in [6 min, 70 min]; also with p=0.005 inside a turn
summary                   LN(16,000, 0.4) in [5,000, 40,000]
compaction                when the context would exceed COMPACT_AT = 160,000 tokens
========================  =================================================================

Not modelled yet: thinking blocks (and their stripping at a new turn), images, subagents
and the compaction call's own session, rewinds, 1-hour cache writes, INJECTED context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.model import CompactionEvent, Flag, Kind, Role, Session, Trace
from traces.builder import Hasher, RecordedUsage, SessionBuilder

DEFAULT_MODEL = "claude-sonnet-4-5-20250929"
#: Context size (tokens) beyond which the synthetic agent compacts (Claude Code's auto
#: compaction fires a little below 170k on a 200k window).
COMPACT_AT = 160_000
FIVE_MINUTES_MS = 5 * 60 * 1000
#: Trace time of request 0 (2025-10-01T00:00:00Z): any fixed instant will do.
START_MS = 1_759_276_800_000

TOOLS = ("Read", "Bash", "Edit", "Grep", "Glob", "TodoWrite", "Write", "Task")
TOOL_P = (0.34, 0.24, 0.14, 0.08, 0.05, 0.07, 0.04, 0.04)
_REGENERABLE = frozenset({"Read", "Bash", "Grep", "Glob"})
_READS = frozenset({"Read"})
_WRITES = frozenset({"Edit", "Write"})
N_PATHS = 60


def _lognormal(
    rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, n: int
) -> list[int]:
    draw = rng.lognormal(np.log(median), sigma, n)
    out: list[int] = np.clip(np.rint(draw), lo, hi).astype(np.int64).tolist()
    return out


class _Draws:
    """Every random quantity of the session, drawn up front in a fixed order (cheap, and
    the session depends on nothing but the seed and the length)."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self.prefix = int(rng.integers(14_000, 26_001))
        self.human = _lognormal(rng, 25, 1.8, 2, 15_000, n)
        self.has_text = (rng.random(n) < 0.55).tolist()
        self.text = _lognormal(rng, 45, 1.2, 5, 7_000, n)
        self.n_uses = rng.choice(3, size=n, p=(0.12, 0.78, 0.10)).tolist()
        self.use = _lognormal(rng, 110, 1.0, 20, 8_000, 2 * n)
        self.result = _lognormal(rng, 150, 1.6, 50, 20_000, 2 * n)
        self.error = (rng.random(2 * n) < 0.05).tolist()
        self.tool = rng.choice(len(TOOLS), size=2 * n, p=TOOL_P).tolist()
        self.path = rng.integers(0, N_PATHS, size=2 * n).tolist()
        self.gap_turn = _lognormal(rng, 7_000, 0.9, 1_000, 240_000, n)
        self.gap_human = _lognormal(rng, 30_000, 1.0, 2_000, 240_000, n)
        self.idle_human = (rng.random(n) < 0.15).tolist()
        self.idle_turn = (rng.random(n) < 0.005).tolist()
        self.idle = rng.integers(6 * 60_000, 70 * 60_000 + 1, size=n).tolist()
        self.summary = _lognormal(rng, 16_000, 0.4, 5_000, 40_000, n)
        #: Share of the gap after a request that the response takes to arrive.
        self.latency = rng.uniform(0.2, 0.8, n).tolist()


def synthetic_session(n_requests: int, seed: int, *, model: str = DEFAULT_MODEL) -> Session:
    """A deterministic Claude-Code-like main session of `n_requests` requests."""
    if n_requests < 1:
        raise ValueError("a synthetic session needs at least one request")
    d = _Draws(np.random.default_rng(seed), n_requests)
    b = SessionBuilder(
        Hasher(b"synthetic"), id=f"synthetic-{seed}", kind="main", client="synthetic 1"
    )
    prefix = d.prefix
    live: list[int] = []  # blocks in the as-recorded context
    held = 0  # their tokens
    context = 0  # recorded context of the previous request
    msg = 0
    ts = START_MS
    gap = 0
    response: list[_Out] = []  # the previous response, laid at the request it enters
    human_turn = True  # request 0 opens with the human's prompt

    def add(kind: Kind, role: Role, tokens: int, k: int, at: int, **extra: Any) -> int:
        return b.add_block(
            msg=msg,
            kind=kind,
            role=role,
            text=f"b{b.n_blocks}",
            ts=at,
            first_request=k,
            tokens=tokens,
            **extra,
        )

    for k in range(n_requests + 1):
        if k > 0:
            if human_turn:
                gap = d.idle[k - 1] if d.idle_human[k - 1] else d.gap_human[k - 1]
            else:
                gap = d.idle[k - 1] if d.idle_turn[k - 1] else d.gap_turn[k - 1]
        response_ts = ts + int(gap * d.latency[k - 1]) if k > 0 else ts
        ts += gap
        entering: list[int] = []
        sizes: list[int] = []
        if response:
            for out in response:
                sizes.append(out.tokens)
                entering.append(
                    add(
                        out.kind,
                        Role.ASSISTANT,
                        out.tokens,
                        k,
                        response_ts,
                        tool=out.tool,
                        flags=out.flags,
                        path=out.path,
                        origin=k - 1,
                        use_id=out.use_id,
                    )
                )
            msg += 1
        if k == n_requests:
            break  # the last response is in the history, after the last request
        if human_turn:
            sizes.append(d.human[k])
            entering.append(add(Kind.TEXT, Role.USER, d.human[k], k, ts, flags=Flag.HUMAN))
            msg += 1
        else:
            for out in response:
                if out.use_id is None:
                    continue
                flags = Flag.REGENERABLE if out.tool in _REGENERABLE else Flag.NONE
                flags |= out.flags
                if d.error[out.slot]:
                    flags |= Flag.ERROR
                sizes.append(d.result[out.slot])
                entering.append(
                    add(
                        Kind.TOOL_RESULT,
                        Role.USER,
                        d.result[out.slot],
                        k,
                        ts,
                        tool=out.tool,
                        flags=flags,
                        path=out.path,
                        result_for=out.use_id,
                    )
                )
            msg += 1
        entering_tokens = sum(sizes)
        compacted = k > 0 and prefix + held + entering_tokens > COMPACT_AT
        if compacted:
            for blk in live + entering:
                b.compact_away(blk, k)
            held = d.summary[k]
            summary = add(Kind.SUMMARY, Role.USER, held, k, ts, flags=Flag.ARTIFACT)
            msg += 1
            b.add_event(CompactionEvent(k, "auto", context, summary, ts))
            live = [summary]
        else:
            live.extend(entering)
            held += entering_tokens
        warm = k > 0 and not compacted and gap < FIVE_MINUTES_MS
        read = context if warm else prefix
        context = prefix + held
        response = _respond(d, k)
        human_turn = all(out.use_id is None for out in response)
        usage = RecordedUsage(
            input=0,
            cache_read=read,
            cache_write_5m=context - read,
            cache_write_1h=0,
            output=sum(out.tokens for out in response),
        )
        b.add_request(ts=ts, model=model, usage=usage)
    return b.finish()


@dataclass(frozen=True)
class _Out:
    """One block of a response: assistant text, or a tool call (with its draw slot)."""

    kind: Kind
    tokens: int
    slot: int = -1
    tool: str | None = None
    flags: Flag = Flag.NONE
    path: str | None = None
    use_id: str | None = None


def _respond(d: _Draws, k: int) -> list[_Out]:
    """The response of request k: text and/or tool calls (text alone ends the turn)."""
    out: list[_Out] = []
    if d.has_text[k] or d.n_uses[k] == 0:
        out.append(_Out(Kind.TEXT, d.text[k]))
    for j in range(d.n_uses[k]):
        slot = 2 * k + j
        tool = TOOLS[d.tool[slot]]
        flags = Flag.NONE
        path = None
        if tool in _READS or tool in _WRITES:
            path = f"src/module_{d.path[slot]}.py"
            flags = Flag.PATH_READ if tool in _READS else Flag.PATH_WRITE
        out.append(_Out(Kind.TOOL_USE, d.use[slot], slot, tool, flags, path, f"u{slot}"))
    return out


def synthetic_trace(n_requests: int, seed: int, *, model: str = DEFAULT_MODEL) -> Trace:
    """`synthetic_session` wrapped as a one-session trace (what replay takes)."""
    session = synthetic_session(n_requests, seed, model=model)
    return Trace(format="synthetic", source_digest=f"synthetic-{seed}", sessions=[session])
