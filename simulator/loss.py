"""Loss proxies: what a policy's view no longer holds (reports/METRICS.md, "Loss proxies").

Cost is in the request rows; what a policy *loses* needs per-call facts about the view
(which history blocks it still sends verbatim) that the replay engine does not emit as
columns yet. Until it does, `replay_with_loss` runs the ordinary replay with an observer
(simulator/replay.py `Observer`): the engine hands it every call as it prices it, so it
sees exactly the view priced, in the order the engine writes its rows. One replay, no copy
of the engine's loop. Each observed call is checked against its row (same view size), so a
mismatch fails loudly instead of skewing a metric. These are per-row facts only: session
and run figures are polars aggregations of the columns (simulator/frames.py), never a
second bookkeeping.

The columns (simulator/frames.py LOSS_SCHEMA), for the view of one call made for request k:

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
  it fetched back; the engine tells the observer the loop through `begin`);
* `after_compaction` (request rows): the view was rewritten by a compaction at k: the
  policy made a compaction call for request k and the request no longer sends the
  conversation that call summarized (its view less its last item, the summary prompt), or
  a recorded compaction artifact enters the view at k (the recording's own compaction,
  as-recorded);
* `resent_tokens`: on rows after a compaction, the prompt tokens not read from the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from simulator.frames import LOSS_SCHEMA, has_loss
from simulator.model import Flag, Kind, Session, Trace
from simulator.policy import Call, Policy
from simulator.pricing import PriceBook
from simulator.prompt_cache import Usage
from simulator.refetch import SessionLoop
from simulator.replay import ReplayOptions, replay
from simulator.view import View


class LossPassError(RuntimeError):
    """The observed calls do not line up with the engine's rows (a bug, never bad input)."""


class _SessionFacts:
    """Per-session arrays the observer looks blocks up in (computed once per session)."""

    def __init__(self, session: Session) -> None:
        b = session.blocks
        n = session.n_requests
        flags = b["flags"].astype(np.int64)
        artifact = (flags & Flag.ARTIFACT) != 0
        first = b["first_request"].astype(np.int64)
        hidden = b["hidden_from"].astype(np.int64)
        tokens = b["tokens"].astype(np.int64)
        self.first = first
        self.hidden = hidden
        human = ((flags & Flag.HUMAN) != 0) & ~artifact
        self.prefix_tokens = int(session.prefix_tokens)
        # Human tokens in the logical history before each request: +tokens where a human
        # block enters, -tokens where it leaves (a rewind), summed up.
        live = human & (first < hidden)
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, np.minimum(first[live], n), tokens[live])
        np.add.at(delta, np.minimum(hidden[live], n), -tokens[live])
        self.human_at: list[int] = np.cumsum(delta)[:n].tolist()
        #: Per block, as plain lists for the per-item work of the incremental pass: its
        #: content hash and tokens, whether the human wrote it, and whether the recording's
        #: compaction wrote it (its summary and the restored attachments).
        self.hash_of: list[int] = b["hash"].astype(np.uint64).tolist()
        self.tokens_of: list[int] = tokens.tolist()
        self.human_of: list[bool] = human.tolist()
        self.artifact_of: list[bool] = artifact.tolist()
        # Successful read results per file, in history order.
        path = b["path_hash"]
        kind = b["kind"]
        read = (
            (kind == Kind.TOOL_RESULT)
            & ((flags & Flag.PATH_READ) != 0)
            & ((flags & Flag.ERROR) == 0)
            & ~artifact
            & (path != 0)
        )
        self.reads: dict[int, list[int]] = {}
        for block in np.nonzero(read)[0].tolist():
            self.reads.setdefault(int(path[block]), []).append(block)
        # File uses per request: tool calls naming a file, by the request whose response
        # made them.
        origin = b["origin"]
        use = (kind == Kind.TOOL_USE) & (path != 0) & (origin >= 0) & ~artifact
        self.uses: dict[int, list[tuple[int, int]]] = {}
        for block in np.nonzero(use)[0].tolist():
            self.uses.setdefault(int(origin[block]), []).append((block, int(path[block])))

    def last_read(self, path: int, before: int, k: int) -> int:
        """The latest read result of `path` older than block `before` in the logical
        history of request k, or -1."""
        for block in reversed(self.reads.get(path, ())):
            if block < before and self.first[block] <= k < self.hidden[block]:
                return block
        return -1


