"""The tiny trace the CLI, fidelity and table tests replay: three requests one minute apart,
each adding blocks, with recorded usage (uncached, read, write 5m, write 1h, output) =
(0, 0, 6000, 0, 200), (0, 6000, 1000, 0, 300), (0, 7000, 800, 0, 100)."""

from __future__ import annotations

from simulator.model import Kind, Role, Trace
from traces.builder import Hasher, RecordedUsage, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000


def tiny_trace() -> Trace:
    """The tiny trace (module docstring)."""
    b = SessionBuilder(Hasher(b"tiny"), id="s-main", kind="main", client="claude-code 2.1.34")
    sizes = [[(Role.USER, 1_000, -1)], [(Role.ASSISTANT, 200, 0), (Role.USER, 800, -1)]]
    sizes.append([(Role.ASSISTANT, 300, 1), (Role.USER, 500, -1)])
    usage = [(0, 0, 6_000, 0, 200), (0, 6_000, 1_000, 0, 300), (0, 7_000, 800, 0, 100)]
    msg = 0
    for k, blocks in enumerate(sizes):
        for role, tokens, origin in blocks:
            kind = Kind.TEXT if role == Role.ASSISTANT else Kind.TOOL_RESULT
            b.add_block(
                msg=msg,
                kind=kind,
                role=role,
                text=str(msg),
                ts=T0 + k * MINUTE - 1,
                first_request=k,
                tokens=tokens,
                origin=origin,
            )
            msg += 1
        b.add_request(ts=T0 + k * MINUTE, model=SONNET, usage=RecordedUsage(*usage[k]))
    return Trace(format="claude-code", source_digest="ab" * 32, sessions=[b.finish()])
