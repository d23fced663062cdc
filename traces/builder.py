"""Turns what a reader saw into a content-free Session: hashing, token counts, anchoring.

Readers hand over text; the builder keeps only its length, its cl100k token count and a
keyed hash, so no reader can leak content into the compiled trace by accident.

Anchoring (DESIGN.md section 2): where a session has recorded usage, the recorded context
size of request k (input + cache read + cache writes) is known. Blocks entering the
context at k receive, between them, exactly the recorded growth over what the previous
request held (after removing what left the context: rewinds and the recording's own
compactions), split in proportion to their raw tiktoken estimates with largest-remainder
rounding. Growth with no block to carry it (re-injected attachments, reminders the
transcript does not log) becomes an INJECTED block. The system + tools prefix is per
request (per model, re-inferred after a recorded compaction), and a shrink that nothing
logged explains is an explicit unlogged edit of the oldest content the client could have
dropped (`_Anchoring` states each rule and its evidence), so the as-recorded view of every
request with usage is its recorded context.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from simulator.model import (
    BLOCK_COLUMNS,
    NEVER,
    REQUEST_COLUMNS,
    Columns,
    CompactionEvent,
    Flag,
    ForkContext,
    Kind,
    Role,
    Session,
    Trace,
)
from traces.bounds import MAX_CONTEXT_TOKENS
from traces.errors import Problems
from traces.source import ImportUnit
from traces.tokens import count_tokens

#: Claude Code's own size estimate for an image (DESIGN.md section 4); used as the raw count.
IMAGE_TOKENS = 2_000
#: Recorded output below this share of the tokenizer's count of the response is treated as
#: a streaming snapshot (Claude Code 2.1.x logs output_tokens mid-stream) and replaced.
OUTPUT_PLAUSIBLE_SHARE = 0.5


class Hasher:
    """Keyed 64-bit content hashes.

    The key is derived from the whole source (all files of the import unit), so hashes are
    stable for a given source yet cannot be checked against guessed short strings by anyone
    who holds only the compiled file.
    """

    def __init__(self, key: bytes) -> None:
        self._key = hashlib.blake2b(key, person=b"ctxsim-key", digest_size=32).digest()
        self._base = hashlib.blake2b(key=self._key, digest_size=8)

    def hash(self, *parts: str) -> int:
        """Hash of the parts; a separator that text cannot contain keeps ("ab","c") apart
        from ("a","bc")."""
        h = self._base.copy()
        h.update("\udfff".join(parts).encode("utf-8", "surrogatepass"))
        return int.from_bytes(h.digest(), "little") or 1


@dataclass
class RecordedUsage:
    """Input-side usage as Anthropic reports it (input excludes cached tokens)."""

    input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output: int
    #: The inference passes of a call the server ran more than once (a server tool, e.g.
    #: the advisor), whose sums are the figures above; empty for an ordinary call.
    iterations: tuple[RecordedUsage, ...] = ()

    @property
    def context(self) -> int:
        return self.input + self.cache_read + self.cache_write_5m + self.cache_write_1h


def _count(value: Any) -> int | None:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def usage_iterations(usage: Any) -> tuple[RecordedUsage, ...]:
    """The inference passes of an Anthropic usage object (`usage.iterations`, entries of
    type "message"), when there are at least two and they sum to the call's figures.

    With a server tool (the advisor) the API runs the model, the tool, and the model again
    on the longer context, and reports the sum: read as one request it looks like a context
    twice the size followed by an unlogged drop (issue 12's worst sessions). Entries of
    other types (`advisor_message`) are the tool's own model call, not in the sums."""
    if not isinstance(usage, dict):
        return ()
    items = usage.get("iterations")
    if not isinstance(items, list) or len(items) < 2:  # fewer than two passes: none kept
        return ()
    passes: list[RecordedUsage] = []
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        values = [
            _count(item.get(name))
            for name in (
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
                "output_tokens",
            )
        ]
        if any(v is None for v in values):
            return ()
        inp, read, created, out = (int(v or 0) for v in values)
        split = item.get("cache_creation")
        w5, w1 = created, 0
        if isinstance(split, dict):
            a, b = (
                _count(split.get("ephemeral_5m_input_tokens")),
                _count(split.get("ephemeral_1h_input_tokens")),
            )
            if a is not None and b is not None and a + b == created:
                w5, w1 = a, b
        passes.append(RecordedUsage(inp, read, w5, w1, out))
    if len(passes) < 2:
        return ()
    total = [_count(usage.get(n)) for n in ("input_tokens", "cache_read_input_tokens")]
    total.append(_count(usage.get("cache_creation_input_tokens")))
    sums = [
        sum(p.input for p in passes),
        sum(p.cache_read for p in passes),
        sum(p.cache_write_5m + p.cache_write_1h for p in passes),
    ]
    return tuple(passes) if total == sums else ()


_ROW_FIELDS = (
    "msg",
    "kind",
    "role",
    "tool",
    "tokens_raw",
    "chars",
    "hash",
    "ts",
    "first_request",
    "origin",
    "flags",
    "path_hash",
    "file_tokens",
)


#: Flags a block without a path cannot carry.
_NO_PATH_FLAGS = ~int(Flag.PATH_READ | Flag.PATH_WRITE)
#: The kind's part of a block's content hash (its number as text), made once.
_KIND_TAGS = {int(k): str(int(k)) for k in Kind}


class SessionBuilder:
    """Accumulates one session's blocks and requests in the order they enter the context."""

    def __init__(
        self, hasher: Hasher, *, id: str, kind: str, parent: int = -1, client: str = ""
    ) -> None:
        self.hasher = hasher
        self.id = id
        self.kind = kind
        self.parent = parent
        self.client = client
        #: One tuple per block (fields: _ROW_FIELDS): one append per block keeps the reader's
        #: inner loop cheap; columns are made once, in `finish`.
        self._rows: list[tuple[int, ...]] = []
        self._hidden: list[int] = []
        self._stripped: set[int] = set()
        self._compacted: list[int] = []
        self._texts: list[str | None] = []
        self._requests: dict[str, list[Any]] = {name: [] for name in REQUEST_COLUMNS}
        self._tools: dict[str, int] = {}
        self._models: dict[str, int] = {}
        self._links: list[tuple[int, str]] = []  # (tool_result block, tool_use id)
        self._file_scale: list[tuple[int, float]] = []  # (block, whole file / shown part)
        self._uses: dict[str, int] = {}  # tool_use id -> block
        self.events: list[CompactionEvent] = []
        self.prefix_tokens: int | None = None
        self.stats: dict[str, int] = {}
        #: Request -> its inference passes, for calls the server ran more than once.
        self._iterations: dict[int, tuple[RecordedUsage, ...]] = {}
        #: Requests (after splitting) that are a call's second or later pass.
        self._iteration_requests: set[int] = set()
        #: A fork's parent context (`Session.fork`): its last block, and when the parent's
        #: call cached it (sent, ended, TTL); -1 and None for any other session.
        self.fork_block = -1
        self.fork_times: tuple[int, int, int] | None = None

    # -- blocks -------------------------------------------------------------------------

    @property
    def n_blocks(self) -> int:
        return len(self._texts)

    @property
    def n_requests(self) -> int:
        return len(self._requests["ts"])

    def add_block(
        self,
        *,
        msg: int,
        kind: Kind,
        role: Role,
        text: str,
        ts: int,
        first_request: int,
        tool: str | None = None,
        flags: Flag | int = Flag.NONE,
        path: str | None = None,
        origin: int = -1,
        use_id: str | None = None,
        result_for: str | None = None,
        tokens: int | None = None,
        file_tokens: int = -1,
        file_scale: float | None = None,
    ) -> int:
        """Append a block; blocks must come in non-decreasing `first_request` order.

        `use_id` names a tool_use so a later tool_result (`result_for`) can link to it.
        `tokens` overrides the tokenizer (images, or sizes known from elsewhere).
        `file_tokens` is the whole file's size when the reader knows it (a Write's content,
        the file after an Edit); `file_scale` marks a block that shows a file, wholly or in
        part (a Read result): the file's size is the block's own tokens times the scale.
        """
        if tokens is not None and not 0 <= tokens <= MAX_CONTEXT_TOKENS:
            tokens = None  # no block outsizes a request's context: the tokenizer counts it
        if not -1 <= file_tokens <= MAX_CONTEXT_TOKENS:
            file_tokens = -1  # a file larger than any context is an unknown size
        if file_scale is not None and not 0 <= file_scale <= MAX_CONTEXT_TOKENS:
            file_scale = None
        rows = self._rows
        if rows and first_request < rows[-1][8]:
            raise ValueError("blocks must be added in non-decreasing first_request order")
        idx = len(rows)
        hasher = self.hasher
        if path:
            path_hash = hasher.hash("path", path)
            flag_bits = int(flags)
        else:
            path_hash = 0
            flag_bits = int(flags) & _NO_PATH_FLAGS
        if tool is None:
            tool_index = -1
        else:
            tool_index = self._tools.get(tool, -1)
            if tool_index < 0:
                tool_index = self._tools[tool] = len(self._tools)
        kind_id = int(kind)
        rows.append(
            (
                msg,
                kind_id,
                int(role),
                tool_index,
                -1 if tokens is None else tokens,
                len(text),
                hasher.hash(_KIND_TAGS.get(kind_id) or str(kind_id), tool or "", text),
                ts,
                first_request,
                origin,
                flag_bits,
                path_hash,
                file_tokens,
            )
        )
        if file_scale is not None:
            self._file_scale.append((idx, file_scale))
        self._hidden.append(NEVER)
        self._compacted.append(NEVER)
        self._texts.append(text if tokens is None else None)
        if use_id is not None:
            self._uses[use_id] = idx
        if result_for is not None:
            self._links.append((idx, result_for))
        return idx

    def hide(self, block: int, from_request: int) -> None:
        """Tombstone a block from a request on (a rewind left its branch)."""
        self._hidden[block] = min(self._hidden[block], from_request)

    def strip(self, block: int, from_request: int) -> None:
        """The API stops counting this block from a request on (Flag.STRIPPED)."""
        self.hide(block, from_request)
        self._stripped.add(block)

    def compact_away(self, block: int, at_request: int) -> None:
        """The recording's own compaction dropped this block from `at_request` on."""
        self._compacted[block] = min(self._compacted[block], at_request)

    def block_kinds(self, blocks: list[int]) -> list[int]:
        return [self._rows[b][1] for b in blocks]

    def add_request(
        self, *, ts: int, model: str, usage: RecordedUsage | None, ts_end: int | None = None
    ) -> int:
        """A recorded request sent at `ts` whose response was complete at `ts_end`."""
        r = self._requests
        idx = len(r["ts"])
        if model not in self._models:
            self._models[model] = len(self._models)
        r["ts"].append(ts)
        r["ts_end"].append(max(ts, ts_end if ts_end is not None else ts))
        r["model"].append(self._models[model])
        r["has_usage"].append(usage is not None)
        u = usage or RecordedUsage(0, 0, 0, 0, 0)
        r["input"].append(u.input)
        r["cache_read"].append(u.cache_read)
        r["cache_write_5m"].append(u.cache_write_5m)
        r["cache_write_1h"].append(u.cache_write_1h)
        r["output"].append(u.output)
        r["output_recorded"].append(u.output)
        r["prefix"].append(-1)
        if len(u.iterations) > 1:
            self._iterations[idx] = u.iterations
        return idx

    def set_output(self, request: int, output: int) -> None:
        """Raise a request's recorded output (streamed lines repeat it; keep the largest)."""
        r = self._requests
        r["output_recorded"][request] = max(r["output_recorded"][request], output)
        r["output"][request] = r["output_recorded"][request]

    def add_event(self, event: CompactionEvent) -> None:
        self.events.append(event)

    def _tool_index(self, tool: str | None) -> int:
        if tool is None:
            return -1
        if tool not in self._tools:
            self._tools[tool] = len(self._tools)
        return self._tools[tool]

    # -- finishing ----------------------------------------------------------------------

    def finish(self, token_cache: dict[int, int] | None = None) -> Session:
        """Count tokens, link tool pairs, fix implausible outputs, anchor to usage."""
        cache = token_cache if token_cache is not None else {}
        self._split_iterations()
        n = len(self._rows)
        columns = list(zip(*self._rows, strict=True)) if n else [()] * len(_ROW_FIELDS)
        blocks = {
            name: np.asarray(col, dtype=BLOCK_COLUMNS[name])
            for name, col in zip(_ROW_FIELDS, columns, strict=True)
        }
        raw = blocks["tokens_raw"]
        hashes = blocks["hash"].tolist()
        for i in np.nonzero(raw < 0)[0].tolist():
            h = hashes[i]
            count = cache.get(h)
            if count is None:
                count = count_tokens(self._texts[i] or "")
                cache[h] = count
            raw[i] = count
        for i, scale in self._file_scale:
            size = round(int(raw[i]) * scale)
            blocks["file_tokens"][i] = size if size <= MAX_CONTEXT_TOKENS else -1
        link = np.full(n, -1, dtype=np.int32)
        for result, use_id in self._links:
            use = self._uses.get(use_id)
            if use is not None:
                link[result] = use
                link[use] = result
        blocks["link"] = link
        blocks["hidden_from"] = np.asarray(self._hidden, dtype=np.int32)
        blocks["compacted_at"] = np.asarray(self._compacted, dtype=np.int32)
        if self._stripped:
            stripped = np.fromiter(sorted(self._stripped), dtype=np.int64)
            blocks["flags"][stripped] |= np.uint8(Flag.STRIPPED)
        blocks["tokens"] = np.zeros(n, dtype=np.int32)
        blocks = {name: blocks[name] for name in BLOCK_COLUMNS}  # schema order
        requests = {k: np.asarray(v, dtype=REQUEST_COLUMNS[k]) for k, v in self._requests.items()}
        blocks["tokens"] = blocks["tokens_raw"].copy()
        self._fix_outputs(blocks, requests)
        blocks, prefix = self._anchor(blocks, requests)
        fork = None
        if self.fork_block >= 0 and self.fork_times is not None:
            sent, end, ttl = self.fork_times
            fork = ForkContext(self.fork_block, sent, max(end, sent), ttl)
        return Session(
            id=self.id,
            kind=self.kind,
            parent=self.parent,
            client=self.client,
            prefix_tokens=prefix,
            tools=list(self._tools),
            models=list(self._models),
            blocks=Columns(BLOCK_COLUMNS, blocks),
            requests=Columns(REQUEST_COLUMNS, requests),
            events=list(self.events),
            fork=fork,
        )

    def _split_iterations(self) -> None:
        """One request per inference pass of a call the server ran more than once.

        The passes share the call's times and model; blocks entering after the call enter
        after its last pass, and its response is the last pass's output. A later pass's
        growth (the server tool's use and result, as the server laid them out) is an
        INJECTED artifact that leaves again at the next request: the recording's next
        request reads the cache only as far as the first pass wrote it (usage.iterations
        of ../shared: the next read equals the first pass's context)."""
        if not self._iterations:
            return
        n = self.n_requests
        extra = np.zeros(n + 1, dtype=np.int64)
        for k, passes in self._iterations.items():
            extra[k + 1] += len(passes) - 1
        shift = np.cumsum(extra).tolist()

        def moved(f: int) -> int:
            return f if f >= NEVER or f < 0 else f + int(shift[min(f, n)])

        def moved_origin(o: int) -> int:
            extra_passes = len(self._iterations.get(o, ())) - 1
            return moved(o) + max(extra_passes, 0) if o >= 0 else o

        self._rows = [
            (*row[:8], moved(row[8]), moved_origin(row[9]), *row[10:]) for row in self._rows
        ]
        self._hidden = [moved(h) for h in self._hidden]
        self._compacted = [moved(c) for c in self._compacted]
        self.events = [replace(e, request=moved(e.request)) for e in self.events]
        old = self._requests
        new: dict[str, list[Any]] = {name: [] for name in REQUEST_COLUMNS}
        for k in range(n):
            split = self._iterations.get(k, ())
            if not split:
                for name in REQUEST_COLUMNS:
                    new[name].append(old[name][k])
                continue
            for j, p in enumerate(split):
                if j:
                    self._iteration_requests.add(moved(k) + j)
                for name, value in (
                    ("ts", old["ts"][k]),
                    ("ts_end", old["ts_end"][k]),
                    ("model", old["model"][k]),
                    ("has_usage", True),
                    ("input", p.input),
                    ("cache_read", p.cache_read),
                    ("cache_write_5m", p.cache_write_5m),
                    ("cache_write_1h", p.cache_write_1h),
                    ("output", p.output),
                    ("output_recorded", p.output),
                    ("prefix", -1),
                ):
                    new[name].append(value)
        self._requests = new
        self.stats["server_passes_split"] = int(extra.sum())

    def _fix_outputs(
        self, blocks: dict[str, npt.NDArray[Any]], requests: dict[str, npt.NDArray[Any]]
    ) -> None:
        n = len(requests["ts"])
        if n == 0:
            return
        origin = blocks["origin"]
        mask = origin >= 0
        estimate = np.bincount(origin[mask], weights=blocks["tokens_raw"][mask], minlength=n)
        estimate = estimate.astype(np.int64)[:n]
        recorded = requests["output_recorded"]
        implausible = recorded < OUTPUT_PLAUSIBLE_SHARE * estimate
        requests["output"] = np.where(implausible, estimate, recorded)
        self.stats["outputs_from_tokenizer"] = int(implausible.sum())

    def _anchor(
        self, blocks: dict[str, npt.NDArray[Any]], requests: dict[str, npt.NDArray[Any]]
    ) -> tuple[dict[str, npt.NDArray[Any]], int]:
        """Rescale token counts so the as-recorded context reproduces the recorded usage."""
        n_req = len(requests["ts"])
        has_usage = requests["has_usage"]
        if self.prefix_tokens is not None or n_req == 0 or not has_usage.any():
            prefix = int(self.prefix_tokens or 0)
            requests["prefix"] = np.full(n_req, prefix, dtype=np.int64)
            return blocks, prefix
        run = _Anchoring(blocks, requests, self.events, list(self._tools))
        run.run(self._iteration_requests)
        for name, value in run.counts.items():
            self.stats[name] = self.stats.get(name, 0) + value
        requests["prefix"] = run.prefix_column
        if run.injected:
            blocks = self._insert_injected(blocks, run.injected)
        return blocks, run.first_prefix

    def _insert_injected(
        self, blocks: dict[str, npt.NDArray[Any]], injected: list[_Injected]
    ) -> dict[str, npt.NDArray[Any]]:
        """Insert INJECTED blocks at the end of the as-recorded view of their request."""
        first = blocks["first_request"]
        positions = np.searchsorted(first, [j.request for j in injected], side="right")
        new_rows: dict[str, list[Any]] = {name: [] for name in BLOCK_COLUMNS}
        for j in injected:
            prev = j.prev
            row = {
                "msg": blocks["msg"][prev] if prev >= 0 else -1,
                "kind": int(Kind.INJECTED),
                "role": int(Role.USER),
                "tool": -1,
                "link": -1,
                "tokens_raw": 0,
                "tokens": j.tokens,
                "chars": 0,
                "hash": self.hasher.hash("injected", str(j.request), str(j.tokens)),
                "ts": blocks["ts"][prev] if prev >= 0 else 0,
                "first_request": j.request,
                "hidden_from": j.hidden_from,
                "compacted_at": j.compacted_at,
                "origin": -1,
                "flags": j.flags,
                "path_hash": 0,
                "file_tokens": -1,
            }
            for name, value in row.items():
                new_rows[name].append(value)
        # Links and events point at block indices: shift them past the inserted rows.
        link = blocks["link"]
        shifted = np.where(link >= 0, link + np.searchsorted(positions, link, side="right"), -1)
        blocks["link"] = shifted.astype(np.int32)
        if self.fork_block >= 0:
            self.fork_block += int(np.searchsorted(positions, self.fork_block, side="right"))
        self.events = [
            e
            if e.summary_block < 0
            else replace(
                e,
                summary_block=e.summary_block
                + int(np.searchsorted(positions, e.summary_block, side="right")),
            )
            for e in self.events
        ]
        out: dict[str, npt.NDArray[Any]] = {}
        for name, dtype in BLOCK_COLUMNS.items():
            values = np.asarray(new_rows[name], dtype=dtype)
            out[name] = np.insert(blocks[name], positions, values).astype(dtype)
        return out


def _shift_into(
    tokens: npt.NDArray[np.int32],
    leaving: npt.NDArray[np.intp],
    deficit: int,
    first: npt.NDArray[np.int32],
    end: npt.NDArray[np.int32],
    k: int,
    blocks: dict[str, npt.NDArray[Any]],
) -> int:
    """Move up to `deficit` tokens onto `leaving` blocks from their still-visible partners.

    A partner entered the context at the same request as the leaving block and is still
    there at `k`, so every request in between sees the same total: only the split between
    blocks whose sizes were an estimate anyway changes. Partners from the same response
    give first.
    """
    moved = 0
    leaving_set = set(leaving.tolist())
    origin = blocks["origin"]
    for blk in leaving.tolist():
        if moved >= deficit:
            break
        same_entry = np.nonzero((first == first[blk]) & (end > k))[0]
        partners = np.array([p for p in same_entry.tolist() if p not in leaving_set], dtype=np.intp)
        if len(partners) == 0:
            continue
        same = partners[origin[partners] == origin[blk]]
        for group in (same, partners):
            available = int(tokens[group].sum())
            take = min(deficit - moved, available)
            if take <= 0:
                continue
            cut = _distribute(take, tokens[group].astype(np.int64))
            tokens[group] -= cut.astype(tokens.dtype)
            tokens[blk] += take
            moved += take
    return moved


def _middle(ordered: list[float]) -> float:
    """The median of a sorted, non-empty list, bit-identical to `float(np.median(...))`:
    the middle value, or for an even count the two middle values' sum halved (np.median's
    mean of the two)."""
    n = len(ordered)
    half = n // 2
    if n % 2:
        return ordered[half]
    return (ordered[half - 1] + ordered[half]) / 2


def _distribute(total: int, weights: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Split `total` into integers proportional to `weights` (largest remainder, stable)."""
    n = len(weights)
    if n == 1:  # the common case: the whole total (total * w // w, or total * 1 // 1)
        return np.array([total], dtype=np.int64)
    if 1 < n <= _SMALL_SPLIT:
        return np.array(_distribute_small(total, weights.tolist()), dtype=np.int64)
    return _distribute_numpy(total, weights)


def _distribute_numpy(total: int, weights: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """`_distribute` on arrays: the path of long weight lists, and the reference the short
    path (`_distribute_small`) equals (tests/traces/test_import_speed.py)."""
    n = len(weights)
    w = weights.astype(np.int64)
    wsum = int(w.sum())
    if wsum <= 0:
        w = np.ones(n, dtype=np.int64)
        wsum = n
    share = total * w
    base = share // wsum
    rem = share % wsum
    extra = total - int(base.sum())
    if extra:
        base[np.argsort(-rem, kind="stable")[:extra]] += 1
    return base


#: Up to this many weights `_distribute` splits with Python ints: numpy's per-call cost
#: outweighs its per-element speed on the few blocks one request adds.
_SMALL_SPLIT = 32


def _distribute_small(total: int, weights: list[int]) -> list[int]:
    """`_distribute` on a short list: the same integers (floor division and remainder
    have numpy's semantics; Python's sort is stable, as argsort(kind="stable") is)."""
    n = len(weights)
    wsum = sum(weights)
    if wsum <= 0:
        weights = [1] * n
        wsum = n
    share = [total * w for w in weights]
    base = [s // wsum for s in share]
    extra = total - sum(base)
    if extra:
        rem = [s % wsum for s in share]
        for i in sorted(range(n), key=lambda i: -rem[i])[:extra]:
            base[i] += 1
    return base


#: Tools whose results Claude Code's time-based microcompact clears, and how many of the
#: most recent such results it keeps (its `microCompact.ts`, as described in
#: bug-ops/zeph#2699 and lijunzh/koda#660: Bash, Glob, Grep, Read, WebFetch, WebSearch,
#: Edit, Write; KEEP_RECENT 5).
CLEARABLE_TOOLS = frozenset(
    {"Bash", "Glob", "Grep", "Read", "WebFetch", "WebSearch", "Edit", "Write", "MultiEdit"}
)
CLEAR_KEEP_RECENT = 5
FIVE_MINUTES_MS = 5 * 60 * 1000
ONE_HOUR_MS = 60 * 60 * 1000


@dataclass
class _Injected:
    """An INJECTED block to insert: growth no logged block carries."""

    request: int
    tokens: int
    flags: int
    prev: int  # the block it follows in the as-recorded view, -1 for none
    hidden_from: int
    compacted_at: int


class _Anchoring:
    """One pass over a session's requests that sizes entering blocks from the recorded
    usage, with the system + tools prefix per model and the client's unlogged edits.

    Mechanisms, each counted in `counts` (Trace.stats, `traces stats --json`):

    * ``prefix_models``: a model seen for the first time whose recorded context is smaller
      than the conversation plus the old prefix gets its own prefix, inferred as at the
      first request (what the recorded context holds beyond the conversation and the
      entering blocks' estimate). Claude Code sends full tool schemas to some models and
      deferred tools to others (issue 12: 159k against 42k), and caches are per model, so
      the prefix switches with the model and back. A new model whose context the old
      prefix can hold keeps it: the 1.0.x Opus 4 / Sonnet 4 switches of ../shared grow
      there, and the entering blocks carry the growth, as before.
    * ``prefix_reinferred``: after a recorded compaction the prefix is inferred again when
      the compacted context is smaller than the old prefix plus the summary's estimate
      (what preceded the first logged message is not always sent again); never below the
      request's cache read, which the old prefix's unchanged start accounts for.
    * ``edits_idle``: the recorded context shrinks after a gap at least as long as the
      previous request's cache TTL (the cache is cold): the client cleared old tool
      results, as Claude Code's time-based microcompact does (CLEARABLE_TOOLS, keeping the
      5 most recent). Issue 12: 17 of 21 unlogged drops in 2.x followed a gap over 5 min.
    * ``edits_unlogged``: any other shrink (in 1.0.8x they come within seconds, after an
      interrupt or a `<synthetic>` line, issue 12; which content those clients dropped is
      not logged): the oldest content the client could have dropped (tool results first,
      then thinking, then other agent output; never the human's words or a summary)
      leaves the recorded view.

    An edit removes whole blocks (they get `compacted_at` and Flag.UNLOGGED) oldest first,
    starting after the request's recorded cache read when that reaches past the prefix
    (the cached part was unchanged, so the edit is after it; anywhere if there is too
    little after it, the block sizes being estimates), until at least the missing
    tokens are gone (a tool_use and its tool_result leave together: the API refuses one
    without the other); what it removed beyond them goes to the entering blocks. So the
    as-recorded view equals the recorded context at every request; ``edited_tokens``
    counts the tokens removed and ``unexplained_shrinks`` the requests where no block
    could be removed (then the entering blocks get 0 and the view stays larger).
    """

    def __init__(
        self,
        blocks: dict[str, npt.NDArray[Any]],
        requests: dict[str, npt.NDArray[Any]],
        events: list[CompactionEvent],
        tools: list[str],
    ) -> None:
        self.b = blocks
        self.r = requests
        self.n_req = len(requests["ts"])
        self.first = blocks["first_request"]
        self.end = np.minimum(blocks["hidden_from"], blocks["compacted_at"]).astype(np.int64)
        self.raw = blocks["tokens_raw"].astype(np.int64)
        self.tokens = blocks["tokens"]
        self.context = (
            requests["input"]
            + requests["cache_read"]
            + requests["cache_write_5m"]
            + requests["cache_write_1h"]
        ).astype(np.int64)
        self.compactions = {e.request for e in events}
        clearable = np.array([t in CLEARABLE_TOOLS for t in tools] + [False], dtype=bool)
        kind = blocks["kind"]
        flags = blocks["flags"]
        self.clearable = (kind == Kind.TOOL_RESULT) & clearable[blocks["tool"]]
        keep = (flags & (Flag.HUMAN | Flag.ARTIFACT)) == 0
        keep &= (kind != Kind.SUMMARY) & (kind != Kind.INJECTED)
        self.droppable = keep
        #: Preference among droppable blocks of an unexplained edit: lower first.
        self.tier = np.where(
            kind == Kind.TOOL_RESULT, 0, np.where(kind == Kind.THINKING, 1, 2)
        ).astype(np.int64)
        self.injected: list[_Injected] = []
        self.injected_leaving: dict[int, int] = {}
        self.prefix_column = np.full(self.n_req, -1, dtype=np.int64)
        self.first_prefix = 0
        self.counts = {
            "tokens_shifted": 0,
            "unexplained_shrinks": 0,
            "injected_blocks": 0,
            "prefix_models": 0,
            "prefix_reinferred": 0,
            "edits_idle": 0,
            "edits_unlogged": 0,
            "edited_blocks": 0,
            "edited_tokens": 0,
        }

    def _visible_before(self, k: int) -> npt.NDArray[np.intp]:
        """Blocks of the as-recorded view of k that entered before k, in view order."""
        hi = int(np.searchsorted(self.first, k, side="left"))
        return np.flatnonzero(self.end[:hi] > k)

    def inject(self, k: int, n: int, flags: int, leaves: int | None = None) -> None:
        """Growth with no logged block to carry it: an INJECTED block at the view's end."""
        hi = int(np.searchsorted(self.first, k, side="right"))
        before = np.flatnonzero(self.end[:hi] > k)
        prev = int(before[-1]) if len(before) else -1
        if leaves is not None:
            hidden, compacted = NEVER, leaves
        elif prev >= 0:
            hidden = int(self.b["hidden_from"][prev])
            compacted = int(min(self.b["compacted_at"][prev], self.end[prev]))
        else:
            hidden, compacted = NEVER, NEVER
        self.injected.append(_Injected(k, n, flags, prev, hidden, compacted))
        gone = min(hidden, compacted)
        if gone < NEVER:
            self.injected_leaving[gone] = self.injected_leaving.get(gone, 0) + n

    def edit(self, k: int, missing: int, needed: int, prefix: int, idle: bool) -> int:
        """Remove at least `missing` tokens of droppable content from the view of k, or, if
        there is not that much, all there is when that is at least `needed` (the entering
        blocks then get less than their estimate, but not less than nothing). The edit
        starts after the request's cache read if the content there allows; if not, the
        read contradicts the view's layout (block sizes are estimates), and it starts
        anywhere."""
        read = int(self.r["cache_read"][k])
        if read > prefix:
            removed = self._edit(k, missing, needed, prefix, idle, read)
            if removed:
                return removed
        return self._edit(k, missing, needed, prefix, idle, 0)

    def _edit(self, k: int, missing: int, needed: int, prefix: int, idle: bool, after: int) -> int:
        visible = self._visible_before(k)
        if not len(visible):
            return 0
        sizes = self.tokens[visible].astype(np.int64)
        starts = prefix + np.cumsum(sizes) - sizes
        allowed = self.droppable[visible] & (sizes > 0) & (starts >= after)
        order: list[int] = []
        cause = "edits_unlogged"
        if idle:
            results = visible[self.clearable[visible]]
            old = set(results[: max(0, len(results) - CLEAR_KEEP_RECENT)].tolist())
            order = [
                int(b)
                for b, ok in zip(visible.tolist(), allowed.tolist(), strict=True)
                if ok and b in old
            ]
            if order:
                cause = "edits_idle"
        # A tool_use and its tool_result leave together: the API refuses either alone.
        ok = dict(zip(visible.tolist(), allowed.tolist(), strict=True))
        link = self.b["link"]
        chosen: list[int] = []
        taken: set[int] = set()
        removed = 0

        def take(b: int) -> None:
            nonlocal removed
            partner = int(link[b])
            pair = [b] if partner < 0 or partner not in ok else [b, partner]
            if any(p in taken or not ok[p] for p in pair):
                return
            for p in pair:
                taken.add(p)
                chosen.append(p)
                removed += int(self.tokens[p])

        for b in order:
            if removed >= missing:
                break
            take(b)
        if removed < missing:
            rest = visible[allowed]
            for b in rest[np.argsort(self.tier[rest], kind="stable")].tolist():
                if removed >= missing:
                    break
                take(b)
        if removed < needed or not chosen:
            return 0
        idx = np.asarray(chosen, dtype=np.intp)
        self.end[idx] = k
        self.b["compacted_at"][idx] = np.minimum(self.b["compacted_at"][idx], k)
        self.b["flags"][idx] |= np.uint8(Flag.UNLOGGED)
        self.counts[cause] += 1
        self.counts["edited_blocks"] += len(chosen)
        self.counts["edited_tokens"] += removed
        return removed

    def run(self, iterations: set[int]) -> None:
        first, end, raw, tokens = self.first, self.end, self.raw, self.tokens
        has_usage = self.r["has_usage"]
        models = self.r["model"].tolist()
        ts, ts_end = self.r["ts"].tolist(), self.r["ts_end"].tolist()
        w5, w1 = self.r["cache_write_5m"].tolist(), self.r["cache_write_1h"].tolist()
        live = first < end
        enter_order = np.argsort(np.where(live, first, NEVER), kind="stable")
        leave_order = np.argsort(np.where(live, end, NEVER), kind="stable")
        enter_keys = np.where(live, first, NEVER)[enter_order]
        leave_keys = np.where(live, end, NEVER)[leave_order]
        summary_mask = (self.b["kind"] == Kind.SUMMARY) & ((self.b["flags"] & Flag.ARTIFACT) != 0)
        # Where each request's entering and leaving blocks start in the sorted orders (one
        # searchsorted for the session, not two per request).
        steps = np.arange(self.n_req + 1)
        enter_at = np.searchsorted(enter_keys, steps).tolist()
        leave_at = np.searchsorted(leave_keys, steps).tolist()
        nothing = leave_order[:0]
        usage_at = has_usage.tolist()
        context = self.context.tolist()
        # Recorded growth per raw token at ordinary requests, kept sorted: the ratio is
        # their median, read off the middle (`_middle`, np.median's value) after one sorted
        # insert per ordinary request, where np.median sorted the whole list per request.
        ratios: list[float] = []
        held = 0  # anchored tokens of the blocks in the current as-recorded view
        prefix: int | None = None
        by_model: dict[int, int] = {}
        last_usage = -1
        ttl = FIVE_MINUTES_MS
        for k in range(self.n_req):
            held -= self.injected_leaving.pop(k, 0)
            lo, hi = leave_at[k], leave_at[k + 1]
            if lo < hi:
                leaving = leave_order[lo:hi]
                leaving = leaving[end[leaving] == k]  # not already removed by an edit
            else:
                leaving = nothing
            entering = enter_order[enter_at[k] : enter_at[k + 1]]
            weights = raw[entering]
            wsum = int(weights.sum())
            usage = usage_at[k]
            if len(leaving):
                if usage and prefix is not None:
                    # Blocks leaving here (thinking the API stopped counting, a rewound
                    # branch) may have carried more than their share when they entered:
                    # move the shortfall onto them from blocks that entered with them.
                    target = context[k] - (held - int(tokens[leaving].sum())) - prefix
                    deficit = wsum - target
                    if deficit > 0:
                        self.counts["tokens_shifted"] += _shift_into(
                            tokens, leaving, deficit, first, end, k, self.b
                        )
                held -= int(tokens[leaving].sum())
            if not usage:
                held += int(tokens[entering].sum())
                self.prefix_column[k] = prefix if prefix is not None else -1
                continue
            ratio = _middle(ratios) if ratios else 1.0
            target = context[k] - held
            estimate = round(float(wsum) * ratio)
            m = models[k]
            if prefix is None:
                prefix = max(0, target - wsum)
                self.first_prefix = prefix
                by_model[m] = prefix
            elif m not in by_model:
                if target < prefix:  # the old prefix cannot be what this model is sent
                    prefix = max(0, target - estimate)
                    self.counts["prefix_models"] += 1
                by_model[m] = prefix
            else:
                prefix = by_model[m]
            if k in self.compactions and target - prefix < estimate:
                floor = min(int(self.r["cache_read"][k]), prefix)
                new = max(floor, target - estimate)
                if new < prefix:
                    prefix = by_model[m] = new
                    self.counts["prefix_reinferred"] += 1
            target -= prefix
            if target < 0 and k not in iterations:
                prev = last_usage
                idle = prev >= 0 and ts[k] - ts_end[prev] >= ttl
                missing = estimate - target
                removed = self.edit(k, missing, -target, prefix, idle)
                if removed:
                    held -= removed
                    target += removed
            last_usage = k
            if w5[k] or w1[k]:  # the TTL the cache was last written with
                ttl = ONE_HOUR_MS if w1[k] and not w5[k] else FIVE_MINUTES_MS
            self.prefix_column[k] = prefix
            if target < 0:
                self.counts["unexplained_shrinks"] += 1
                tokens[entering] = 0
                continue
            if len(entering) == 0:
                if target > 0:
                    leaves = k + 1 if k in iterations else None
                    flags = int(Flag.ARTIFACT) if k in iterations else int(Flag.NONE)
                    self.inject(k, target, flags, leaves)
                    held += target
                continue
            summaries = summary_mask[entering]
            if summaries.any():
                # The recording's compaction: the summary is sized from its text (at the
                # session's own Claude-per-cl100k ratio); the rest of the growth is what
                # the client restored (files, reminders), unlogged: an INJECTED artifact.
                sized = np.minimum(np.round(weights * ratio).astype(np.int64), target)
                if int(sized.sum()) <= target:
                    tokens[entering] = sized
                    rest = target - int(sized.sum())
                    if rest > 0:
                        self.inject(k, rest, int(Flag.ARTIFACT))
                    held += target
                    continue
            elif wsum > 0:
                bisect.insort(ratios, target / float(wsum))
            tokens[entering] = _distribute(target, weights)
            held += target
        # Requests before the first with usage take the first prefix.
        col = self.prefix_column
        col[col < 0] = self.first_prefix
        self.counts["injected_blocks"] = len(self.injected)


def hasher_for(unit: ImportUnit, contents: list[bytes]) -> Hasher:
    """The keyed hasher of an import unit: keyed by a digest of all of the unit's bytes."""
    return Hasher(unit.fingerprint(contents)[1])


def add_counts(into: dict[str, int], more: dict[str, int]) -> None:
    """Add a reader's counters into a unit's."""
    for key, v in more.items():
        into[key] = into.get(key, 0) + v


def unit_trace(
    fmt: str,
    unit: ImportUnit,
    contents: list[bytes],
    sessions: list[Session],
    problems: Problems,
    stats: dict[str, int],
) -> Trace:
    """The Trace of an import unit: its sessions, what was skipped (located by file index
    in the unit, never by label) and the readers' counters, in a stable order."""
    return Trace(
        format=fmt,
        source_digest=unit.digest(contents),
        sessions=sessions,
        skipped=dict(sorted(problems.counts.items())),
        skipped_at=skipped_locations(problems.where, [f.label for f in unit.files]),
        stats=dict(sorted(stats.items())),
    )


def skipped_locations(where: list[str], labels: list[str]) -> list[str]:
    """Problem locations as "file#i:line" (file index in the unit), never as labels.

    Labels can hold directory names from someone's machine; the compiled trace must not.
    """
    index = {label: i for i, label in enumerate(labels)}
    out = []
    for w in where:
        label, _, line = w.rpartition(":")
        if not label:
            label, line = w, "0"
        out.append(f"file#{index.get(label, -1)}:{line}")
    return out
