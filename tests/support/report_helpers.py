"""Small traces, a toy compacting policy and run directories for the report tests.

Everything here is sized so the expected figures can be worked out by hand (see
tests/simulator/test_metrics.py). Blocks carry explicit token counts and the sessions record no
usage, so nothing is anchored: a block's tokens are the numbers written here, and a request's
output is the tokens of the blocks its response produced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import polars as pl

from simulator.frames import build_run
from simulator.loss import replay_with_loss
from simulator.model import Flag, Kind, Role, Session, Trace
from simulator.policy import Call, Emitter, Policy, SessionContext, SessionPolicy
from simulator.prefix import PrefixState, infer
from simulator.pricing import PriceBook
from simulator.replay import ReplayOptions
from simulator.view import NO_BLOCK, Breakpoint, chain
from traces.builder import Hasher, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000
#: $/token for SONNET in genai-prices: input, cache read, 5-minute write, output.
RATES = {"input": 3e-6, "read": 0.30e-6, "write_5m": 3.75e-6, "output": 15e-6}


def _block(b: SessionBuilder, k: int, kind: Kind, role: Role, tokens: int, **kw: Any) -> int:
    return b.add_block(
        msg=b.n_blocks,
        kind=kind,
        role=role,
        text=f"{kind.name}-{b.n_blocks}",
        ts=T0 + k * MINUTE - 1,
        first_request=k,
        tokens=tokens,
        **kw,
    )


def session_a() -> Session:
    """Five requests one minute apart under a 2,000-token prefix.

    k0: the human asks (100).  k1: the agent reads a.py (use 50, result 1,000).
    k2: agent text (40), the human again (60).  k3: the agent edits a.py (use 30, result 20).
    k4: the agent reads a.py again (use 10, result 1,000), the human (25).
    """
    b = SessionBuilder(Hasher(b"report-a"), id="s-a", kind="main", client="test")
    b.prefix_tokens = 2_000
    user, agent = Role.USER, Role.ASSISTANT
    _block(b, 0, Kind.TEXT, user, 100, flags=Flag.HUMAN)
    b.add_request(ts=T0, model=SONNET, usage=None)
    read = Flag.PATH_READ
    _block(b, 1, Kind.TOOL_USE, agent, 50, tool="Read", flags=read, path="a.py", origin=0,
           use_id="u1")  # fmt: skip
    _block(b, 1, Kind.TOOL_RESULT, user, 1_000, tool="Read", flags=read, path="a.py",
           result_for="u1")  # fmt: skip
    b.add_request(ts=T0 + MINUTE, model=SONNET, usage=None)
    _block(b, 2, Kind.TEXT, agent, 40, origin=1)
    _block(b, 2, Kind.TEXT, user, 60, flags=Flag.HUMAN)
    b.add_request(ts=T0 + 2 * MINUTE, model=SONNET, usage=None)
    write = Flag.PATH_WRITE
    _block(b, 3, Kind.TOOL_USE, agent, 30, tool="Edit", flags=write, path="a.py", origin=2,
           use_id="u2")  # fmt: skip
    _block(b, 3, Kind.TOOL_RESULT, user, 20, tool="Edit", flags=write, path="a.py",
           result_for="u2")  # fmt: skip
    b.add_request(ts=T0 + 3 * MINUTE, model=SONNET, usage=None)
    _block(b, 4, Kind.TOOL_USE, agent, 10, tool="Read", flags=read, path="a.py", origin=3,
           use_id="u3")  # fmt: skip
    _block(b, 4, Kind.TOOL_RESULT, user, 1_000, tool="Read", flags=read, path="a.py",
           result_for="u3")  # fmt: skip
    _block(b, 4, Kind.TEXT, user, 25, flags=Flag.HUMAN)
    b.add_request(ts=T0 + 4 * MINUTE, model=SONNET, usage=None)
    return b.finish()


def session_b() -> Session:
    """Three requests under a 1,500-token prefix; the recording compacts before k2.

    k0: the human (200).  k1: agent text (100).  k2: the recording's summary (150) and the
    context it restored (80) replace both; the human again (50).
    """
    b = SessionBuilder(Hasher(b"report-b"), id="s-b", kind="main", client="test")
    b.prefix_tokens = 1_500
    human = _block(b, 0, Kind.TEXT, Role.USER, 200, flags=Flag.HUMAN)
    b.add_request(ts=T0, model=SONNET, usage=None)
    text = _block(b, 1, Kind.TEXT, Role.ASSISTANT, 100, origin=0)
    b.add_request(ts=T0 + MINUTE, model=SONNET, usage=None)
    _block(b, 2, Kind.SUMMARY, Role.USER, 150, flags=Flag.ARTIFACT)
    _block(b, 2, Kind.INJECTED, Role.USER, 80, flags=Flag.ARTIFACT)
    _block(b, 2, Kind.TEXT, Role.USER, 50, flags=Flag.HUMAN)
    b.compact_away(human, 2)
    b.compact_away(text, 2)
    b.add_request(ts=T0 + 2 * MINUTE, model=SONNET, usage=None)
    return b.finish()


def trace_a() -> Trace:
    return Trace(format="claude-code", source_digest="aa" * 32, sessions=[session_a()])


def trace_b() -> Trace:
    return Trace(format="claude-code", source_digest="bb" * 32, sessions=[session_b()])


class _ToyState(SessionPolicy):
    """The logical history after the prefix; a compaction replaces it with one summary."""

    def __init__(self, ctx: SessionContext, p: dict[str, Any]) -> None:
        self.ctx = ctx
        self.p = p
        self.view, _, self.marks = PrefixState(ctx.root, infer(ctx.session)).start_view()
        self.n_prefix = len(self.view)

    def step(self, k: int, out: Emitter) -> None:
        h, p, view = self.ctx.history, self.p, self.view
        for block in h.logical.enter[k]:  # the test sessions never drop a block
            view.append(block, h.hashes[block], h.tokens[block])
        compact, fail = k in p["compact_at"], k in p["fail_at"]
        if compact or fail:
            asked = view.copy()
            asked.append(NO_BLOCK, chain(self.ctx.root, 0xA5 + k), int(p["prompt"]))
            stage = "autocompact" if compact else "autocompact-failed"
            output = int(p["summary"]) if compact else 0
            flags = {"breaker_trip": fail}
            out.call(asked, Call("compaction", stage, [], output, flags, cached=False))
            if compact:
                view.truncate(self.n_prefix)
                view.append(NO_BLOCK, chain(self.ctx.root, 0x5A + k), int(p["summary"]))
        marks = [Breakpoint(m) for m in self.marks] + [Breakpoint(len(view) - 1)]
        overflow = {"overflow": view.total > int(p["window"])}
        out.call(view, Call("request", "", marks, self.ctx.output[k], overflow))


class Toy(Policy):
    """A compacting policy small enough to follow by hand."""

    name = "toy"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "compact_at": [3],
        "fail_at": [4],
        "summary": 300,
        "prompt": 200,
        "window": 3_300,
        "autocompact.threshold": 3_200,
    }

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _ToyState(ctx, self.params)


_PRICES: list[PriceBook] = []


def prices() -> PriceBook:
    if not _PRICES:
        _PRICES.append(PriceBook())
    return _PRICES[0]


def replayed(traces: list[tuple[str, Trace]], policy: Policy) -> pl.DataFrame:
    return replay_with_loss(traces, policy, ReplayOptions(), prices())


def write_run(
    out: Path, traces: list[tuple[str, Trace]], policies: list[Policy]
) -> dict[str, bytes]:
    """A run directory as `ctxsim run` writes it (no report): the three files."""
    frames = [replayed(traces, p) for p in policies]
    outputs = build_run(
        frames,
        [p.spec() for p in policies],
        traces,
        seed=0,
        cache="auto",
        prices_version=prices().version,
        lenient=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    for name, data in outputs.files.items():
        (out / name).write_bytes(data)
    return outputs.files
