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
ones seen at the last call, so only the items from there are compared; for another view
object (a re-chained prefix, a re-fetch round's copy) the prefix hash and cumulative token
count at the end of the last view say whether it goes on from it (a cache_edits deletion
keeps the hash but lowers the counts, so both are compared). The tracker keeps running
totals over the items of the last view and updates them by the items that left
(subtracted) and the items that came (added), so a call costs the items that changed since
the previous call, not the whole view; nothing is converted to arrays per call. Before the
index, masking (which rewrites an old observation each request, near the view's end) made
every call search the whole view for the change: its columns cost 6.2x its replay on the
10,000-request synthetic session, 1.2x with it. Measured (tests/bench/test_bench_loss.py,
the shared Claude Code corpus and a 10,000-request synthetic session, fastest of 7 rounds
of process time, load 6-7 on a shared 2-core machine): the columns add 10-24% to the replay
(as-recorded 1.22x / 1.24x, claude-code 1.20x / 1.10x, masking 1.13x / 1.20x, corpus /
synthetic), varying by a few points from run to run; of that, on the corpus under
as-recorded, `facts` is about 26 ms (2 us a call, 12,747 calls), the per-session set-up
about 10 ms (180 sessions), the extra columns the rest. tests/simulator/
test_replay_properties.py checks the columns against a from-scratch recount.

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
  conversation that call summarized (its view less its last item, the summary prompt), or
  a recorded compaction artifact enters the view at k (the recording's own compaction,
  as-recorded);
* `resent_tokens`: on rows after a compaction, the prompt tokens not read from the cache.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import polars as pl

from simulator.model import Flag, Kind, Session, Trace
from simulator.policy import Call, Policy
from simulator.pricing import PriceBook
from simulator.refetch import SessionLoop
from simulator.view import View

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


#: Flag bits and kinds as plain ints (numpy masks with enum members go through the enum).
_ARTIFACT, _HUMAN, _PATH_READ, _ERROR = (
    int(Flag.ARTIFACT),
    int(Flag.HUMAN),
    int(Flag.PATH_READ),
    int(Flag.ERROR),
)
_TOOL_RESULT, _TOOL_USE = int(Kind.TOOL_RESULT), int(Kind.TOOL_USE)

#: Below this many file reads and uses in a session, `SessionLoss` pairs them in one Python
#: pass; from it on, in numpy (the shared Claude Code corpus: 34 per session on average,
#: where a dozen numpy calls cost more than the pass; the 10,000-request synthetic session
#: of tests/bench/test_bench_loss.py has about 4,800).
SMALL_EVENTS = 256


class SessionLoss:
    """The loss facts of one session's calls, from running totals over the last view seen.

    Built once per replayed session (its history's block hashes and tokens are the ones
    the policy sends, so they are shared, not recomputed); `facts` is called by the engine
    for every call, in row order.

    Per session, what the facts need of each block is built once, as lists (one numpy
    pass, no per-call arrays): its human tokens, whether it is an artifact, and, per
    request, the latest read of each file its response names (without the re-fetch loop
    it depends on the session only, so the call checks only whether the view still sends
    it). Measured on as-recorded (cProfile, line level): the shared Claude Code corpus is
    180 sessions of 20 requests and 68 blocks (medians), so the set-up, once per session,
    cost a fifth of the columns' time there; a request appends 2 to 4 items."""

    def __init__(
        self,
        session: Session,
        hashes: list[int],
        tokens: list[int],
        loop: SessionLoop | None = None,
    ) -> None:
        b = session.blocks
        n = session.n_requests
        flags = b["flags"]
        size = b["tokens"]
        first = b["first_request"]
        hidden = b["hidden_from"]
        artifact = (flags & _ARTIFACT) != 0
        human = (flags & (_HUMAN | _ARTIFACT)) == _HUMAN
        self.prefix_tokens = int(session.prefix_tokens)
        self.loop = loop
        # Human tokens in the logical history before each request: +tokens where a human
        # block enters, -tokens where it leaves (a rewind), summed up (exact in float64:
        # far below 2**53).
        live = human & (first < hidden)
        weights = size[live]
        delta = np.bincount(np.minimum(first[live], n), weights, n + 1) - np.bincount(
            np.minimum(hidden[live], n), weights, n + 1
        )
        self.human_at: list[int] = np.cumsum(delta[:n]).astype(np.int64).tolist()
        self.hash_of = hashes
        self.tokens_of = tokens
        #: Per block: its tokens where the human wrote it (else 0: what it adds to the
        #: verbatim human tokens when sent verbatim), and whether it is an artifact.
        self.human_of: list[int] = np.where(human, size, 0).tolist()
        self.artifact_of: list[bool] = artifact.tolist()
        self._blocks = b
        self._visible: tuple[list[int], list[int]] | None = None
        self._reads: dict[int, list[int]] | None = None
        # Successful read results of a file, and tool calls naming a file (by the request
        # whose response made them).
        path = b["path_hash"]
        kind = b["kind"]
        named = (path != 0) & ~artifact
        self._read = (
            named & (kind == _TOOL_RESULT) & ((flags & (_PATH_READ | _ERROR)) == _PATH_READ)
        )
        use = named & (kind == _TOOL_USE) & (b["origin"] >= 0)
        #: Without the loop: per request, the latest read older than each of its uses, in
        #: the logical history of that request (None where there is none).
        self.lasts_at: list[list[int] | None] = [None] * n
        #: With the loop: per request, its uses (block, file); the loop says what is read.
        self.uses: dict[int, list[tuple[int, int]]] = {}
        if loop is None:
            self._last_reads(use, n)
        else:
            picked = np.flatnonzero(use)
            origin = b["origin"][picked].tolist()
            for block, k, p in zip(picked.tolist(), origin, path[picked].tolist(), strict=True):
                self.uses.setdefault(k, []).append((block, p))
        # The last view seen, item by item (ids, content hashes, tokens), and the running
        # totals over it: human tokens sent verbatim, tokens of items that are no history
        # block (the prefix, a policy's own), artifact tokens, and what they make the
        # summary.
        self.ids: list[int] = []
        self.hashes: list[int] = []
        self.tokens: list[int] = []
        #: The view object seen last: while it is the one priced, its "last changed" index
        #: (simulator/view.py) says from where it differs from the items above; another
        #: one goes on from it where their prefix hashes and token counts agree there.
        self.last_view: View | None = None
        self.human = 0
        self.inserted = 0
        self.recorded = 0
        self.summary = 0
        #: History blocks the view sends verbatim, and the artifacts it holds. Sets: a
        #: view holds a block at most once (a policy projects the history, never repeats
        #: it), so what an item adds to the totals depends on the item, not its position.
        self.verbatim: set[int] = set()
        self.artifacts: set[int] = set()
        #: What the per-call path reads, bound once.
        self._per_block = (
            hashes,
            tokens,
            self.human_of,
            self.artifact_of,
            self.verbatim.add,
        )
        #: The artifacts in the view at the last request row, and whether the view's
        #: artifacts changed since.
        self.seen_artifacts: set[int] = set()
        self.artifacts_changed = False
        #: Where the conversation each compaction call of the current request summarized
        #: ends, and the hash chain of the view through there.
        self.summarized: list[tuple[int, int]] = []

    def _last_reads(self, use: npt.NDArray[np.bool_], n: int) -> None:
        """Fill `lasts_at`: for each use, the latest read of its file among the blocks
        before it (the file's reads and uses sorted by file, then block: the latest read
        at or before each use's place), kept if the use's request holds it; a use whose
        latest read it does not hold (a rewind) looks further back (`last_read`)."""
        read = self._read
        if not n or not read.any() or not use.any():
            return
        b = self._blocks
        events = np.flatnonzero(read | use)
        if events.size < SMALL_EVENTS:
            self._last_reads_small(events, n)
            return
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
        for block, p, is_read, k, first, hidden in zip(
            events.tolist(),
            b["path_hash"][events].tolist(),
            self._read[events].tolist(),
            b["origin"][events].tolist(),
            b["first_request"][events].tolist(),
            b["hidden_from"][events].tolist(),
            strict=True,
        ):
            if is_read:
                latest[p] = (block, first, hidden)
                continue
            got = latest.get(p)
            if got is None or k >= n:
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
            picked = np.flatnonzero(self._read)
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

        The common case first and inline: the last view with items appended (its "last
        changed" index at or past the items seen; a request adds 2 to 4 items), whose
        items are added from the appended slices alone."""
        ids = self.ids
        n = len(ids)
        view_ids = view.ids
        total = len(view_ids)
        seen_view = self.last_view
        if view is seen_view:  # its "last changed" index says what to compare
            start = view.changed
            appended = start >= n
        else:  # another view: appended if it goes on from where the last one was seen
            start = 0
            appended = n <= total and (
                not n
                or (
                    seen_view is not None
                    and seen_view.changed >= n  # the last view unchanged since: its hash holds
                    and view.chains[n - 1] == seen_view.chains[n - 1]
                    and view.cum[n - 1] == seen_view.cum[n - 1]
                )
            )
        if appended:
            if n < total:
                new_ids = view_ids[n:]
                new_hashes = view.hashes[n:]
                new_tokens = view.tokens[n:]
                ids += new_ids
                self.hashes += new_hashes
                self.tokens += new_tokens
                hash_of, tokens_of, human_of, artifact_of, keep = self._per_block
                human = 0
                rare = False  # an item that is no history block, or an artifact
                for block, h, t in zip(new_ids, new_hashes, new_tokens, strict=True):
                    if block < 0 or artifact_of[block]:
                        rare = True
                    elif h == hash_of[block] and t == tokens_of[block]:
                        keep(block)
                        human += human_of[block]
                self.human += human
                if rare:
                    self._add_rare(new_ids, new_hashes, new_tokens)
        else:
            self._update(view, start)
        self.last_view = view
        view.changed = total
        stale = 0
        after = False
        kind = call.kind
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

    def _add_rare(self, ids: list[int], hashes: list[int], tokens: list[int]) -> None:
        """The appended items the inline loop passed over: items that are no history
        block (into `inserted`) and artifacts (verbatim or not)."""
        hash_of, tokens_of, human_of, artifact_of = (
            self.hash_of,
            self.tokens_of,
            self.human_of,
            self.artifact_of,
        )
        for block, h, t in zip(ids, hashes, tokens, strict=True):
            if block < 0:
                self.inserted += t
            elif artifact_of[block]:
                if h == hash_of[block] and t == tokens_of[block]:
                    self.verbatim.add(block)
                    self.human += human_of[block]
                self._add_artifact(block, t)
        self._summarize()

    def _summarize(self) -> None:
        """The summary tokens from the totals: the artifacts, and what the view inserts
        beyond the system + tools prefix."""
        inserted = self.inserted - self.prefix_tokens
        self.summary = self.recorded + inserted if inserted > 0 else self.recorded

    def _same(self, view: View, lo: int, hi: int, shift: int = 0) -> bool:
        """Whether the view's items at positions lo..hi-1 are the last view's at lo + shift
        onwards (block, content hash, tokens: what the totals depend on; compared in C)."""
        a, b = lo + shift, hi + shift
        return (
            self.ids[a:b] == view.ids[lo:hi]
            and self.hashes[a:b] == view.hashes[lo:hi]
            and self.tokens[a:b] == view.tokens[lo:hi]
        )

    def _update(self, view: View, start: int = 0) -> None:
        """Bring the totals from the last view to `view` where it is not the last view
        with more items after it (`facts` adds those): only what changed is taken out and
        put back. Items that left from the end are taken out; otherwise, after the first
        item that differs, a view that dropped items holds the rest shifted (a recorded
        block leaving, a snip), one that rewrote items holds the rest at the same
        positions (a re-chained prefix, a cleared or masked result: only their prefix
        hashes moved), and one that lost most of it (a compaction) is counted afresh.
        The first two are found by slice comparisons, in C. A rewrite is most often of
        one item (the shared Claude Code corpus under as-recorded: 157 of its 197 updates,
        149 of them in the first five positions, the system + tools prefix), so the items
        after the first that differs are compared at once before any search. `start`: the
        items before it are known to be the last view's (the view's "last changed" index,
        simulator/view.py), so the comparisons begin there: a policy that rewrites near
        the end of a long view (masking) pays for the items after the rewrite only."""
        n = len(self.ids)
        total = len(view.ids)
        if 0 < total < n and self._same(view, start, total):  # items left from the end only
            self._drop(total, n)
            del self.ids[total:], self.hashes[total:], self.tokens[total:]
        else:
            self._rewrite(view, n, total, start)
        self._summarize()

    def _rewrite(self, view: View, n: int, total: int, start: int = 0) -> None:
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
        shift = self._shift(view, p) if p < total else 0
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
        self.ids[p:] = view.ids[p:]
        self.hashes[p:] = view.hashes[p:]
        self.tokens[p:] = view.tokens[p:]

    def _shift(self, view: View, p: int) -> int:
        """How many items of the last view left at position p, if its items after them
        are the view's from p on (moved up); 0 if not so."""
        try:
            at = self.ids.index(view.ids[p], p + 1)
        except ValueError:
            return 0
        shift = at - p
        kept = len(self.ids) - at
        if kept > len(view.ids) - p or not self._same(view, p, p + kept, shift):
            return 0
        return shift

    def _drop(self, lo: int, hi: int) -> None:
        """Take the last view's items at positions lo..hi-1 out of the totals."""
        if lo >= hi:
            return
        ids, tokens = self.ids, self.tokens
        human_of, artifact_of = self.human_of, self.artifact_of
        verbatim, artifacts = self.verbatim, self.artifacts
        human = inserted = recorded = 0
        for pos in range(lo, hi):
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
