"""The run service: compiled traces and policies in, a run's rows and files out.

One way through the program. `ctxsim run`, the `ctxsim_replay` pytest fixture, the Python API
(simulator/app/api.py), sweeps and tuning all replay through `rows` (one policy, priced, with the
loss proxies when asked) and `run` (every policy, then the run's outputs), so a request
replayed by any of them gives the same row. The service takes traces already compiled and
policies already built: reading files is the application's part (traces/, the CLI, the API).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from simulator.frames import (
    RowParts,
    RunOutputs,
    bill_failed,
    build_run,
)
from simulator.loss import replay_with_loss
from simulator.model import Trace
from simulator.policy import Policy
from simulator.pricing import PriceBook
from simulator.replay import ReplayOptions, default_prices, edit_frame, replay

NamedTraces = Sequence[tuple[str, Trace]]
#: Wraps the (policy index, trace) units of a run, e.g. to show a progress bar.
Progress = Callable[[list[tuple[int, tuple[str, Trace]]]], Iterable[tuple[int, tuple[str, Trace]]]]


@dataclass(frozen=True)
class RunSettings:
    """What a run depends on beside its traces and policies (all of it in the manifest)."""

    seed: int = 0
    cache: str = "auto"  # the cache model: "auto" (by provider), "anthropic", "openai", ...
    lenient: bool = False  # recorded in the manifest: whether damaged lines were skipped
    #: The semi-closed loop (simulator/refetch.py): dropped content the agent uses again is
    #: fetched back in an inserted round; off, the open loop (DESIGN.md section 3).
    refetch: bool = False

    @property
    def options(self) -> ReplayOptions:
        return ReplayOptions(cache=self.cache, seed=self.seed, refetch=self.refetch)


def rows(
    traces: NamedTraces,
    policy: Policy,
    settings: RunSettings | None = None,
    prices: PriceBook | None = None,
    *,
    loss: bool = True,
    edits: list[Any] | None = None,
) -> pl.DataFrame:
    """Every call of every session under `policy`, priced; with the loss proxies unless
    `loss` is false (sweeps and tuning read cost and events only); the policy's edits
    appended to `edits` when given (simulator/replay.py EDIT_SCHEMA)."""
    options = (settings or RunSettings()).options
    book = prices or default_prices()
    if loss:
        frame = replay_with_loss(list(traces), policy, options, book, edits)
    else:
        frame = replay(list(traces), policy, options, book, edits=edits)
    return bill_failed(frame)  # a call above the window is refused, not billed


def run(
    traces: NamedTraces,
    policies: Sequence[Policy],
    settings: RunSettings | None = None,
    prices: PriceBook | None = None,
    progress: Progress | None = None,
) -> RunOutputs:
    """Replay every trace under every policy: the run's frames and the bytes of its files
    (requests.parquet, sessions.parquet, edits.parquet, manifest.json), not yet written.

    One unit of work per policy and trace, so `progress` can show a long run moving."""
    chosen = settings or RunSettings()
    book = prices or PriceBook()
    units = [(i, item) for i in range(len(policies)) for item in traces]
    # Handed over to build_run, which frees each part as it moves it (frames.RowParts).
    frames = RowParts()
    edits: list[list[Any]] = [[] for _ in policies]
    replayed = set()
    for i, item in progress(units) if progress is not None else units:
        frames.add(rows([item], policies[i], chosen, book, edits=edits[i]))
        replayed.add(i)
    for i, policy in enumerate(policies):
        if i not in replayed:  # no trace: its rows are an empty frame of the schema
            frames.add(rows([], policy, chosen, book))
    return build_run(
        frames,
        [p.spec() for p in policies],
        list(traces),
        seed=chosen.seed,
        cache=chosen.cache,
        prices_version=book.version,
        lenient=chosen.lenient,
        refetch=chosen.refetch,
        edits=[edit_frame(e, p) for e, p in zip(edits, policies, strict=True)],
        prices=book,
    )
