"""The tiny trace the fidelity, CLI and table tests replay: three requests one minute apart
(a 1,000-token message; a 200-token response and an 800-token result; a 300-token response
and a 500-token result), with the recorded usage given, by default `EXACT`, what the
Anthropic cache rules give for it."""

from __future__ import annotations

from simulator.model import Kind, Role, Trace
from traces.builder import Hasher, RecordedUsage, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000

#: (uncached input, cache read, write 5m, write 1h, output) per request, by the cache rules.
EXACT = [(0, 0, 6_000, 0, 200), (0, 6_000, 1_000, 0, 300), (0, 7_000, 800, 0, 100)]


def tiny_trace(usage: list[tuple[int, int, int, int, int]] = EXACT, sid: str = "s-main") -> Trace:
    """The three-request session above, with the given recorded usage; its source digest is
    the session id's bytes in hex, padded with zeros."""
    b = SessionBuilder(Hasher(sid.encode()), id=sid, kind="main", client="claude-code 2.1.34")

    def block(msg: int, k: int, role: Role, tokens: int, origin: int = -1) -> None:
        kind = Kind.TEXT if role == Role.ASSISTANT else Kind.TOOL_RESULT
        ts = T0 + k * MINUTE - 1
        b.add_block(
            msg=msg,
            kind=kind,
            role=role,
            text=f"{msg}",
            ts=ts,
            first_request=k,
            tokens=tokens,
            origin=origin,
        )

    block(0, 0, Role.USER, 1_000)
    b.add_request(ts=T0, model=SONNET, usage=RecordedUsage(*usage[0]))
    block(1, 1, Role.ASSISTANT, 200, origin=0)
    block(2, 1, Role.USER, 800)
    b.add_request(ts=T0 + MINUTE, model=SONNET, usage=RecordedUsage(*usage[1]))
    block(3, 2, Role.ASSISTANT, 300, origin=1)
    block(4, 2, Role.USER, 500)
    b.add_request(ts=T0 + 2 * MINUTE, model=SONNET, usage=RecordedUsage(*usage[2]))
    return Trace(
        format="claude-code", source_digest=sid.encode().hex().ljust(64, "0"), sessions=[b.finish()]
    )
