"""Turns what a reader saw into a content-free Session: hashing, token counts, anchoring.

Readers hand over text; the builder keeps only its length, its cl100k token count and a
keyed hash, so no reader can leak content into the compiled trace by accident.

Anchoring (DESIGN.md section 2): where a session has recorded usage, the recorded context
size of request k (input + cache read + cache writes) is known. Blocks entering the
context at k receive, between them, exactly the recorded growth over what the previous
request held (after removing what left the context: rewinds and the recording's own
compactions), split in proportion to their raw tiktoken estimates with largest-remainder
rounding. Growth with no block to carry it (re-injected attachments, reminders the
transcript does not log) becomes an INJECTED block. A shrink that no logged event explains
cannot be carried by non-negative counts: it is counted in `Session`-level stats instead.
"""

from __future__ import annotations

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
    Kind,
    Role,
    Session,
    Trace,
)
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

    @property
    def context(self) -> int:
        return self.input + self.cache_read + self.cache_write_5m + self.cache_write_1h


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
        flags: Flag = Flag.NONE,
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
        rows = self._rows
        if rows and first_request < rows[-1][8]:
            raise ValueError("blocks must be added in non-decreasing first_request order")
        idx = len(rows)
        hasher = self.hasher
        if path:
            path_hash = hasher.hash("path", path)
        else:
            path_hash = 0
            flags &= ~(Flag.PATH_READ | Flag.PATH_WRITE)
        rows.append(
            (
                msg,
                int(kind),
                int(role),
                self._tool_index(tool),
                -1 if tokens is None else tokens,
                len(text),
                hasher.hash(str(int(kind)), tool or "", text),
                ts,
                first_request,
                origin,
                int(flags),
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
            blocks["file_tokens"][i] = round(int(raw[i]) * scale)
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
        )

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
            return blocks, int(self.prefix_tokens or 0)
        first = blocks["first_request"]
        end = np.minimum(blocks["hidden_from"], blocks["compacted_at"])
        raw = blocks["tokens_raw"].astype(np.int64)
        tokens = blocks["tokens"]
        live = first < end
        enter_order = np.argsort(np.where(live, first, NEVER), kind="stable")
        leave_order = np.argsort(np.where(live, end, NEVER), kind="stable")
        enter_keys = np.where(live, first, NEVER)[enter_order]
        leave_keys = np.where(live, end, NEVER)[leave_order]
        context = (
            requests["input"]
            + requests["cache_read"]
            + requests["cache_write_5m"]
            + requests["cache_write_1h"]
        )
        injected: list[tuple[int, int, int]] = []  # (request, tokens, flags)
        summary_mask = (blocks["kind"] == Kind.SUMMARY) & ((blocks["flags"] & Flag.ARTIFACT) != 0)
        ratios: list[float] = []  # recorded growth per raw token, at ordinary requests
        held = 0  # anchored tokens of the blocks in the current as-recorded view
        prefix: int | None = None
        shrinks = 0
        shifted = 0
        # Injected blocks are inserted after this loop; they leave the view with the block
        # they follow (see _insert_injected): their tokens leave `held` then.
        injected_leaving: dict[int, int] = {}

        def inject(k: int, n: int, flags: int) -> None:
            injected.append((k, n, flags))
            before = np.nonzero(
                (first[: np.searchsorted(first, k, side="right")] <= k)
                & (end[: np.searchsorted(first, k, side="right")] > k)
            )[0]
            leaves = int(end[before[-1]]) if len(before) else NEVER
            if leaves < NEVER:
                injected_leaving[leaves] = injected_leaving.get(leaves, 0) + n

        for k in range(n_req):
            held -= injected_leaving.pop(k, 0)
            lo, hi = np.searchsorted(leave_keys, [k, k + 1])
            leaving = leave_order[lo:hi]
            lo, hi = np.searchsorted(enter_keys, [k, k + 1])
            entering = enter_order[lo:hi]
            weights = raw[entering]
            if has_usage[k] and prefix is not None and len(leaving):
                # Blocks leaving here (thinking the API stopped counting, a rewound
                # branch) may have carried more than their share when they entered:
                # move the shortfall onto them from blocks that entered with them.
                target = int(context[k]) - (held - int(tokens[leaving].sum())) - prefix
                deficit = int(weights.sum()) - target
                if deficit > 0:
                    shifted += _shift_into(tokens, leaving, deficit, first, end, k, blocks)
            held -= int(tokens[leaving].sum())
            if not has_usage[k]:
                held += int(tokens[entering].sum())
                continue
            target = int(context[k]) - held
            if prefix is None:
                prefix = max(0, target - int(weights.sum()))
            target -= prefix
            if target < 0:
                shrinks += 1
                tokens[entering] = 0
                continue
            if len(entering) == 0:
                if target > 0:
                    inject(k, target, int(Flag.NONE))
                    held += target
                continue
            summaries = summary_mask[entering]
            if summaries.any():
                # The recording's compaction: the summary is sized from its text (at the
                # session's own Claude-per-cl100k ratio); the rest of the growth is what
                # the client restored (files, reminders), unlogged: an INJECTED artifact.
                ratio = float(np.median(ratios)) if ratios else 1.0
                sized = np.minimum(np.round(weights * ratio).astype(np.int64), target)
                if int(sized.sum()) <= target:
                    tokens[entering] = sized
                    rest = target - int(sized.sum())
                    if rest > 0:
                        inject(k, rest, int(Flag.ARTIFACT))
                    held += target
                    continue
            elif weights.sum() > 0:
                ratios.append(target / float(weights.sum()))
            tokens[entering] = _distribute(target, weights)
            held += target
        self.stats["tokens_shifted"] = shifted
        self.stats["unexplained_shrinks"] = shrinks
        self.stats["injected_blocks"] = len(injected)
        if injected:
            blocks = self._insert_injected(blocks, injected)
        return blocks, int(prefix or 0)

    def _insert_injected(
        self, blocks: dict[str, npt.NDArray[Any]], injected: list[tuple[int, int, int]]
    ) -> dict[str, npt.NDArray[Any]]:
        """Insert INJECTED blocks at the end of the as-recorded view of their request."""
        first = blocks["first_request"]
        end = np.minimum(blocks["hidden_from"], blocks["compacted_at"])
        positions = np.searchsorted(first, [k for k, _, _ in injected], side="right")
        new_rows: dict[str, list[Any]] = {name: [] for name in BLOCK_COLUMNS}
        for (k, n, flags), pos in zip(injected, positions, strict=True):
            visible_before = np.nonzero((first[:pos] <= k) & (end[:pos] > k))[0]
            prev = int(visible_before[-1]) if len(visible_before) else -1
            row = {
                "msg": blocks["msg"][prev] if prev >= 0 else -1,
                "kind": int(Kind.INJECTED),
                "role": int(Role.USER),
                "tool": -1,
                "link": -1,
                "tokens_raw": 0,
                "tokens": n,
                "chars": 0,
                "hash": self.hasher.hash("injected", str(k), str(n)),
                "ts": blocks["ts"][prev] if prev >= 0 else 0,
                "first_request": k,
                "hidden_from": blocks["hidden_from"][prev] if prev >= 0 else NEVER,
                "compacted_at": blocks["compacted_at"][prev] if prev >= 0 else NEVER,
                "origin": -1,
                "flags": flags,
                "path_hash": 0,
                "file_tokens": -1,
            }
            for name, value in row.items():
                new_rows[name].append(value)
        # Links and events point at block indices: shift them past the inserted rows.
        link = blocks["link"]
        shifted = np.where(link >= 0, link + np.searchsorted(positions, link, side="right"), -1)
        blocks["link"] = shifted.astype(np.int32)
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


def _distribute(total: int, weights: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Split `total` into integers proportional to `weights` (largest remainder, stable)."""
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
