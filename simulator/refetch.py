"""The semi-closed loop: what the agent does again when a policy drops what it still needs.

Open-loop replay (DESIGN.md section 3) keeps the recorded actions whatever the policy sends,
so a compaction earlier than the recording's costs nothing later. With `--refetch` the
recording is taken as the agent's behaviour under the recording's own context, and only the
difference between the two contexts changes it, per file the agent read:

* **Re-fetch** (policy dropped, recording held). A recorded tool call of the response to
  request k uses a file (an edit, a write, an apply_patch; a read is itself the fetch) whose
  latest read result the recording still sent verbatim at k but the policy's view does not
  (what `stale_file_refs` counts, simulator/loss.py). With probability `refetch` the agent
  first reads it again: one inserted round, priced at the response's end (`ts_end` of k),
  sends the view of k plus the read call and its result (the read call as last recorded,
  the result at the size last seen), outputs the read call, and both join the view from
  k + 1 on (before the response of k), so they move later compactions. One round holds every
  file fetched for that response (parallel tool calls).
* **Skipped re-read** (recording dropped, policy held). A recorded read of a file that the
  recording's own compaction dropped (its previous read result compacted away at a recorded
  compaction event, the read within `window` requests of it, no read of it since) is left
  out, call and result, of the view of a policy whose view still holds that previous read
  verbatim, with probability `skip` (the share of such re-reads the compaction caused);
  its call's tokens leave the response's output.
* Both dropped, or both held: nothing. The recording already holds the agent's reaction to
  its own compaction, so `as-recorded` replays exactly as in the open loop.

The two probabilities come from the recordings (simulator/app/measure/refetch_measure.py,
the data and its table in policies/calibration/refetch.json and refetch.md): after each recorded
compaction (Claude Code and Codex in ../shared/traces), the share of the files whose read it
dropped and that were used (not read) within `window` requests after it, read again before
that use, against the same share at matched points without a compaction (the 10 closest in
recorded context of the same format, within 25%, no compaction within `window` either
side); `refetch` is the excess over the agent's habit of re-reading what it holds,
`(r_c - r_0) / (1 - r_0)`: the recorded habit re-reads stay in the replay, so only the other
uses need drawing. `skip` is the share of the first re-reads within the window that the
compaction caused, `(s_c - s_0) / s_c`. Each is fitted per format on its folders pooled
(leave-one-source-out figures per folder in refetch.md), the window too (`FITTED`).

Draws are seeded hashes of (seed, trace, session, block), not the session's rng, so turning
the loop on changes no draw a policy makes. Assumptions (reports/METRICS.md, "Re-fetch"):
a file's content is its latest successful read result (a restored attachment, a policy's
summary or a partial read do not count as holding it); a policy's restored files count as
dropped; the agent does nothing else differently (its later recorded actions stay).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from dataclasses import dataclass, replace

import numpy as np

from simulator.history import History
from simulator.model import NEVER, Flag, Kind, Session, block_columns
from simulator.view import View


@dataclass(frozen=True)
class RefetchParams:
    """The loop's parameters: the chance a used, dropped file is read again first, the
    chance a compaction-caused recorded re-read is not needed, and the re-read window."""

    refetch: float
    skip: float
    window: int


#: Per recording format, as fitted by simulator/app/measure/refetch_measure.py on ../shared/traces
#: (policies/calibration/refetch.json "formats" -> "fit"; the table: refetch.md;
#: tests/simulator/test_refetch.py checks they are equal). Claude Code re-reads after its
#: compactions barely more than at matched points without one (0.165 of the dropped files within 50
#: requests against 0.140): it restores the files it read last and its summary names the
#: rest, so few re-reads are the compaction's. Codex restores no file: 0.137
#: against 0.003. Before an edit of a dropped file, neither reads it again more often than
#: when it holds it (Claude Code 9 of 19 against 0.434; Codex 0 of 3), so the fitted re-fetch
#: chance is small (0.0705) or nil: the agents act from the summary.
FITTED: dict[str, RefetchParams] = {
    "claude-code": RefetchParams(refetch=0.0705, skip=0.1476, window=50),
    "codex": RefetchParams(refetch=0.0, skip=0.9781, window=50),
}
#: Formats with no compaction to measure (SWE-agent, synthetic sessions) take Claude
#: Code's fit, the one measured on the most edits.
FALLBACK = "claude-code"


def params_for(fmt: str) -> RefetchParams:
    """The fitted parameters of a recording format (FITTED; FALLBACK's for the others)."""
    return FITTED.get(fmt, FITTED[FALLBACK])


@dataclass
class Decision:
    """What the loop changed at one request: the inserted round (items appended to the
    request's view, output tokens of the read calls, result tokens fetched) and the recorded
    re-reads left out of its response (count, their tokens, their calls' output tokens)."""

    ids: list[int]
    hashes: list[int]
    tokens: list[int]
    round_output: int = 0
    fetched: int = 0
    skipped: int = 0
    skipped_tokens: int = 0
    skipped_output: int = 0


#: The decision of a request the loop leaves as recorded.
NO_CHANGE = Decision([], [], [])


def _unit(seed: int, trace: str, session: str, what: str, block: int) -> float:
    """A uniform draw in [0, 1) keyed by the decision, independent of the replay order."""
    data = f"{seed}\0{trace}\0{session}\0{what}\0{block}".encode()
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class SessionLoop:
    """The loop's state for one replayed session: the session with room for the inserted
    read calls and results (ghost blocks, appended after the recorded ones, entering no
    request until the loop puts them in), and what it has done so far."""

    def __init__(self, trace: str, session: Session, seed: int, params: RefetchParams) -> None:
        self.trace = trace
        self.params = params
        self.seed = seed
        self.original = session
        b = session.blocks
        n_blocks = len(b)
        self.n_blocks = n_blocks
        kind = b["kind"]
        flags = b["flags"].astype(np.int64)
        path = b["path_hash"]
        origin = b["origin"]
        artifact = (flags & Flag.ARTIFACT) != 0
        read_flag = (flags & Flag.PATH_READ) != 0
        result = (
            (kind == Kind.TOOL_RESULT)
            & read_flag
            & ((flags & Flag.ERROR) == 0)
            & ~artifact
            & (path != 0)
        )
        use = (kind == Kind.TOOL_USE) & (path != 0) & (origin >= 0) & ~artifact
        #: Successful recorded read results per file, in history order.
        self.reads: dict[int, list[int]] = {}
        for block in np.flatnonzero(result).tolist():
            self.reads.setdefault(int(path[block]), []).append(block)
        link = b["link"].tolist()
        paths = path.tolist()
        origins = origin.tolist()
        #: Per request: (file, first using call, ghost call, ghost result) of the files its
        #: response uses without reading them, that some earlier read showed.
        self.needs: dict[int, list[tuple[int, int, int, int]]] = {}
        #: Per request: (file, read call, its result) of the reads its response makes.
        self.rereads: dict[int, list[tuple[int, int, int]]] = {}
        ghosts: list[tuple[int, int]] = []  # (the use, the read result copied)
        seen: set[tuple[int, int]] = set()
        read_use = use & read_flag
        for block in np.flatnonzero(use).tolist():
            p, k = paths[block], origins[block]
            if read_use[block]:
                res = link[block]
                if res >= 0 and result[res]:
                    self.rereads.setdefault(k, []).append((p, block, res))
                continue
            if (k, p) in seen:
                continue
            last = self._last_recorded(p, block)
            if last < 0:
                continue
            seen.add((k, p))
            g = n_blocks + 2 * len(ghosts)
            ghosts.append((block, last))
            self.needs.setdefault(k, []).append((p, block, g, g + 1))
        self.session = _with_ghosts(session, ghosts)
        nb = self.session.blocks
        self.first: list[int] = nb["first_request"].tolist()
        self.hidden: list[int] = nb["hidden_from"].tolist()
        self.compacted: list[int] = nb["compacted_at"].tolist()
        #: Content hash and tokens per block: the history's lists once attached.
        self.hash_of: list[int] = []
        self.tokens_of: list[int] = []
        #: Ghost result -> the recorded read result it copies.
        self.source: dict[int, int] = {n_blocks + 2 * i + 1: r for i, (_, r) in enumerate(ghosts)}
        #: Ghost results put in, per file, in the order they entered.
        self.fetched: dict[int, list[int]] = {}
        self.skipped: set[int] = set()
        #: Per request: the files fetched back before its response used them.
        self.refetched: dict[int, set[int]] = {}
        self.events = {e.request for e in session.events}
        self.history: History | None = None
        self.decided = -1

    def _last_recorded(self, path: int, before: int) -> int:
        reads = self.reads.get(path)
        if not reads:
            return -1
        i = bisect_left(reads, before)
        return reads[i - 1] if i else -1

    def attach(self, history: History) -> None:
        """The history the policy replays (of `self.session`): the loop edits its logical
        schedule, which every conversation-keeping policy follows."""
        self.history = history
        self.hash_of, self.tokens_of = history.hashes, history.tokens

    def latest(self, path: int, k: int) -> int:
        """The latest read result of `path` in the logical history of request k as the loop
        changed it (ghosts in, skipped re-reads out), or -1."""
        first, hidden, skipped = self.first, self.hidden, self.skipped
        best = -1
        best_key = (-1, -1)
        for block in reversed(self.reads.get(path, ())):
            if first[block] <= k < hidden[block] and block not in skipped:
                best, best_key = block, (first[block], block)
                break
        for ghost in reversed(self.fetched.get(path, ())):
            if first[ghost] <= k < hidden[ghost]:
                if (first[ghost], -1) > best_key:
                    best = ghost
                break
        return best

    def _recording_holds(self, block: int, k: int) -> bool:
        return self.compacted[self.source.get(block, block)] > k

    def _held(self, view: View, block: int) -> bool:
        """Whether the view sends the block verbatim (same content, same tokens)."""
        try:
            pos = view.ids.index(block)
        except ValueError:
            return False
        return view.hashes[pos] == self.hash_of[block] and view.tokens[pos] == self.tokens_of[block]

    def decide(self, k: int, view: View) -> Decision:
        """The loop's changes at request k, given the view the policy sends for it (once per
        request: a second request call at k changes nothing)."""
        if k == self.decided or self.history is None:
            return NO_CHANGE
        self.decided = k
        needs, rereads = self.needs.get(k), self.rereads.get(k)
        if not needs and not rereads:
            return NO_CHANGE
        out = Decision([], [], [])
        schedule = self.history.logical
        sid, p = self.original.id, self.params
        entering: list[int] = []
        for path, use, ghost_use, ghost_res in needs or ():
            last = self.latest(path, k)
            if last < 0 or not self._recording_holds(last, k):
                continue
            # The draw before the view scan: the same decision, the scan only when it counts.
            if _unit(self.seed, self.trace, sid, "refetch", use) >= p.refetch:
                continue
            if self._held(view, last):
                continue
            leaves = self.hidden[use]
            for g in (ghost_use, ghost_res):
                self.first[g] = k + 1
                self.hidden[g] = leaves
                out.ids.append(g)
                out.hashes.append(self.hash_of[g])
                out.tokens.append(self.tokens_of[g])
            if leaves < len(schedule.leave):
                schedule.leave[leaves].extend((ghost_use, ghost_res))
            entering += (ghost_use, ghost_res)
            self.fetched.setdefault(path, []).append(ghost_res)
            self.refetched.setdefault(k, set()).add(path)
            out.round_output += self.tokens_of[ghost_use]
            out.fetched += self.tokens_of[ghost_res]
        if entering and k + 1 < len(schedule.enter):
            schedule.enter[k + 1][:0] = entering
        for path, use, res in rereads or ():
            prior = self.latest(path, k)
            if prior < 0 or self._recording_holds(prior, k):
                continue
            dropped = self.compacted[self.source.get(prior, prior)]
            if dropped not in self.events or k - dropped >= p.window:
                continue
            if _unit(self.seed, self.trace, sid, "skip", use) >= p.skip:
                continue
            if not self._held(view, prior):
                continue
            for block in (use, res):
                at = self.first[block]
                if at < len(schedule.enter) and block in schedule.enter[at]:
                    schedule.enter[at].remove(block)
                self.skipped.add(block)
            out.skipped += 1
            out.skipped_tokens += self.tokens_of[use] + self.tokens_of[res]
            out.skipped_output += self.tokens_of[use]
        return out


def _with_ghosts(session: Session, ghosts: list[tuple[int, int]]) -> Session:
    """The session with a (read call, read result) pair of blocks appended per ghost, copies
    of the recorded read (call and result) each copies, entering no request."""
    if not ghosts:
        return session
    b = session.blocks
    link = b["link"]
    order: list[int] = []  # the recorded block each new block copies
    for use, res in ghosts:
        call = int(link[res])
        order += (call if call >= 0 else use, res)
    idx = np.array(order, dtype=np.int64)
    n = len(b)
    data = {name: np.concatenate([b[name], b[name][idx]]) for name in b.schema}
    m = len(idx)
    data["first_request"][n:] = NEVER
    data["hidden_from"][n:] = NEVER
    data["compacted_at"][n:] = NEVER
    new = np.arange(n, n + m)
    data["link"][n:] = np.where((new - n) % 2 == 0, new + 1, new - 1)
    uses = np.array([u for u, _ in ghosts], dtype=np.int64)
    data["origin"][n::2] = b["origin"][uses]
    data["origin"][n + 1 :: 2] = -1
    data["msg"][n::2] = b["msg"][uses]
    data["msg"][n + 1 :: 2] = b["msg"][uses]
    data["flags"][n:] &= ~np.uint8(Flag.HUMAN | Flag.ARTIFACT | Flag.UNLOGGED | Flag.STRIPPED)
    # A ghost call names the read tool; an unlinked recorded read copies the using call, so
    # it is marked a read (its size stands in for the read call's).
    data["flags"][n::2] |= np.uint8(Flag.PATH_READ)
    data["flags"][n::2] &= ~np.uint8(Flag.PATH_WRITE)
    return replace(session, blocks=block_columns(data))
