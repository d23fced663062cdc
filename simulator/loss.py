"""Loss proxies: what a policy's view no longer holds (reports/METRICS.md, "Loss proxies").

Cost is in the request rows; what a policy *loses* needs per-call facts about the view
(which history blocks it still sends verbatim). The replay engine computes them as it
prices each call (simulator/replay.py, `replay(..., loss=True)`): one `SessionLoss` per
replayed session sees exactly the view priced, in the order the engine writes its rows,
and the engine puts its facts on the same row. One replay, one row, no second bookkeeping:
session and run figures are polars aggregations of the columns (simulator/frames.py).

Incremental: views are append-mostly (a request adds its new blocks; a compaction rewrites
from a point). The view keeps a running "last changed" index (simulator/view.py
`View.changed`): while the engine prices the same view object, the items below it are the
ones seen at the last call, and `View.seen` holds what the items from there were, so only
those are compared and the tracker keeps no copy of the view; for another view object (a
re-chained prefix, a re-fetch round's copy) the prefix hash and cumulative token count at
the end of the last view say whether it goes on from it (a cache_edits deletion keeps the
hash but lowers the counts, so both are compared). The tracker keeps running totals over
the items of the last view and updates them by the items that left (subtracted) and the
items that came (added), so a call costs the items that changed since the previous call,
not the whole view; nothing is converted to arrays per call. Before the index, masking
(which rewrites an old observation each request, near the view's end) made every call
search the whole view for the change: its columns cost 6.2x its replay on the
10,000-request synthetic session, 1.2x with it.

What a call costs, measured (tests/bench/test_bench_loss.py: the shared Claude Code corpus,
180 sessions of 20 requests and 68 blocks (medians), and a 10,000-request synthetic
session; replayed plain and with the columns; and instructions counted by callgrind, which
the machine's load does not move): the columns added a fifth to the replay's instructions
(as-recorded on the corpus: `facts` 14%, the set-up 4%, the extra columns 1%), and a third
of `facts` was copying each call's new items into a copy of the view (now `View.seen`,
filled only where a view changes below what was seen); a request appends
2 to 4 items, of which only the relevant blocks matter (`SessionLoss.relevant`: 1 call in 5
appends one); masking rewrites one item in place per request, which now takes a path of
its own instead of a search (`_rewrite_one`), and so does each item of a request that
rewrites several in place (`_rewrite_in_place`: masking two observations at once,
858 of its 9,174 updates on the synthetic session, 18 us each in the search, 5 us now; the
masking columns' instructions 8.95% -> 7.67% of its replay there, callgrind, two replays
less one). Instructions the columns add to the replay, the round before, before -> after:
as-recorded 19.1% -> 12.2% (corpus), 19.0% -> 12.7% (synthetic); masking 16.5% -> 11.3%
(corpus), 15.3% -> 9.8% (synthetic). The per-session set-up
(`SessionLoss.__init__`, about 320,000 instructions a session on the corpus, 3.5% of the
as-recorded replay) is a dozen numpy calls and the pairing of file reads and uses, paid
once per session and process: the session keeps it for its next replay (`_KEPT`); the
extra columns about 1.2%. Wall-clock ratios, the median of 15 paired rounds (four runs on
a shared 2-core machine at load 1.0-2.6): corpus 1.06-1.24x, synthetic 1.01-1.22x
(tests/bench/test_bench_loss.py, which says why paired).
tests/simulator/test_replay_properties.py checks the columns against a from-scratch
recount, tests/simulator/test_loss.py every path of the tracker against a recount after
random edits of the view.

The columns (LOSS_SCHEMA), for the view of one call made for request k:

* `human_tokens`: tokens of the human's own blocks (Flag.HUMAN) in the logical history;
* `human_verbatim_tokens`: those of them the view still sends unchanged (same block, same
  content hash, same token count);
* `summary_tokens`: what a compaction wrote into the view in place of the history: the
  recording's compaction artifacts (its summary and the attachments it restored, flag
  ARTIFACT) plus every item that is neither a history block nor the system + tools prefix
  (a policy's summary and what it restored with it). Both sides count the restored files,
  so the share compares across policies; the engine can split the two (see METRICS.md);
* `stale_file_refs` (request rows): tool calls of request k's response that name a file
  whose last successful read result is in the logical history but not verbatim in the view
  (with the re-fetch loop, simulator/refetch.py: the loop's reads, and not a use whose file
  it fetched back);
* `after_compaction` (request rows): the view was rewritten by a compaction at k: the
  policy made a compaction call for request k and the request no longer sends the
  conversation that call summarized (its view less its last item, the summary prompt; for
  a call that sends no view, one the recording never billed, the last view seen), or
  a recorded compaction artifact enters the view at k (the recording's own compaction,
  as-recorded);
* `resent_tokens`: on rows after a compaction, the prompt tokens not read from the cache.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt
import polars as pl

from simulator.model import Columns, Flag, Kind, Session, Trace
from simulator.policy import Call, Policy
from simulator.pricing import PriceBook
from simulator.refetch import SessionLoop
from simulator.view import Seen, View, prefix_hashes

if TYPE_CHECKING:  # the engine imports this module
    from simulator.replay import ReplayOptions

#: Loss proxies of a request row, the last columns of requests.parquet (definitions:
#: reports/METRICS.md; simulator/frames.py re-exports it for the summaries).
LOSS_SCHEMA: dict[str, Any] = {
    "human_tokens": pl.Int64,
    "human_verbatim_tokens": pl.Int64,
    "summary_tokens": pl.Int64,
    "stale_file_refs": pl.Int64,
    "after_compaction": pl.Boolean,
    "resent_tokens": pl.Int64,
}
#: The columns `SessionLoss.facts` gives per call, in order (the engine derives
#: `resent_tokens` from them and the usage, for whole columns).
LOSS_FACTS: dict[str, Any] = {c: t for c, t in LOSS_SCHEMA.items() if c != "resent_tokens"}


#: What a block's flags and kind make of it, as bits: the human wrote it (and it is no
#: artifact); it is an artifact; it is a successful read result of a file (no artifact,
#: a read, no error); it is a tool call naming a file (no artifact). One table look-up
#: per column (`_BY_FLAGS[flags] & _BY_KIND[kind]`), not a dozen numpy masks per session.
_IS_HUMAN, _IS_ARTIFACT, _READ_OK, _USE_OK = 1, 2, 4, 8


def _flag_table() -> npt.NDArray[np.uint8]:
    """`_BY_FLAGS`: per value of the flags byte, its bits (reads and uses only where the
    block is no artifact: `_BY_KIND` keeps the one its kind allows)."""
    human, artifact, read, error = (
        int(Flag.HUMAN),
        int(Flag.ARTIFACT),
        int(Flag.PATH_READ),
        int(Flag.ERROR),
    )
    table = np.zeros(256, np.uint8)
    for value in range(256):
        if value & artifact:
            table[value] = _IS_ARTIFACT
            continue
        bits = _USE_OK | (_IS_HUMAN if value & human else 0)
        if value & (read | error) == read:
            bits |= _READ_OK
        table[value] = bits
    return table


_BY_FLAGS = _flag_table()
_BY_KIND = np.zeros(256, np.uint8)
_BY_KIND[int(Kind.TOOL_RESULT)] = _READ_OK
_BY_KIND[int(Kind.TOOL_USE)] = _USE_OK


class _Shared:
    """A list of at least n items, shared by every session and never changed (it grows
    by replacement, never in place): 0, 1, 2, ... (a slice of it is what a run of
    consecutive blocks is compared with), or False for every block (no artifact)."""

    def __init__(self, item: Callable[[int], Any]) -> None:
        self.item = item
        self.items: list[Any] = []

    def upto(self, n: int) -> list[Any]:
        items = self.items
        if n > len(items):
            items = self.items = [self.item(i) for i in range(max(n, 2 * len(items), 1024))]
        return items


_BLOCK_IDS = _Shared(int)
_NO_ARTIFACTS = _Shared(lambda _: False)
#: After every block id: the end of `SessionLoss.relevant`.
_PAST = 1 << 62
#: Where a session keeps what `SessionLoss` derived from its blocks without the re-fetch
#: loop, for the next replay of it (another policy of a run, a sweep's next cell, a
#: benchmark's next round): the set-up is about 45 us a session, 4% of the as-recorded
#: replay of the shared Claude Code corpus (180 sessions of 20 requests), paid once per
#: session and process. Keyed by the blocks' identity and the sizes: sessions are not
#: changed once read (the readers and traces/builder.py build them whole).
_KEPT = "_loss_kept"


class _Kept(NamedTuple):
    """What a session keeps under `_KEPT`: the blocks and sizes it was derived from, then
    `SessionLoss`'s attributes of the same names."""

    blocks: Columns
    sizes: tuple[int, int]  # blocks, requests
    human_of: list[int]
    artifact_of: list[bool]
    human_at: list[int]
    named: npt.NDArray[np.uint8]
    relevant: list[int]
    lasts_at: list[list[int] | None]


