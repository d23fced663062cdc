"""Hand-built sessions for the policy tests, and the rows of their replay.

`Script` writes a session turn by turn, with the conventions the peer-policy tests state in
their docstrings: an explicit prefix and no recorded usage (block tokens are exactly the
numbers written, each request's cache TTL is 5 minutes), 4 characters per token, one
message per block, requests one minute apart, a "round" being the response to the
previous request (a tool_use) and its result, both entering at the next request.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from simulator.model import Flag, Kind, Role, Trace
from traces.builder import Hasher, SessionBuilder

SONNET = "claude-sonnet-4-5-20250929"
T0 = 1_760_000_000_000
MINUTE = 60_000


class Script:
    """A session written turn by turn; `tool` names the tool of rounds that name none."""

    def __init__(self, prefix: int = 10_000, tool: str = "Bash") -> None:
        self.b = SessionBuilder(Hasher(b"peers"), id="s", kind="main", client="claude-code 2.1.88")
        self.b.prefix_tokens = prefix
        self.default_tool = tool
        self.k = 0  # index of the next request
        self.msg = 0
        self.ts = T0
        self.n = 0

    def _add(self, kind: Kind, role: Role, tokens: int, **kw: Any) -> int:
        self.msg += 1
        self.n += 1
        return self.b.add_block(
            msg=self.msg,
            kind=kind,
            role=role,
            text=f"#{self.n}#".ljust(4 * tokens, "x"),
            ts=self.ts,
            first_request=self.k,
            tokens=tokens,
            **kw,
        )

    def user(self, tokens: int) -> int:
        """A message the human wrote."""
        return self._add(Kind.TEXT, Role.USER, tokens, flags=Flag.HUMAN)

    def say(self, tokens: int) -> int:
        """Assistant text: the response to the previous request."""
        return self._add(Kind.TEXT, Role.ASSISTANT, tokens, origin=self.k - 1)

    def tool(self, result: int, name: str | None = None, use: int = 100) -> tuple[int, int]:
        """One round: a tool_use (the response to the previous request) and its result;
        returns (tool_use block, tool_result block)."""
        name = name or self.default_tool
        uid = f"u{self.n}"
        use_block = self._add(
            Kind.TOOL_USE, Role.ASSISTANT, use, origin=self.k - 1, tool=name, use_id=uid
        )
        result_block = self._add(Kind.TOOL_RESULT, Role.USER, result, tool=name, result_for=uid)
        return use_block, result_block

    def request(self) -> int:
        """A request one minute after the previous one; returns its index."""
        if self.k:
            self.ts += MINUTE
        self.b.add_request(ts=self.ts, model=SONNET, usage=None)
        self.k += 1
        return self.k - 1

    def rounds(self, n: int, result: int, name: str | None = None) -> None:
        """n rounds, one request each."""
        for _ in range(n):
            self.tool(result, name)
            self.request()

    def trace(self) -> Trace:
        return Trace(format="claude-code", source_digest="t", sessions=[self.b.finish()])


# -- rows of a replay ----------------------------------------------------------------------


def contexts(frame: pl.DataFrame) -> list[int]:
    """context_tokens of each request row, by request."""
    return frame.filter(pl.col("kind") == "request").sort("request")["context_tokens"].to_list()


def compactions(frame: pl.DataFrame) -> list[tuple[int, str]]:
    """(request, stage) of each compaction call, in the order they were made."""
    rows = frame.filter(pl.col("kind") == "compaction")
    return list(zip(rows["request"].to_list(), rows["stage"].to_list(), strict=True))


def row(
    frame: pl.DataFrame, request: int, kind: str = "request", stage: str | None = None
) -> dict[str, Any]:
    """The one row of a request of that kind (and stage, when given)."""
    match = (pl.col("request") == request) & (pl.col("kind") == kind)
    if stage is not None:
        match &= pl.col("stage") == stage
    rows = frame.filter(match)
    assert rows.height == 1, rows
    return rows.row(0, named=True)


def usage(r: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """(context, uncached, cache read, cache write 5m, output) of a row."""
    return (
        r["context_tokens"],
        r["uncached_input"],
        r["cache_read"],
        r["cache_write_5m"],
        r["output"],
    )