class _ViewState:
    """Running sums over the items of the last view observed, so that a call costs the
    items that changed since the previous call, not the whole view: views are append-mostly
    (a request adds its new blocks; a compaction rewrites from a point), and the hash chain
    and the cumulative token counts say where the new view departs from the old one (a
    cache_edits deletion keeps the hash but lowers the counts, so both are compared)."""

    def __init__(self, f: _SessionFacts) -> None:
        self.f = f
        self.ids: list[int] = []
        self.chains: list[int] = []
        self.cum: list[int] = []  # view.cum as it was for each item processed
        #: Prefix sums (index i: over the first i items) of the human tokens sent verbatim,
        #: of what is neither history nor prefix nor artifact (inserted), of artifact tokens.
        self.human = [0]
        self.inserted = [0]
        self.recorded = [0]
        #: History blocks the view sends verbatim (block -> position), and the artifacts.
        self.verbatim: dict[int, int] = {}
        self.artifacts: dict[int, int] = {}

    def _common(self, view: View) -> int:
        """How many leading items the view shares with the state (same chain, same sums)."""
        n = min(len(self.chains), len(view.chains))
        chains, cum = view.chains, view.cum
        if n and self.chains[n - 1] == chains[n - 1] and self.cum[n - 1] == cum[n - 1]:
            return n
        lo, hi = 0, n  # the predicate "item j is shared" is true up to a point, then false
        while lo < hi:
            mid = (lo + hi) // 2
            if self.chains[mid] == chains[mid] and self.cum[mid] == cum[mid]:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def update(self, view: View) -> None:
        m = self._common(view)
        for pos in range(len(self.ids) - 1, m - 1, -1):  # items that left or changed
            block = self.ids[pos]
            if self.verbatim.get(block) == pos:
                del self.verbatim[block]
            if self.artifacts.get(block) == pos:
                del self.artifacts[block]
        del self.ids[m:], self.chains[m:], self.cum[m:]
        del self.human[m + 1 :], self.inserted[m + 1 :], self.recorded[m + 1 :]
        f = self.f
        hash_of, tokens_of, human_of, artifact_of = (
            f.hash_of,
            f.tokens_of,
            f.human_of,
            f.artifact_of,
        )
        human, inserted, recorded = self.human[-1], self.inserted[-1], self.recorded[-1]
        ids, hashes, tokens = view.ids, view.hashes, view.tokens
        for pos in range(m, len(ids)):
            block, held = ids[pos], tokens[pos]
            if block >= 0:
                if hashes[pos] == hash_of[block] and held == tokens_of[block]:
                    self.verbatim[block] = pos
                    if human_of[block]:
                        human += held
                if artifact_of[block]:
                    self.artifacts[block] = pos
                    recorded += held
            else:
                inserted += held
            self.human.append(human)
            self.inserted.append(inserted)
            self.recorded.append(recorded)
        self.ids.extend(ids[m:])
        self.chains.extend(view.chains[m:])
        self.cum.extend(view.cum[m:])