#: Below this many file reads and uses in a session, `SessionLoss` pairs them in one Python
#: pass; from it on, in numpy (the shared Claude Code corpus: 34 per session on average,
#: where a dozen numpy calls cost more than the pass; the 10,000-request synthetic session
#: of tests/bench/test_bench_loss.py has about 4,800). Timed each way per session on the
#: corpus, the pass is the cheaper below about 200 (6 us against 37 us at 1 to 10, 58 us
#: against 64 us at 160 to 256, 104 us against 82 us above). The human's blocks are summed
#: per request the same way, on the same bound.
SMALL_EVENTS = 256


class SessionLoss:
    """The loss facts of one session's calls, from running totals over the last view seen.

    Built once per replayed session (its history's block hashes and tokens are the ones
    the policy sends, so they are shared, not recomputed); `facts` is called by the engine
    for every call, in row order.

    Per session, what the facts need of each block is built once, as lists (no per-call
    arrays): its human tokens, whether it is an artifact (one list of False shared by the
    sessions without any), the blocks that matter (`relevant`), and, per request, the
    latest read of each file its response names (without the re-fetch loop it depends on
    the session only, so the call checks only whether the view still sends it). What the
    flags make of a block is one table look-up (`_BY_FLAGS`), not a mask per flag. The
    set-up is about a third of what the columns add on the shared Claude Code corpus (180
    sessions of 20 requests: see the module docstring)."""

    def __init__(
        self,
        session: Session,
        hashes: list[int],
        tokens: list[int],
        loop: SessionLoop | None = None,
    ) -> None:
        b = session.blocks
        n = session.n_requests
        self.prefix_tokens = int(session.prefix_tokens)
        self.loop = loop
        self.hash_of = hashes
        self.tokens_of = tokens
        self.block_ids = _BLOCK_IDS.upto(len(hashes))
        self._blocks = b
        self._visible: tuple[list[int], list[int]] | None = None
        self._reads: dict[int, list[int]] | None = None
        self.looped = loop is not None
        #: With the loop: per request, its uses (block, file); the loop says what is read.
        self.uses: dict[int, list[tuple[int, int]]] = {}
        self._init_state()
        # Derived from the blocks (`_facts_of_blocks`), or kept from a replay before.
        self.human_of: list[int]
        self.artifact_of: list[bool]
        self.human_at: list[int]
        self._named: npt.NDArray[np.uint8]
        self.relevant: list[int]
        self.lasts_at: list[list[int] | None]
        sizes = (len(b), n)
        kept: _Kept | None = session.__dict__.get(_KEPT) if loop is None else None
        if kept is not None and kept.blocks is b and kept.sizes == sizes:
            self.human_of = kept.human_of
            self.artifact_of = kept.artifact_of
            self.human_at = kept.human_at
            self._named = kept.named
            self.relevant = kept.relevant
            self.lasts_at = kept.lasts_at
            return
        self._facts_of_blocks(session, len(hashes))
        if loop is None:
            session.__dict__[_KEPT] = _Kept(
                b,
                sizes,
                self.human_of,
                self.artifact_of,
                self.human_at,
                self._named,
                self.relevant,
                self.lasts_at,
            )
        else:
            picked = np.flatnonzero(self._uses())
            origin = b["origin"][picked].tolist()
            path = b["path_hash"][picked].tolist()
            for block, k, p in zip(picked.tolist(), origin, path, strict=True):
                self.uses.setdefault(k, []).append((block, p))

    def _facts_of_blocks(self, session: Session, m: int) -> None:
        """What the facts need of each of the session's `m` blocks and requests (see the
        class docstring); without the loop, kept with the session (`_KEPT`)."""
        b = session.blocks
        n = session.n_requests
        size = b["tokens"]
        kinds = _BY_FLAGS[b["flags"]]  # one look-up for what the flags make of each block
        human = kinds & _IS_HUMAN
        #: Per block: its tokens where the human wrote it (else 0: what it adds to the
        #: verbatim human tokens when sent verbatim), and whether it is an artifact (most
        #: sessions have none: then one list of False shared by all).
        self.human_of = (size * human).tolist()
        if int(np.bitwise_or.reduce(kinds, initial=0)) & _IS_ARTIFACT:
            self.artifact_of = ((kinds & _IS_ARTIFACT) != 0).tolist()
        else:
            self.artifact_of = _NO_ARTIFACTS.upto(m)
        self.human_at = self._human_at(np.flatnonzero(human), n)
        #: Per block: _READ_OK where it is a successful read result of a file, _USE_OK
        #: where it is a tool call naming a file (whatever its origin).
        self._named = kinds & _BY_KIND[b["kind"]]
        self._named *= b["path_hash"] != 0
        #: The blocks whose being sent verbatim the facts depend on, ascending, then a
        #: sentinel: the human's, the artifacts, the read results a use may be paired with
        #: (with the loop, which reads anything back, every block). `verbatim` holds every
        #: one of them the view sends verbatim; other blocks it may or may not hold.
        if not self.looped:
            picked = np.flatnonzero((kinds & (_IS_HUMAN | _IS_ARTIFACT)) | (self._named & _READ_OK))
            self.relevant = picked.tolist()
        else:
            self.relevant = list(range(m))
        self.relevant.append(_PAST)
        #: Without the loop: per request, the latest read older than each of its uses, in
        #: the logical history of that request (None where there is none).
        self.lasts_at = [None] * n
        if not self.looped:
            self._last_reads(n)

    def _init_state(self) -> None:
        """The running state of the last view seen (nothing seen yet)."""
        # The last view seen and how many items it held, and the running totals over
        # them: human tokens sent verbatim, tokens of items that are no history block (the
        # prefix, a policy's own), artifact tokens, and what they make the summary.
        #: The view object seen last: while it is the one priced, its "last changed" index
        #: (simulator/view.py) says from where it differs from the items seen, and
        #: `View.seen` what they were from there; another one goes on from it where their
        #: prefix hashes and token counts agree there.
        self.last_view: View | None = None
        self.n = 0
        #: During `_update`: the items seen from position `_base` on.
        self._seen = Seen([], [], [])
        self._base = 0
        self.human = 0
        self.inserted = 0
        self.recorded = 0
        self.summary = 0
        #: History blocks the view sends verbatim, and the artifacts it holds. Sets: a
        #: view holds a block at most once (a policy projects the history, never repeats
        #: it), so what an item adds to the totals depends on the item, not its position.
        self.verbatim: set[int] = set()
        self.artifacts: set[int] = set()
        #: The artifacts in the view at the last request row, and whether the view's
        #: artifacts changed since.
        self.seen_artifacts: set[int] = set()
        self.artifacts_changed = False
        #: Where the conversation each compaction call of the current request summarized
        #: ends, and the hash chain of the view through there.
        self.summarized: list[tuple[int, int]] = []

    def _human_at(self, humans: npt.NDArray[np.intp], n: int) -> list[int]:
        """Human tokens in the logical history before each request, from the human's
        blocks `humans`: +tokens where one enters, -tokens where it leaves (a rewind),
        summed up; for a few blocks in one Python pass, for more with numpy (exact in
        float64: far below 2**53)."""
        if not humans.size:
            return [0] * n
        b = self._blocks
        first = b["first_request"][humans]
        hidden = b["hidden_from"][humans]
        size = b["tokens"][humans]
        if humans.size < SMALL_EVENTS:
            delta = [0] * (n + 1)
            for enters, leaves, t in zip(
                first.tolist(), hidden.tolist(), size.tolist(), strict=True
            ):
                if enters < leaves:
                    delta[enters if enters < n else n] += t
                    delta[leaves if leaves < n else n] -= t
            del delta[n]
            return list(accumulate(delta))
        live = first < hidden
        weights = size[live]
        delta_np = np.bincount(np.minimum(first[live], n), weights, n + 1) - np.bincount(
            np.minimum(hidden[live], n), weights, n + 1
        )
        at: list[int] = np.cumsum(delta_np[:n]).astype(np.int64).tolist()
        return at

    def _uses(self) -> npt.NDArray[np.bool_]:
        """Tool calls naming a file, made by a request's response."""
        uses: npt.NDArray[np.bool_] = ((self._named & _USE_OK) != 0) & (self._blocks["origin"] >= 0)
        return uses

    def _last_reads(self, n: int) -> None:
        """Fill `lasts_at`: for each use, the latest read of its file among the blocks
        before it (the file's reads and uses sorted by file, then block: the latest read
        at or before each use's place), kept if the use's request holds it; a use whose
        latest read it does not hold (a rewind) looks further back (`last_read`)."""
        events = np.flatnonzero(self._named)
        if not n or not events.size:
            return
        if events.size < SMALL_EVENTS:
            self._last_reads_small(events, n)
            return
        b = self._blocks
        read = (self._named & _READ_OK) != 0
        use = self._uses()
        if not read.any() or not use.any():
            return
        events = np.flatnonzero(read | use)
        paths = b["path_hash"][events]
        order = np.argsort(paths, kind="stable")  # by file, then block (events ascend)
        events, paths = events[order], paths[order]
        is_read = read[events]
        at = np.where(is_read, np.arange(events.size), -1)
        np.maximum.accumulate(at, out=at)
        uses = np.flatnonzero(~is_read)
        cand = at[uses]
        found = cand >= 0
        cand[~found] = 0
        found &= paths[cand] == paths[uses]
        last = events[cand]
        block = events[uses]
        ks = b["origin"][block]
        held = found & (b["first_request"][last] <= ks) & (ks < b["hidden_from"][last])
        keep = held & (ks < n)
        lasts_at = self.lasts_at
        for k, r in zip(ks[keep].tolist(), last[keep].tolist(), strict=True):
            at_k = lasts_at[k]
            if at_k is None:
                lasts_at[k] = [r]
            else:
                at_k.append(r)
        back = found & ~held & (ks < n)  # rare: the latest read left the history
        for u, p, k in zip(
            block[back].tolist(), paths[uses][back].tolist(), ks[back].tolist(), strict=True
        ):
            r = self.last_read(p, u, k)
            if r >= 0:
                at_k = lasts_at[k]
                if at_k is None:
                    lasts_at[k] = [r]
                else:
                    at_k.append(r)

    def _last_reads_small(self, events: npt.NDArray[np.intp], n: int) -> None:
        """`_last_reads` in one Python pass over the reads and uses in history order (the
        latest read of each file so far): for a few of them, cheaper than numpy's calls."""
        b = self._blocks
        lasts_at = self.lasts_at
        latest: dict[int, tuple[int, int, int]] = {}
        for block, p, named, k, first, hidden in zip(
            events.tolist(),
            b["path_hash"][events].tolist(),
            self._named[events].tolist(),
            b["origin"][events].tolist(),
            b["first_request"][events].tolist(),
            b["hidden_from"][events].tolist(),
            strict=True,
        ):
            if named & _READ_OK:
                latest[p] = (block, first, hidden)
                continue
            if not 0 <= k < n:  # no request's response made it
                continue
            got = latest.get(p)
            if got is None:
                continue
            r, since, until = got
            if not since <= k < until:  # rare: the latest read left the history
                r = self.last_read(p, block, k)
                if r < 0:
                    continue
            at_k = lasts_at[k]
            if at_k is None:
                lasts_at[k] = [r]
            else:
                at_k.append(r)

    def last_read(self, path: int, before: int, k: int) -> int:
        """The latest read result of `path` older than block `before` in the logical
        history of request k, or -1."""
        if self._reads is None:  # first asked: the reads per file, in history order
            b = self._blocks
            picked = np.flatnonzero(self._named & _READ_OK)
            self._reads = {}
            for block, p in zip(picked.tolist(), b["path_hash"][picked].tolist(), strict=True):
                self._reads.setdefault(p, []).append(block)
            self._visible = (b["first_request"].tolist(), b["hidden_from"].tolist())
        reads = self._reads.get(path)
        if not reads or self._visible is None:
            return -1
        first, hidden = self._visible
        for i in range(bisect_left(reads, before) - 1, -1, -1):  # ascending block ids
            block = reads[i]
            if first[block] <= k < hidden[block]:
                return block
        return -1

    def facts(self, k: int, view: View, call: Call) -> tuple[int, int, int, int, bool]:
        """(human_tokens, human_verbatim_tokens, summary_tokens, stale_file_refs,
        after_compaction) of one call for request k, as the engine prices it.

        The common case first: the last view with items appended (its "last changed"
        index at or past the items seen; a request adds 2 to 4 items: `_append`), then a
        request row with no file use to check and no compaction or artifact since the last
        one."""
        n = self.n
        total = len(view.ids)
        if view is self.last_view:
            changed = view.changed
            if changed >= n:
                if n < total:
                    self._append(view, n, total)
                    view.changed = self.n = total
            else:  # changed below what was seen: kept in `View.seen` from there
                seen = view.seen
                assert seen is not None
                self._update(view, changed, seen, n, total)
                view.changed = self.n = total
                view.seen = None
        else:
            if call.kind == "compaction" and total < 2:
                self._summarized_last()
            self._another(view, n, total)
        kind = call.kind
        if (
            kind == "request"
            and self.lasts_at[k] is None
            and not (self.summarized or self.artifacts_changed or self.looped)
        ):
            return (self.human_at[k], self.human, self.summary, 0, False)
        return self._checked(k, view, kind, total)

    def _summarized_last(self) -> None:
        """A compaction call that sends no view (one the recording never billed: Codex
        0.118+'s remote compaction, `compaction_call` "unrecorded") summarized the last view
        seen: its last item as seen marks what a request after it no longer sends."""
        seen_view, n = self.last_view, self.n
        if seen_view is None or n == 0:
            return
        c = seen_view.changed
        if c >= n:
            last = seen_view.chains[n - 1]
        else:  # changed below n since: the items seen from c on are kept in `View.seen`
            seen = seen_view.seen
            assert seen is not None
            previous = seen_view.chains[c - 1] if c else seen_view.root
            last = prefix_hashes(previous, c, seen.hashes[: n - c])[-1]
        self.summarized.append((n - 1, last))

    def _another(self, view: View, n: int, total: int) -> None:
        """`facts` for another view object than the last one seen (a re-chained prefix, a
        re-fetch round's copy): appended if it goes on from where the last one was seen. The
        items seen last are the last view's below its "last changed" index and
        `View.seen` from there (simulator/view.py); that view is let go (it keeps nothing
        more)."""
        seen_view = self.last_view
        if n <= total and (
            not n
            or (
                seen_view is not None
                and seen_view.changed >= n  # unchanged since seen: its hash holds
                and view.chains[n - 1] == seen_view.chains[n - 1]
                and view.cum[n - 1] == seen_view.cum[n - 1]
            )
        ):
            if n < total:
                self._append(view, n, total)
        else:
            assert seen_view is not None  # n > 0: a view was seen
            self._update(view, 0, _seen_items(seen_view, n), n, total)
        if seen_view is not None:
            seen_view.changed = 0
            seen_view.seen = None
        self.last_view = view
        view.changed = self.n = total
        view.seen = None

    def _checked(
        self, k: int, view: View, kind: str, total: int
    ) -> tuple[int, int, int, int, bool]:
        """`facts` of a call with something to check: a request whose response uses files,
        or the first request after a compaction call or a change of the view's artifacts
        (`after_compaction`), or a call that is no request."""
        stale = 0
        after = False
        if kind == "request":
            lasts = self.lasts_at[k]
            if lasts:
                kept = self.verbatim
                for last in lasts:
                    if last not in kept:
                        stale += 1
            elif self.loop is not None:
                uses = self.uses.get(k)
                if uses:
                    stale = self._stale(k, uses)
            if self.summarized:
                chains = view.chains
                after = any(pos >= total or chains[pos] != chain for pos, chain in self.summarized)
                self.summarized = []
            if self.artifacts_changed:
                seen = self.seen_artifacts
                after = after or any(block not in seen for block in self.artifacts)
                self.seen_artifacts = set(self.artifacts)
                self.artifacts_changed = False
        elif kind == "compaction" and total >= 2:
            # The call's last item is its own prompt; before it is what it summarized.
            self.summarized.append((total - 2, view.chains[total - 2]))
        return (self.human_at[k], self.human, self.summary, stale, after)

    def _append(self, view: View, n: int, total: int) -> None:
        """Put the view's items from position n to `total` (appended since the last call)
        into the totals: most often history blocks b, b + 1, ... (one slice comparison, in
        C), of which only the relevant ones are looked at (`relevant`: most calls append
        none), where sent verbatim (an artifact among them: every item, `_add`)."""
        view_ids = view.ids
        first = view_ids[n]
        end = first + total - n
        if first < 0 or view_ids[n:total] != self.block_ids[first:end]:
            self._add(view, n, total)
            self._summarize()
            return
        relevant = self.relevant
        i = bisect_left(relevant, first)
        block = relevant[i]
        if block >= end:
            return
        hash_of, tokens_of, human_of, artifact_of = (
            self.hash_of,
            self.tokens_of,
            self.human_of,
            self.artifact_of,
        )
        hashes, tokens = view.hashes, view.tokens
        keep = self.verbatim.add
        human = 0
        while block < end:
            if artifact_of[block]:
                self._add(view, n, total)
                self._summarize()
                return
            at = n + block - first
            if hashes[at] == hash_of[block] and tokens[at] == tokens_of[block]:
                keep(block)
                human += human_of[block]
            i += 1
            block = relevant[i]
        self.human += human

    def _summarize(self) -> None:
        """The summary tokens from the totals: the artifacts, and what the view inserts
        beyond the system + tools prefix."""
        inserted = self.inserted - self.prefix_tokens
        self.summary = self.recorded + inserted if inserted > 0 else self.recorded

    def _same(self, view: View, lo: int, hi: int, shift: int = 0) -> bool:
        """Whether the view's items at positions lo..hi-1 are the last view's at lo + shift
        onwards (block, content hash, tokens: what the totals depend on; compared in C).
        Only during `_update`, and for positions from its start on."""
        seen = self._seen
        a = lo + shift - self._base
        b = hi + shift - self._base
        return (
            seen.ids[a:b] == view.ids[lo:hi]
            and seen.hashes[a:b] == view.hashes[lo:hi]
            and seen.tokens[a:b] == view.tokens[lo:hi]
        )

    def _update(self, view: View, start: int, seen: Seen, n: int, total: int) -> None:
        """Bring the totals from the last view (n items; from position `start` on, those
        in `seen`) to `view` (`total` items), where it is not the last view with items
        appended: only what changed is taken out and put back. The items before `start`
        are the last view's (the view's "last changed" index, simulator/view.py), so the
        comparisons begin there: a policy that rewrites near the end of a long view
        (masking) pays for the items after the rewrite only.

        Most often the item at `start` holds the same block, rewritten, and the rest is
        as it was, then perhaps more appended (masking rewrites one observation a request:
        10,443 of its 10,600 updates on the shared Claude Code corpus). Otherwise items
        that left from the end are taken out; or, after the first item that differs, a
        view that dropped items holds the rest shifted (a recorded block leaving, a snip),
        one that rewrote items holds the rest at the same positions (a re-chained prefix,
        a cleared or masked result: only their prefix hashes moved), and one that lost
        most of it (a compaction) is counted afresh. The first two are found by slice
        comparisons, in C. A rewrite is most often of one item (the shared Claude Code
        corpus under as-recorded: 157 of its 197 updates, 149 of them in the first five
        positions, the system + tools prefix), so the items after the first that differs
        are compared at once before any search."""
        self._seen = seen
        self._base = start
        if start < n <= total:
            block = seen.ids[0]
            if block >= 0 and block == view.ids[start] and self._same(view, start + 1, n):
                self._rewrite_one(view, start)
                if n < total:
                    self._append(view, n, total)
                return
            if seen.ids == view.ids[start:n]:  # the same items, some rewritten in place
                self._rewrite_in_place(view, start, n)
                if n < total:
                    self._append(view, n, total)
                return
        if 0 < total < n and self._same(view, start, total):  # items left from the end only
            self._drop(total, n)
        else:
            self._rewrite(view, n, total, start)
        self._summarize()

    def _rewrite_one(self, view: View, p: int) -> None:
        """The item at position p holds the same history block as in the last view,
        perhaps rewritten (its content hash or tokens): its old form is taken out of the
        totals and the new one put in (what `_drop` and `_add` of the one item do). A
        view holds a block at most once, so the rest cannot have moved (`_shift`)."""
        block = view.ids[p]
        h = view.hashes[p]
        t = view.tokens[p]
        human = self.human_of[block]
        verbatim = self.verbatim
        if block in verbatim:
            verbatim.discard(block)
            self.human -= human
        if h == self.hash_of[block] and t == self.tokens_of[block]:
            verbatim.add(block)
            self.human += human
        if self.artifact_of[block]:
            self.artifacts.add(block)
            self.recorded += t - self._seen.tokens[p - self._base]
            self.artifacts_changed = True
            self._summarize()

    def _rewrite_in_place(self, view: View, start: int, n: int) -> None:
        """Items start..n-1 hold the same blocks at the same positions as in the last
        view, some of them rewritten (masking's request that masks two old observations:
        858 of its 9,174 updates on the 10,000-request synthetic session, where the
        search of `_rewrite` cost 18 us each): each item whose content hash or tokens
        changed is one rewrite (`_rewrite_one`; an item of the policy's own, its tokens)."""
        seen = self._seen
        ids, hashes, tokens = seen.ids, seen.hashes, seen.tokens
        view_hashes, view_tokens = view.hashes, view.tokens
        inserted = 0
        for i, p in enumerate(range(start, n)):
            if hashes[i] != view_hashes[p] or tokens[i] != view_tokens[p]:
                if ids[i] >= 0:
                    self._rewrite_one(view, p)
                else:
                    inserted += view_tokens[p] - tokens[i]
        if inserted:
            self.inserted += inserted
            self._summarize()

    def _rewrite(self, view: View, n: int, total: int, start: int) -> None:
        """`_update` for a view that differs from the last one before its end (not before
        `start`)."""
        m = n if n <= total else total
        lo, hi = start, m  # p: the first position whose item differs
        if lo < hi and not self._same(view, lo, lo + 1):
            hi = lo  # the view's own "last changed" item is the first to differ (masking)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._same(view, lo, mid + 1):
                lo = mid + 1
            else:
                hi = mid
        p = lo
        shift = self._shift(view, p, n) if p < total else 0
        if not shift and 2 * p < n - total:  # most of it left (a compaction): start over
            self.verbatim.clear()
            self.artifacts.clear()
            self.artifacts_changed = True
            self.human = self.inserted = self.recorded = 0
            self._add(view, 0, total)
        elif shift:  # items p..p+shift-1 left; the rest moved up, then new ones came
            kept = n - p - shift
            self._drop(p, p + shift)
            self._add(view, p + kept, total)
        else:
            # q: items q..m-1 are the same items at the same positions (q > p if p < m)
            if p < m and self._same(view, p + 1, m):
                lo = p + 1
            else:
                lo, hi = p, m
                while lo < hi:
                    mid = (lo + hi) // 2
                    if self._same(view, mid, m):
                        hi = mid
                    else:
                        lo = mid + 1
            self._drop(p, lo)
            self._drop(m, n)
            self._add(view, p, lo)
            self._add(view, m, total)

    def _shift(self, view: View, p: int, n: int) -> int:
        """How many items of the last view (n items) left at position p, if its items
        after them are the view's from p on (moved up); 0 if not so."""
        base = self._base
        try:
            at = self._seen.ids.index(view.ids[p], p + 1 - base) + base
        except ValueError:
            return 0
        shift = at - p
        kept = n - at
        if kept > len(view.ids) - p or not self._same(view, p, p + kept, shift):
            return 0
        return shift

    def _drop(self, lo: int, hi: int) -> None:
        """Take the last view's items at positions lo..hi-1 out of the totals."""
        if lo >= hi:
            return
        base = self._base
        ids, tokens = self._seen.ids, self._seen.tokens
        human_of, artifact_of = self.human_of, self.artifact_of
        verbatim, artifacts = self.verbatim, self.artifacts
        human = inserted = recorded = 0
        for pos in range(lo - base, hi - base):
            block = ids[pos]
            if block < 0:
                inserted += tokens[pos]
                continue
            if block in verbatim:
                verbatim.discard(block)
                human += human_of[block]
            if artifact_of[block]:
                artifacts.discard(block)
                recorded += tokens[pos]
                self.artifacts_changed = True
        self.human -= human
        self.inserted -= inserted
        self.recorded -= recorded

    def _add(self, view: View, lo: int, hi: int) -> None:
        """Put the view's items at positions lo..hi-1 into the totals."""
        if lo >= hi:
            return
        hash_of, tokens_of, human_of, artifact_of = (
            self.hash_of,
            self.tokens_of,
            self.human_of,
            self.artifact_of,
        )
        ids, hashes, tokens = view.ids, view.hashes, view.tokens
        keep = self.verbatim.add
        human = inserted = 0
        for pos in range(lo, hi):
            block = ids[pos]
            if block < 0:
                inserted += tokens[pos]
            elif hashes[pos] == hash_of[block] and tokens[pos] == tokens_of[block]:
                keep(block)
                human += human_of[block]
                if artifact_of[block]:
                    self._add_artifact(block, tokens[pos])
            elif artifact_of[block]:
                self._add_artifact(block, tokens[pos])
        self.human += human
        self.inserted += inserted

    def _add_artifact(self, block: int, held: int) -> None:
        self.artifacts.add(block)
        self.recorded += held
        self.artifacts_changed = True

    def _stale(self, k: int, uses: list[tuple[int, int]]) -> int:
        """With the re-fetch loop: tool calls of request k's response naming a file whose
        latest read (the loop's reads) the view no longer sends verbatim; a use it fetched
        the file back for is not stale, and neither its own read calls nor the re-reads it
        left out are uses."""
        loop = self.loop
        if loop is None:
            return 0
        kept = self.verbatim
        stale = 0
        fetched = loop.refetched.get(k, ())
        for block, path in uses:
            if block >= loop.n_blocks or block in loop.skipped or path in fetched:
                continue
            last = loop.latest(path, k)
            stale += last >= 0 and last not in kept
        return stale


def _seen_items(view: View, n: int) -> Seen:
    """The first n items of a view as the observer saw them (`View.seen`)."""
    c = view.changed
    if c >= n:
        return Seen(view.ids[:n], view.hashes[:n], view.tokens[:n])
    seen = view.seen
    assert seen is not None  # changed below n: kept there
    return Seen(
        view.ids[:c] + seen.ids, view.hashes[:c] + seen.hashes, view.tokens[:c] + seen.tokens
    )


def replay_with_loss(
    traces: Sequence[tuple[str, Trace]],
    policy: Policy,
    options: ReplayOptions | None = None,
    prices: PriceBook | None = None,
    edits: list[Any] | None = None,
) -> pl.DataFrame:
    """`simulator.replay.replay` with the LOSS_SCHEMA columns on its rows (and the
    policy's edits appended to `edits`, as `replay` does); no traces, no loss columns."""
    from simulator.replay import replay  # the engine imports this module

    return replay(list(traces), policy, options, prices, edits=edits, loss=bool(traces))
