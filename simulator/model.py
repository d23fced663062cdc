"""The content-free trace model that every reader produces and every policy replays.

A trace holds sessions; a session is one prompt-cache domain. Blocks and requests are
stored column-wise (numpy arrays) because replay and sweeps touch millions of them and
per-object Python overhead would dominate. Nothing here holds message text: only counts,
kinds, keyed hashes and times (see traces/README.md for the compiled on-disk form).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

#: Request index meaning "never": a block that is never hidden, or never compacted away.
NEVER = np.iinfo(np.int32).max

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]


class Kind(IntEnum):
    """What a block is; the API treats each kind differently (caching, clearing, stripping)."""

    TEXT = 0
    THINKING = 1
    TOOL_USE = 2
    TOOL_RESULT = 3
    IMAGE = 4
    #: Context the client added that the transcript does not log (re-injected attachments,
    #: reminders); sized from the growth of the recorded usage.
    INJECTED = 5
    #: A compaction summary written by the recording agent.
    SUMMARY = 6


class Role(IntEnum):
    USER = 0
    ASSISTANT = 1
    SYSTEM = 2


class Flag(IntFlag):
    NONE = 0
    #: Written by the human (not by the agent, a tool or the client).
    HUMAN = 1
    #: Tool output that could be produced again by re-running the tool (Read, Grep, ...).
    REGENERABLE = 2
    #: Produced by the recording agent's own compaction; visible only under `as-recorded`.
    ARTIFACT = 4
    #: The tool call read the file named by `path_hash`.
    PATH_READ = 8
    #: The tool call wrote the file named by `path_hash`.
    PATH_WRITE = 16
    #: The tool result reported an error.
    ERROR = 32
    #: `hidden_from` marks where the API stopped counting the block (thinking of an earlier
    #: turn), not a rewind: the client still sends it, so the cached prefix is unchanged.
    STRIPPED = 64
    #: `compacted_at` marks an edit the client made without logging it (old tool results
    #: cleared after an idle gap, an interrupted turn dropped, an unexplained drop of the
    #: recorded context), inferred from the recorded usage (traces/builder.py); like a
    #: recorded compaction it is seen only by `as-recorded`.
    UNLOGGED = 128


BLOCK_COLUMNS: dict[str, Any] = {
    "msg": np.int32,  # message index within the session (blocks of one message share it)
    "kind": np.uint8,  # Kind
    "role": np.uint8,  # Role
    "tool": np.int32,  # index into Session.tools, -1 for none
    "link": np.int32,  # tool_result -> index of its tool_use block (and back), -1 for none
    "tokens_raw": np.int32,  # tiktoken cl100k estimate
    "tokens": np.int32,  # estimate anchored to the recorded usage
    "chars": np.int32,  # length of the content in characters (for char-based budgets)
    "hash": np.uint64,  # keyed content hash (prefix matching only; never reversible)
    "ts": np.int64,  # milliseconds since the Unix epoch, trace time
    "first_request": np.int32,  # first request whose context holds the block
    "hidden_from": np.int32,  # first request that no longer holds it (rewind); NEVER if none
    "compacted_at": np.int32,  # first request after the recording compacted it away; NEVER
    "origin": np.int32,  # request that produced it (assistant output), -1 otherwise
    "flags": np.uint8,  # Flag
    "path_hash": np.uint64,  # keyed hash of the file path read or written, 0 if none
    #: Whole-file size (cl100k tokens, as the Read tool shows it) that a Read result, Write
    #: or Edit observed, -1 if unknown: what restoring the file after compaction costs.
    "file_tokens": np.int32,
}

REQUEST_COLUMNS: dict[str, Any] = {
    "ts": np.int64,  # ms since epoch: when the request was sent
    "ts_end": np.int64,  # ms since epoch: when its response was complete (>= ts)
    "model": np.int32,  # index into Session.models
    "has_usage": np.bool_,
    "input": np.int64,  # uncached input tokens (Anthropic's `input_tokens`)
    "cache_read": np.int64,
    "cache_write_5m": np.int64,
    "cache_write_1h": np.int64,
    "output": np.int64,  # recorded output tokens, or the tokenizer's count where implausible
    "output_recorded": np.int64,  # output tokens as the source reported them (max over lines)
    #: System + tools prefix of this request (per model, re-inferred after a recorded
    #: compaction); -1: the session's `prefix_tokens` (sessions built without it, and
    #: compiled files of format version 3 and older).
    "prefix": np.int64,
}


#: Columns added after version 1 of the schema, and the column their default copies.
_DERIVED = {"ts_end": "ts"}
#: Columns added later whose default is a constant.
_CONSTANT = {"file_tokens": -1, "prefix": -1}


def _empty(columns: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
    return {name: np.zeros(0, dtype=dtype) for name, dtype in columns.items()}


@dataclass
class Columns:
    """A set of equal-length numpy columns with a fixed schema."""

    schema: dict[str, Any]
    data: dict[str, npt.NDArray[Any]]

    def __post_init__(self) -> None:
        for name, source in _DERIVED.items():  # columns added later default from another
            if name in self.schema and name not in self.data and source in self.data:
                self.data[name] = self.data[source].copy()
        for name, value in _CONSTANT.items():
            if name in self.schema and name not in self.data and self.data:
                n = len(next(iter(self.data.values())))
                self.data[name] = np.full(n, value, dtype=self.schema[name])
        lengths = {len(v) for v in self.data.values()}
        if set(self.data) != set(self.schema):
            raise ValueError(f"columns {sorted(self.data)} do not match {sorted(self.schema)}")
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: {lengths}")
        for name, dtype in self.schema.items():
            if self.data[name].dtype != np.dtype(dtype):
                self.data[name] = self.data[name].astype(dtype)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.data[name]

    def equals(self, other: Columns) -> bool:
        return self.schema.keys() == other.schema.keys() and all(
            self.data[k].dtype == other.data[k].dtype
            and np.array_equal(self.data[k], other.data[k])
            for k in self.schema
        )


def block_columns(data: dict[str, npt.NDArray[Any]] | None = None) -> Columns:
    return Columns(BLOCK_COLUMNS, data if data is not None else _empty(BLOCK_COLUMNS))


def request_columns(data: dict[str, npt.NDArray[Any]] | None = None) -> Columns:
    return Columns(REQUEST_COLUMNS, data if data is not None else _empty(REQUEST_COLUMNS))


def version_tuple(text: str) -> tuple[int, ...]:
    """The version in a recording's client or version string, as numbers to compare
    ("claude-code 2.1.29" -> (2, 1, 29), "0.126.0-alpha.8" -> (0, 126, 0)): the last word,
    its parts up to the first that is not a number; () when it starts with none."""
    words = text.split()
    out: list[int] = []
    for part in (words[-1] if words else "").split("-", 1)[0].split("."):
        if not (part.isascii() and part.isdigit()):
            break
        out.append(int(part))
    return tuple(out)


@dataclass(frozen=True)
class CompactionEvent:
    """A compaction the recording agent performed (kept as an event, not as history)."""

    request: int  # first request whose recorded context is the compacted one
    trigger: str  # "auto", "manual" or "unknown" (1.0.x logs only the summary)
    pre_tokens: int  # context size before compaction as the agent reported it, -1 if unknown
    summary_block: int  # index of the summary block, -1 if none was logged
    ts: int  # ms since epoch
    #: The compaction call's usage as the recording logged it: (input, cache read, cache
    #: write 5m, cache write 1h, output). Claude Code 2.1.8x+ writes that call to
    #: `subagents/agent-acompact-*.jsonl` (traces/claude_code.py); None when not logged.
    call_usage: tuple[int, int, int, int, int] | None = None
    #: When that call was sent and when its response ended (ms since epoch), as the
    #: acompact file logged them; None where not logged (compiled before format 6). The
    #: call goes out before the summary exists, the compacted request after it is
    #: written: minutes apart when the summary is long, which decides what it reads.
    call_ms: tuple[int, int] | None = None


class LoggedCall(NamedTuple):
    """A compaction call the recording logged, as `Session.logged_calls` gives it."""

    usage: tuple[int, int, int, int, int]
    #: (sent, response ended), ms since epoch (`Session.compaction_call_ms`).
    ms: tuple[int, int]


#: The stage of the rows in which a policy replays a compaction call the recording logged
#: (`CompactionEvent.call_usage`): policies/as_recorded.py sends them,
#: simulator/app/fidelity.py compares them with the logged usage.
RECORDED_CALL_STAGE = "recorded"


@dataclass(frozen=True)
class ForkContext:
    """Where a fork's context came from: its first call was sent with its parent's context
    and system prompt (Claude Code's compaction and /btw files; not a forked session file,
    whose system prompt names the new session), so it shares the prompt cache that context
    was written to (traces/claude_code.py `_Unit`).

    `block` is the last history block (in this session's numbering) of the input of the
    parent's last call the fork copied: that call's final cache marker wrote the prefix
    through it, sent at `sent_ms` (its response ended at `end_ms`) with entries of `ttl_ms`.
    """

    block: int
    sent_ms: int
    end_ms: int
    ttl_ms: int


@dataclass
class Session:
    """One prompt-cache domain: a main conversation, a subagent, or a compaction call."""

    id: str
    kind: str  # "main", "subagent" or "compaction"
    parent: int  # index of the parent session in the trace, -1 for none
    client: str  # recording client and version, e.g. "claude-code 2.1.9"
    prefix_tokens: int  # inferred system + tools prefix of the first request with usage
    tools: list[str]
    models: list[str]
    blocks: Columns = field(default_factory=block_columns)
    requests: Columns = field(default_factory=request_columns)
    events: list[CompactionEvent] = field(default_factory=list)
    #: Per model (parallel to `models`): the input window the recording client logged
    #: while running it, -1 where it logged none; empty when it logged none at all. Codex
    #: writes `model_context_window` with every token count (95% of the model's window:
    #: 258,400 for gpt-5.x's 272,000, 121,600 for gpt-5.3-codex-spark's 128,000); the
    #: model facts (simulator/models.py) cannot know a model genai-prices lacks.
    context_windows: list[int] = field(default_factory=list)
    #: Requests the recording client sent first after resuming a rollout that another
    #: program had rewritten, empty when none: Codex then rebuilt its history from that
    #: copy (traces/codex.py `joined_entries`; policies/peers/codex.py `PRESETS`).
    restored_at: list[int] = field(default_factory=list)
    #: Requests sent by a client process other than the one that sent the request before
    #: (a restart: an upgrade, a `--resume`), empty when none; a new process has lost what
    #: its predecessor held only in memory (traces/claude_code.py `_FileReader`;
    #: policies/claude_code/autocompact.py `Autocompact.restart`).
    restarted_at: list[int] = field(default_factory=list)
    #: A fork's parent context and when the parent cached it; None for any other session.
    fork: ForkContext | None = None
    #: cl100k tokens of the skill listing the recording's client announced first (Claude
    #: Code 2.1.2xx, traces/claude_code.py `_listing`), -1 where it logged none.
    skill_listing: int = -1

    def logged_window(self, request: int) -> int:
        """The window the client logged for the model of `request`, -1 if none."""
        m = int(self.requests["model"][request])
        return self.context_windows[m] if m < len(self.context_windows) else -1

    @property
    def n_requests(self) -> int:
        return len(self.requests)

    def injected_at(self, request: int) -> int:
        """Tokens of the INJECTED artifacts entering at `request`: what the builder booked
        for content the client added there without logging it. After a compaction, what
        the recorded context holds beyond the logged summary: Claude Code's restored
        attachments; Codex's summary itself, beyond the replacement history it logs."""
        b = self.blocks
        injected = (
            (b["first_request"] == request)
            & (b["kind"] == Kind.INJECTED)
            & ((b["flags"] & Flag.ARTIFACT) != 0)
        )
        return int(b["tokens"][injected].sum())

    def compaction_call_ms(self, event: CompactionEvent) -> tuple[int, int]:
        """When the recording's compaction call at `event` (0 < request < n) went out and
        its response ended: the acompact file's times where it logged them
        (`CompactionEvent.call_ms`), else the event's own time for both (the boundary,
        written as the summary was done: later than the send by the summary's writing),
        kept between the end of the response before it, which the call carries, and the
        send of the request after it, which carries its summary. Not that request's send:
        the call read what was alive when it went out, and in ../shared/traces/claude-code
        the next request came 194-29,517 s after each of the five /compact boundaries
        (an automatic compaction's boundary is at the next request's send, 79-364 s after
        the previous response: the summary's writing and the turn's own time)."""
        k = event.request
        sent, done = event.call_ms if event.call_ms is not None else (event.ts, event.ts)
        r = self.requests
        ts = int(r["ts"][k])
        sent = min(max(sent, int(r["ts_end"][k - 1])), ts)
        return sent, min(max(done, sent), ts)

    def logged_calls(self) -> dict[int, LoggedCall]:
        """Request -> each compaction call the recording logged
        (`CompactionEvent.call_usage`) that went out before one of the session's requests:
        what the recording's bill counts and `as-recorded` replays. One at request 0 or
        after the last request (a session that ends compacting) has no request to go out
        before: left out of both."""
        n = self.n_requests
        return {
            e.request: LoggedCall(e.call_usage, self.compaction_call_ms(e))
            for e in self.events
            if e.call_usage is not None and 0 < e.request < n
        }

    def recorded_context(self) -> I64:
        """Recorded context size per request: input + cache read + cache writes."""
        r = self.requests
        total: I64 = r["input"] + r["cache_read"] + r["cache_write_5m"] + r["cache_write_1h"]
        return total

    def prefix_at(self) -> I64:
        """System + tools prefix per request (the `prefix` column, -1 resolved)."""
        p: I64 = self.requests["prefix"].astype(np.int64)
        return np.where(p < 0, np.int64(self.prefix_tokens), p)

    def view_mask(self, request: int, *, as_recorded: bool = False) -> BoolArray:
        """Blocks in the context of `request`: the logical history, or what was really sent."""
        b = self.blocks
        visible: BoolArray = (b["first_request"] <= request) & (request < b["hidden_from"])
        artifact = (b["flags"] & Flag.ARTIFACT) != 0
        if as_recorded:
            visible &= request < b["compacted_at"]
        else:
            visible &= ~artifact
        return visible


@dataclass
class Trace:
    """One import unit (a session with its subagents), with where it came from."""

    format: str  # source format: "claude-code", "codex", "swe-agent"
    source_digest: str  # sha256 over the source bytes, the compile-cache key
    sessions: list[Session]
    #: Problems skipped under --lenient, by category (e.g. {"invalid-json": 3}).
    skipped: dict[str, int] = field(default_factory=dict)
    #: Where each skipped problem was, as "file-label:line" (labels, never machine paths).
    skipped_at: list[str] = field(default_factory=list)
    #: Lines read, lines ignored by type (metadata entries with no bearing on the context).
    stats: dict[str, int] = field(default_factory=dict)

    def equals(self, other: Trace) -> bool:
        """Exact structural equality (used to prove the compiled form round-trips)."""
        if (self.format, self.source_digest, self.skipped, self.skipped_at, self.stats) != (
            other.format,
            other.source_digest,
            other.skipped,
            other.skipped_at,
            other.stats,
        ):
            return False
        if len(self.sessions) != len(other.sessions):
            return False
        for a, b in zip(self.sessions, other.sessions, strict=True):
            same = (
                a.id,
                a.kind,
                a.parent,
                a.client,
                a.prefix_tokens,
                a.tools,
                a.models,
                a.context_windows,
                a.restored_at,
                a.restarted_at,
                a.fork,
                a.skill_listing,
            ) == (
                b.id,
                b.kind,
                b.parent,
                b.client,
                b.prefix_tokens,
                b.tools,
                b.models,
                b.context_windows,
                b.restored_at,
                b.restarted_at,
                b.fork,
                b.skill_listing,
            )
            if not (same and a.events == b.events):
                return False
            if not (a.blocks.equals(b.blocks) and a.requests.equals(b.requests)):
                return False
        return True