class _Observer:
    """Called by the engine for every call of one trace as it is priced (simulator/replay.py
    `Observer`): records the loss facts of the call's view."""

    def __init__(self, trace: Trace, sink: list[Any]) -> None:
        self.trace = trace
        self.sink = sink
        self.index = -1
        self.f: _SessionFacts | None = None
        self.state: _ViewState | None = None
        #: Where the conversation each compaction call of the current request summarized
        #: ends, and the hash chain of the view through there.
        self.summarized: list[tuple[int, int]] = []
        self.artifacts: set[int] = set()
        #: The semi-closed loop of each session that runs one (simulator/refetch.py).
        self.loops: dict[int, SessionLoop] = {}
        self.loop: SessionLoop | None = None

    def begin(self, index: int, loop: SessionLoop) -> None:
        """Told by the engine before a session's first call when the loop runs: its views
        hold the loop's blocks, and its reads are the loop's (ghosts in, skips out)."""
        self.loops[index] = loop

    def __call__(self, index: int, k: int, view: View, call: Call, usage: Usage) -> None:
        if index != self.index or self.f is None or self.state is None:  # the next session
            self.index = index
            self.loop = self.loops.pop(index, None)
            session = self.loop.session if self.loop is not None else self.trace.sessions[index]
            self.f = _SessionFacts(session)
            self.state = _ViewState(self.f)
            self.summarized = []
            self.artifacts = set()
        self.sink.append(self.facts(self.f, self.state, k, view, call))

    def facts(
        self, f: _SessionFacts, state: _ViewState, k: int, view: View, call: Call
    ) -> tuple[Any, ...]:
        state.update(view)
        human_kept = state.human[-1]
        inserted = state.inserted[-1] - f.prefix_tokens
        summary = state.recorded[-1] + max(0, inserted)
        stale = 0
        after = False
        if call.kind == "request":
            uses = f.uses.get(k)
            loop = self.loop
            if uses and loop is None:
                kept = state.verbatim
                for block, path in uses:
                    last = f.last_read(path, block, k)
                    stale += last >= 0 and last not in kept
            elif uses and loop is not None:
                # The loop's reads; a use it fetched the file back for is not stale, and
                # neither its own read calls nor the re-reads it left out are uses.
                kept = state.verbatim
                fetched = loop.refetched.get(k, ())
                for block, path in uses:
                    if block >= loop.n_blocks or block in loop.skipped or path in fetched:
                        continue
                    last = loop.latest(path, k)
                    stale += last >= 0 and last not in kept
            in_view = set(state.artifacts)
            chains = view.chains
            rewritten = any(
                pos >= len(chains) or chains[pos] != chain for pos, chain in self.summarized
            )
            after = rewritten or bool(in_view - self.artifacts)
            self.artifacts = in_view
            self.summarized = []
        elif call.kind == "compaction" and len(view.chains) >= 2:
            # The call's last item is its own prompt; before it is what it summarized.
            pos = len(view.chains) - 2
            self.summarized.append((pos, view.chains[pos]))
        return (view.total, f.human_at[k], human_kept, summary, stale, after)


_OBSERVED: dict[str, Any] = {
    "view_tokens": pl.Int64,
    "human_tokens": pl.Int64,
    "human_verbatim_tokens": pl.Int64,
    "summary_tokens": pl.Int64,
    "stale_file_refs": pl.Int64,
    "after_compaction": pl.Boolean,
}


def replay_with_loss(
    traces: Sequence[tuple[str, Trace]],
    policy: Policy,
    options: ReplayOptions | None = None,
    prices: PriceBook | None = None,
    edits: list[Any] | None = None,
) -> pl.DataFrame:
    """`simulator.replay.replay` with the LOSS_SCHEMA columns appended to its rows (and
    the policy's edits appended to `edits`, as `replay` does).

    One replay per trace (the observer is told the session index, not the trace); rows an
    engine already gives loss columns are returned as the engine made them.
    """
    if not traces:
        return replay([], policy, options, prices, edits=edits)
    frames = []
    for name, trace in traces:
        sink: list[Any] = []
        frame = replay(
            [(name, trace)], policy, options, prices, observe=_Observer(trace, sink), edits=edits
        )
        frames.append(frame if has_loss(frame) else _joined(frame, sink, policy))
    return pl.concat(frames, how="vertical")


def _joined(frame: pl.DataFrame, sink: list[Any], policy: Policy) -> pl.DataFrame:
    """The engine's rows with the observed facts beside them (the same calls, in order)."""
    observed = pl.DataFrame(sink, schema=_OBSERVED, orient="row")
    if observed.height != frame.height:
        raise LossPassError(
            f"policy {policy.name!r}: observed {observed.height} calls, the replay wrote "
            f"{frame.height} rows"
        )
    joined = frame.hstack(observed)
    wrong = joined.filter(pl.col("view_tokens") != pl.col("context_tokens"))
    if wrong.height:
        first = wrong.row(0, named=True)
        raise LossPassError(
            f"policy {policy.name!r}: the observed view differs from the replay's row at "
            f"trace {first['trace']!r} session {first['session_index']} request "
            f"{first['request']} call {first['call']}"
        )
    fresh = pl.col("uncached_input") + pl.col("cache_write_5m") + pl.col("cache_write_1h")
    return joined.with_columns(
        pl.when(pl.col("after_compaction")).then(fresh).otherwise(0).alias("resent_tokens")
    ).select([*frame.columns, *LOSS_SCHEMA])
