"""A session's append-only history, indexed by request: which blocks enter and leave.

Two visibilities (simulator/model.py): the *logical* history (every block the agent has
seen, recorded compactions kept as events only) that policies project, and the
*as-recorded* context (what the recording agent really sent, its own compactions and
summaries included). Both are intervals per block, so entering and leaving per request
are two sorted index arrays, computed once per session, when first asked for: a policy
uses one of the two.
"""

from __future__ import annotations

import itertools
from functools import cached_property

import numpy as np
import numpy.typing as npt

from simulator.model import NEVER, Flag, Session


class Schedule:
    """Blocks entering and leaving at each request under one visibility."""

    def __init__(self, start: npt.NDArray[np.int32], end: npt.NDArray[np.int32], n: int):
        live = start < end
        s = np.where(live, start, NEVER).astype(np.int64)
        e = np.where(live, end, NEVER).astype(np.int64)
        self._enter_order = np.argsort(s, kind="stable")
        self._leave_order = np.argsort(e, kind="stable")
        self._enter_bounds = np.searchsorted(s[self._enter_order], np.arange(n + 2))
        self._leave_bounds = np.searchsorted(e[self._leave_order], np.arange(n + 2))
        enter, leave = self._enter_order.tolist(), self._leave_order.tolist()
        self.enter = [enter[a:b] for a, b in self._pairs(self._enter_bounds)]
        self.leave = [leave[a:b] for a, b in self._pairs(self._leave_bounds)]

    @staticmethod
    def _pairs(bounds: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
        b = bounds.tolist()
        return list(itertools.pairwise(b))


class History:
    """Per-request entering/leaving blocks of a session, for both visibilities."""

    def __init__(self, session: Session) -> None:
        b = session.blocks
        self.session = session
        self.hashes: list[int] = b["hash"].astype(np.uint64).tolist()
        self.tokens: list[int] = b["tokens"].tolist()

    @cached_property
    def logical(self) -> Schedule:
        """What policies project: recorded compaction artifacts never enter."""
        b = self.session.blocks
        first = b["first_request"]
        artifact = (b["flags"] & Flag.ARTIFACT) != 0
        return Schedule(first, np.where(artifact, first, b["hidden_from"]), self.session.n_requests)

    @cached_property
    def recorded(self) -> Schedule:
        """What the recording sent: blocks leave where its own compactions cut them."""
        b = self.session.blocks
        end = np.minimum(b["hidden_from"], b["compacted_at"])
        return Schedule(b["first_request"], end, self.session.n_requests)
