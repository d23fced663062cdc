"""Synthetic Claude-Code-like sessions: deterministic, any length, fitted to the corpus.

`synthetic_session(n, seed)` builds, through the same `SessionBuilder` the readers use, a
main session of `n` recorded requests that looks like a Claude Code agent loop. It exists
for benchmarks (a 10,000-request session is longer than any trace in the corpus), for
tests that need a session of a chosen size, and for sweeps over more sessions than were
ever recorded (`write_corpus`, behind `ctxsim synth`). The same `(n, seed, index, model,
params)` always gives the identical session (`Trace.equals`), and `write_corpus` the
identical bytes; no tokenizer runs (every block has explicit tokens).

The distributions are fitted to the real Claude Code main sessions of ../shared/traces by
`python -m simulator.app.measure.synth_fit`, which writes them to `synthetic_params.json`
beside this module (read into `SynthParams`); traces/README.md, section "Synthetic traces", gives
the method and the numbers.

Shape of a session
------------------
* Request 0 carries the human's first prompt. The response of request k (thinking, then
  assistant text and/or tool_use blocks, `origin=k`) enters the context at k+1 together
  with the tool results it asked for; a response without tool_use ends the turn and
  request k+1 carries a new human message instead. The last response enters at request
  `n` (after the last request), as the Claude Code reader lays a transcript's tail.
* The system + tools prefix is read from cache in full at request 0 (other sessions keep
  it warm), so the inferred prefix is one segment of `prefix_tokens`.
* Recorded usage follows a 5-minute cache with a breakpoint on the last block: context =
  prefix + the counted visible blocks; if the gap since the previous request is under 5
  minutes (and nothing was compacted) the previous context is read and the growth
  written, otherwise only the prefix is read and the rest written; `input` (uncached) is 0
  and the output is the exact size of the response, so anchoring keeps every token count
  as drawn. A request adds at most 2 + 2 x MAX_CALLS blocks, inside the API's 20-block
  cache lookback, so a warm read always finds the previous entry.
* Thinking: for a model that does not keep earlier turns' thinking
  (`traces.claude_code.PRESERVES_THINKING`), a new human turn strips every thinking block
  counted so far, and those entering with it (`SessionBuilder.strip`): the context shrinks
  by them and the warm read is the previous context less them (the API deletes them by
  reference; the cached prefix stays valid). The fitted default model keeps thinking.
* Compaction: when the next context would pass `COMPACT_AT` tokens, every block visible so
  far (this request's new blocks included) gets `compacted_at = k` and a SUMMARY ARTIFACT
  block enters at k, with a `CompactionEvent(k, "auto", ...)`. Replayed as recorded the
  context is a sawtooth; the logical history (what policies project) keeps everything.

Draws: every size is log-normal, rounded and clipped to the observed 1st-99th percentile;
tool_use and tool_result sizes and the error rate depend on the tool. A gap is idle (5
minutes or more: the cache expires) with the fitted share of its class (inside a turn, or
before a human turn), drawn log-uniformly in [5 min, 1 h) or [1 h, longest observed gap];
otherwise it is the class's log-normal. Not fitted: the response's share of the gap
(uniform 0.2-0.8), the 60 file paths that Read/Edit/Write name, and `COMPACT_AT`.

Not modelled: images, subagents and the compaction call's own session, rewinds, 1-hour
cache writes, INJECTED context.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from simulator.model import CompactionEvent, Flag, Kind, Role, Session, Trace
from traces import compiled
from traces.builder import Hasher, RecordedUsage, SessionBuilder
from traces.claude_code import PRESERVES_THINKING, READ_TOOLS, REGENERABLE_TOOLS, WRITE_TOOLS

#: The fitted parameters, package data beside this module
#: (`python -m simulator.app.measure.synth_fit`).
PARAMS_PATH = Path(__file__).with_name("synthetic_params.json")
#: Context size (tokens) beyond which the synthetic agent compacts (Claude Code's auto
#: compaction fires a little below 170k on a 200k window).
COMPACT_AT = 160_000
FIVE_MINUTES_MS = 5 * 60 * 1000
ONE_HOUR_MS = 60 * 60 * 1000
#: Shortest idle gap: the replayed 5-minute entry is alive through exactly 5 minutes, so
#: an idle gap must be longer for the recorded cold read to be what replay finds.
IDLE_MIN_MS = FIVE_MINUTES_MS + 1_000
#: Most tool calls in one response. With a thinking and a text block a request then adds
#: at most 18 blocks, within the API's 20-block cache lookback (a longer turn would miss
#: the cache, which the recorded usage here does not model).
MAX_CALLS = 8
#: The name of the pooled tools outside the fitted top tools.
OTHER_TOOL = "Other"
#: Trace time of request 0 (2025-10-01T00:00:00Z): any fixed instant will do.
START_MS = 1_759_276_800_000
N_PATHS = 60
CLIENT = "synthetic 2"


# -- parameters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogNormal:
    """exp(N(mu, sigma)), rounded and clipped to [lo, hi]: the fitted shape of a size or a
    gap (the clip keeps the log-normal's tail inside what was observed)."""

    mu: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (1 <= self.lo <= self.hi) or self.sigma < 0:
            raise ValueError(f"bad log-normal {self}")

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogNormal:
        return cls(float(d["log_mu"]), float(d["log_sigma"]), int(d["lo"]), int(d["hi"]))

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        return _rounded(self.mu + self.sigma * rng.standard_normal(n), self.lo, self.hi)


@dataclass(frozen=True)
class ToolParams:
    """One tool: its share of tool calls, its call and result sizes, its error rate."""

    name: str
    share: float
    use: LogNormal
    result: LogNormal
    error: float


@dataclass(frozen=True)
class GapClass:
    """Gaps before one class of request (inside a turn, or before a human turn)."""

    short: LogNormal  # gaps under 5 minutes
    idle: float  # share of gaps of 5 minutes or more
    over_1h: float  # share of gaps of 1 hour or more (part of `idle`)

    def __post_init__(self) -> None:
        if self.short.hi >= FIVE_MINUTES_MS or not 0 <= self.over_1h <= self.idle <= 1:
            raise ValueError(f"bad gap class {self}")


@dataclass(frozen=True)
class SynthParams:
    """Everything the generator draws from (see synthetic_params.json `methods`)."""

    model: str
    prefix: LogNormal
    human_share: float  # share of requests after the first that start a human turn
    human: LogNormal
    calls: tuple[float, ...]  # P(1 .. len(calls) tool calls | at least one)
    text_final: LogNormal  # text of a response that ends the turn (always present)
    text_with_tools_share: float
    text_with_tools: LogNormal
    thinking_share: float
    thinking: LogNormal
    tools: tuple[ToolParams, ...]
    gap_turn: GapClass
    gap_human: GapClass
    idle_max_ms: int
    summary: LogNormal

    def __post_init__(self) -> None:
        if not 1 <= len(self.calls) <= MAX_CALLS:
            raise ValueError(f"calls per response must be 1..{MAX_CALLS}")
        shares = (self.human_share, self.text_with_tools_share, self.thinking_share)
        if not all(0 <= s <= 1 for s in shares) or self.human_share <= 0:
            raise ValueError("shares must be within [0, 1] and turns must end")
        for name, p in (("calls", self.calls), ("tools", [t.share for t in self.tools])):
            if not p or min(p) < 0 or abs(sum(p) - 1) > 0.01:
                raise ValueError(f"{name} probabilities must sum to 1")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SynthParams:
        """From the data file's structure (simulator/app/measure/synth_fit.py writes it)."""
        ln = LogNormal.from_dict
        gaps = d["gaps_ms"]

        def share(entry: dict[str, Any]) -> float:
            return float(entry["share"])

        def gap(c: dict[str, Any]) -> GapClass:
            return GapClass(ln(c["short"]), share(c["idle_share"]), share(c["over_1h_share"]))

        tools = tuple(
            ToolParams(
                str(t["name"]), share(t["share"]), ln(t["use"]), ln(t["result"]), share(t["error"])
            )
            for t in d["tools"]["top"]
        )
        return cls(
            model=str(d["model"]["name"]),
            prefix=ln(d["prefix_tokens"]),
            human_share=share(d["human_turns"]),
            human=ln(d["human_tokens"]),
            calls=tuple(float(p) for p in d["calls_per_response"]["p"]),
            text_final=ln(d["text_final_tokens"]),
            text_with_tools_share=share(d["text_with_tools"]),
            text_with_tools=ln(d["text_with_tools_tokens"]),
            thinking_share=share(d["thinking"]),
            thinking=ln(d["thinking_tokens"]),
            tools=tools,
            gap_turn=gap(gaps["turn"]),
            gap_human=gap(gaps["human"]),
            idle_max_ms=int(gaps["idle_max"]),
            summary=ln(d["summary_tokens"]),
        )

    def digest(self) -> str:
        """A short stable name of these parameters (part of a synthetic trace's digest)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]


def load_params(path: Path | None = None) -> SynthParams:
    """The fitted parameters (the committed data file unless `path` names another)."""
    return _load(path or PARAMS_PATH)


@cache
def _load(path: Path) -> SynthParams:
    return SynthParams.from_dict(json.loads(path.read_text()))


# -- draws ---------------------------------------------------------------------------------


def _rounded(x: npt.NDArray[np.float64], lo: Any, hi: Any) -> list[int]:
    """exp(x) rounded and clipped (`lo`/`hi` scalars or per-draw arrays)."""
    out: list[int] = np.clip(np.rint(np.exp(x)), lo, hi).astype(np.int64).tolist()
    return out


def _normalized(p: Sequence[float]) -> npt.NDArray[np.float64]:
    """Probabilities rounded in the data file, made to sum to 1 as numpy requires."""
    a = np.asarray(p, dtype=np.float64)
    normal: npt.NDArray[np.float64] = a / a.sum()
    return normal


def _per_tool(
    rng: np.random.Generator, tool: npt.NDArray[np.int64], dists: Sequence[LogNormal]
) -> list[int]:
    """One size per call, each from its own tool's log-normal."""
    mu = np.array([d.mu for d in dists])[tool]
    sigma = np.array([d.sigma for d in dists])[tool]
    lo = np.array([d.lo for d in dists])[tool]
    hi = np.array([d.hi for d in dists])[tool]
    return _rounded(mu + sigma * rng.standard_normal(len(tool)), lo, hi)


def _gaps(rng: np.random.Generator, n: int, c: GapClass, idle_max: int) -> list[int]:
    """Gaps of one class: short (log-normal) or idle (log-uniform in its band)."""
    u = rng.random(n)
    short = np.asarray(c.short.draw(rng, n), dtype=np.float64)
    v = rng.random(n)
    long = u < c.over_1h
    lo = np.where(long, ONE_HOUR_MS, IDLE_MIN_MS).astype(np.float64)
    hi = np.where(long, max(idle_max, ONE_HOUR_MS + 1), ONE_HOUR_MS - 1).astype(np.float64)
    idle = np.exp(np.log(lo) + v * (np.log(hi) - np.log(lo)))
    gaps: list[int] = np.rint(np.where(u < c.idle, idle, short)).astype(np.int64).tolist()
    return gaps


class _Draws:
    """Every random quantity of the session, drawn up front in a fixed order (cheap, and
    the session depends on nothing but the seed, the index and the length)."""

    def __init__(self, rng: np.random.Generator, n: int, p: SynthParams) -> None:
        k_max = self.k_max = len(p.calls)
        slots = k_max * n  # slot k_max*k + j: call j of request k's response
        self.prefix = p.prefix.draw(rng, 1)[0]
        self.human = p.human.draw(rng, n)
        ends = rng.random(n) < p.human_share
        calls = 1 + rng.choice(k_max, size=n, p=_normalized(p.calls))
        self.n_uses: list[int] = np.where(ends, 0, calls).tolist()
        self.has_text: list[bool] = (rng.random(n) < p.text_with_tools_share).tolist()
        self.text_final = p.text_final.draw(rng, n)
        self.text_tools = p.text_with_tools.draw(rng, n)
        self.has_thinking: list[bool] = (rng.random(n) < p.thinking_share).tolist()
        self.thinking = p.thinking.draw(rng, n)
        tool = rng.choice(len(p.tools), size=slots, p=_normalized([t.share for t in p.tools]))
        self.tool: list[int] = tool.tolist()
        self.use = _per_tool(rng, tool, [t.use for t in p.tools])
        self.result = _per_tool(rng, tool, [t.result for t in p.tools])
        error_p = np.array([t.error for t in p.tools])[tool]
        self.error: list[bool] = (rng.random(slots) < error_p).tolist()
        self.path: list[int] = rng.integers(0, N_PATHS, size=slots).tolist()
        self.gap_turn = _gaps(rng, n, p.gap_turn, p.idle_max_ms)
        self.gap_human = _gaps(rng, n, p.gap_human, p.idle_max_ms)
        self.summary = p.summary.draw(rng, n)
        #: Share of the gap after a request that the response takes to arrive.
        self.latency: list[float] = rng.uniform(0.2, 0.8, n).tolist()


# -- sessions ------------------------------------------------------------------------------


def synthetic_session(
    n_requests: int,
    seed: int,
    *,
    model: str | None = None,
    index: int = 0,
    params: SynthParams | None = None,
) -> Session:
    """A deterministic Claude-Code-like main session of `n_requests` requests.

    `(seed, index)` seeds the draws (`seed`, `index` >= 0), so the sessions of one corpus
    are independent streams of one seed; `model` defaults to the fitted one."""
    if n_requests < 1:
        raise ValueError("a synthetic session needs at least one request")
    p = params or load_params()
    model = model or p.model
    strips = PRESERVES_THINKING.match(model) is None
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    d = _Draws(rng, n_requests, p)
    b = SessionBuilder(
        Hasher(f"synthetic {seed} {index}".encode()),
        id=f"synthetic-{seed}-{index}",
        kind="main",
        client=CLIENT,
    )
    tools = [t.name for t in p.tools]
    prefix = d.prefix
    live: list[int] = []  # blocks in the as-recorded context
    held = 0  # their counted tokens
    thinking: dict[int, int] = {}  # counted thinking blocks a new human turn strips
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
            gap = d.gap_human[k - 1] if human_turn else d.gap_turn[k - 1]
        response_ts = ts + int(gap * d.latency[k - 1]) if k > 0 else ts
        ts += gap
        entering: list[int] = []
        counted = 0  # tokens of the entering blocks that the context counts
        new_thinking: dict[int, int] = {}
        for out in response:
            blk = add(
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
            entering.append(blk)
            if out.kind == Kind.THINKING and strips:
                new_thinking[blk] = out.tokens
            else:
                counted += out.tokens
        if response:
            msg += 1
        if k == n_requests:
            break  # the last response is in the history, after the last request
        if human_turn:
            counted += d.human[k]
            entering.append(add(Kind.TEXT, Role.USER, d.human[k], k, ts, flags=Flag.HUMAN))
            msg += 1
        else:
            for out in response:
                if out.use_id is None:
                    continue
                counted += d.result[out.slot]
                entering.append(_result(add, d, out, k, ts))
            msg += 1
        stripping = human_turn and k > 0 and strips
        if stripping:  # this turn's thinking never counts; earlier turns' stops counting
            released = sum(thinking.values())
        else:
            released = 0
            counted += sum(new_thinking.values())
        compacted = k > 0 and prefix + held - released + counted > COMPACT_AT
        if compacted:
            for blk in live + entering:
                b.compact_away(blk, k)
            thinking = {}  # compacted away: no later turn strips it (as the reader does)
            held = d.summary[k]
            summary = add(Kind.SUMMARY, Role.USER, held, k, ts, flags=Flag.ARTIFACT)
            msg += 1
            b.add_event(CompactionEvent(k, "auto", context, summary, ts))
            live = [summary]
        else:
            if stripping:
                for blk in [*thinking, *new_thinking]:
                    b.strip(blk, k)
                thinking = {}
            else:
                thinking.update(new_thinking)
            live.extend(entering)
            held += counted - released
        warm = k > 0 and not compacted and gap < FIVE_MINUTES_MS
        read = context - released if warm else prefix
        context = prefix + held
        response = _respond(d, k, tools)
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
    """One block of a response: thinking, assistant text, or a tool call (with its slot)."""

    kind: Kind
    tokens: int
    slot: int = -1
    tool: str | None = None
    flags: Flag = Flag.NONE
    path: str | None = None
    use_id: str | None = None


def _respond(d: _Draws, k: int, tools: list[str]) -> list[_Out]:
    """The response of request k: thinking, then text and/or tool calls (a response
    without a call ends the turn and always has text: the answer)."""
    out: list[_Out] = []
    if d.has_thinking[k]:
        out.append(_Out(Kind.THINKING, d.thinking[k]))
    n_uses = d.n_uses[k]
    if n_uses == 0:
        out.append(_Out(Kind.TEXT, d.text_final[k]))
    elif d.has_text[k]:
        out.append(_Out(Kind.TEXT, d.text_tools[k]))
    for j in range(n_uses):
        slot = d.k_max * k + j
        tool = tools[d.tool[slot]]
        flags = Flag.NONE
        path = None
        if tool in READ_TOOLS or tool in WRITE_TOOLS:
            path = f"src/module_{d.path[slot]}.py"
            flags = Flag.PATH_READ if tool in READ_TOOLS else Flag.PATH_WRITE
        out.append(_Out(Kind.TOOL_USE, d.use[slot], slot, tool, flags, path, f"u{slot}"))
    return out


def _result(add: Any, d: _Draws, use: _Out, k: int, ts: int) -> int:
    """The tool_result block answering `use`, entering at request k."""
    flags = Flag.REGENERABLE if use.tool in REGENERABLE_TOOLS else Flag.NONE
    flags |= use.flags
    if d.error[use.slot]:
        flags |= Flag.ERROR
    block: int = add(
        Kind.TOOL_RESULT,
        Role.USER,
        d.result[use.slot],
        k,
        ts,
        tool=use.tool,
        flags=flags,
        path=use.path,
        result_for=use.use_id,
    )
    return block


def synthetic_trace(
    n_requests: int,
    seed: int,
    *,
    index: int = 0,
    params: SynthParams | None = None,
    model: str | None = None,
) -> Trace:
    """`synthetic_session` as a one-session trace (what replay and the compiled form take).

    Its digest names everything the session depends on, so two synthetic traces share a
    digest (and a compile-cache key) only when they are the same session."""
    p = params or load_params()
    session = synthetic_session(n_requests, seed, model=model, index=index, params=p)
    model_name = session.models[0] if session.models else ""
    name = f"synthetic n={n_requests} seed={seed} index={index} model={model_name}"
    digest = hashlib.sha256(f"{name} params={p.digest()}".encode()).hexdigest()
    return Trace(format="synthetic", source_digest=digest, sessions=[session])


def write_corpus(
    out: Path, sessions: int, requests: int, seed: int, *, params: SynthParams | None = None
) -> list[Path]:
    """Write `sessions` synthetic sessions of `requests` requests as compiled traces
    `synth-<seed>-<index>.ctxt` in `out`; the same arguments always write the same bytes."""
    out.mkdir(parents=True, exist_ok=True)
    p = params or load_params()
    paths: list[Path] = []
    for index in range(sessions):
        path = out / f"synth-{seed}-{index}.ctxt"
        # Atomic (rename) but not fsynced, as `traces import` writes: a crash may lose a
        # file, never leave half of one.
        compiled.write(synthetic_trace(requests, seed, index=index, params=p), path, durable=False)
        paths.append(path)
    return paths
