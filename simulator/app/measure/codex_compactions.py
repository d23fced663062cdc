"""Check the Codex presets (policies/peers/codex.py `PRESETS`) on the recorded Codex
compactions: does the matching preset compact within one request of the recording, and is
the context after within 15% of the recorded one?

Run: ``.venv/bin/python -m simulator.app.measure.codex_compactions ../shared/traces/codex``
(prints the table; tests/policies/peers/test_codex_compactions.py asserts it).

The replay is `codex`'s, as `ctxsim run --policy codex` makes it: each session under the
preset of its recorded version. The i-th automatic compaction a session recorded is paired
with the i-th compaction the preset makes when it replays that session (rows of stage
``compact``); the recorded request is the first one whose context is the compacted one
(CompactionEvent.request), the
simulated one is the request whose main call the preset sent compacted. Manual (/compact)
compactions are listed, not paired: no automatic rule makes them. Below the table: the
sessions (with or without a recorded compaction) where the preset compacts a different
number of times than the recording (`unmatched`).

That replay is free-running: each compaction the preset makes moves the next one (its
summary's size is a draw). ``--one-at-a-time`` checks each recorded automatic compaction
on its own, as the Claude Code trigger tables do: the session is replayed with the
recording's earlier automatic compactions made where they happened, with their summaries
(the preset's ``replay_recorded_before``), and the preset's first compaction after the
previous recorded one is paired with it (`single_rows`).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from simulator import policy as registry
from simulator.model import CompactionEvent, Session, Trace
from simulator.replay import ReplayOptions, replay
from traces.load import load


@dataclass(frozen=True)
class Row:
    """One recorded compaction against the preset's replay of its session."""

    folder: str
    version: str
    trigger: str
    recorded_request: int
    recorded_after: int  # recorded context of the first compacted request
    sim_request: int  # -1: the preset did not compact (that many times)
    sim_after: int
    session_requests: int  # the recorded session's requests

    @property
    def offset(self) -> int:
        """Requests between the recorded compaction and the preset's; one the preset never
        makes counts as made after the session's last request."""
        if self.sim_request < 0:
            return self.session_requests - self.recorded_request
        return abs(self.sim_request - self.recorded_request)

    @property
    def within_one(self) -> bool:
        return self.sim_request >= 0 and abs(self.sim_request - self.recorded_request) <= 1

    @property
    def after_within_15(self) -> bool:
        return self.sim_request >= 0 and abs(self.sim_after - self.recorded_after) <= (
            0.15 * self.recorded_after
        )


@functools.cache
def _loaded(src: Path) -> tuple[tuple[str, str, Trace], ...]:
    """(source folder, name, trace) of every rollout under `src`, compiled once per process:
    the fit replays them at every point of its grid, and the replay leaves them as they
    were."""
    out = []
    for item in load([src], lenient=True):
        assert item.trace is not None
        parts = item.label.split("/")
        folder = parts[1] if parts[0] == src.name and len(parts) > 2 else parts[0]
        out.append((folder, item.name.removesuffix(".ctxt"), item.trace))  # as runs name it
    return tuple(out)


def rows(src: Path, overrides: dict[str, Any] | None = None, seed: int = 0) -> list[Row]:
    """Every recorded compaction under `src` against the matching preset's replay (with
    `overrides` of its parameters, for the fit) under the run seed `seed`."""
    out: list[Row] = []
    for folder, name, trace in _loaded(src):
        for session in trace.sessions:
            if not session.events:
                continue
            sim = _simulated(name, trace, session.id, overrides or {}, seed)
            seen = {"auto": 0, "manual": 0}
            for e in session.events:
                kind = "manual" if e.trigger == "manual" else "auto"
                i = seen[kind]
                seen[kind] += 1
                paired = sim[kind][i] if i < len(sim[kind]) else None
                out.append(_row(folder, session, e, paired))
    return out


def single_rows(src: Path, overrides: dict[str, Any] | None = None, seed: int = 0) -> list[Row]:
    """Every recorded automatic compaction under `src`, one at a time: the matching preset's
    replay of its session from the recorded state before it (the recording's earlier
    automatic compactions replayed as recorded), paired with the preset's first compaction
    after the previous recorded one (the session's start for the first)."""
    out: list[Row] = []
    for folder, name, trace in _loaded(src):
        for session in trace.sessions:
            earlier = -1
            for e in session.events:
                if e.trigger == "manual":
                    continue
                params = {**(overrides or {}), "replay_recorded_before": e.request}
                sim = _simulated(name, trace, session.id, params, seed)["auto"]
                paired = next(((k, after) for k, after in sim if k > earlier), None)
                out.append(_row(folder, session, e, paired))
                earlier = e.request
    return out


def _row(
    folder: str, session: Session, event: CompactionEvent, paired: tuple[int, int] | None
) -> Row:
    """A recorded compaction and the preset's (request, context after) paired with it."""
    context = session.recorded_context()
    recorded_after = int(context[event.request]) if event.request < len(context) else -1
    return Row(
        folder,
        session.client.removeprefix("codex").strip(),
        event.trigger,
        event.request,
        recorded_after,
        paired[0] if paired else -1,
        paired[1] if paired else -1,
        session.n_requests,
    )


def unmatched(src: Path) -> list[tuple[str, str, int, int]]:
    """Sessions under `src` (every one, not only those with a recorded compaction) where the
    matching preset makes a different number of automatic compactions than the recording:
    (folder, cli version, recorded, simulated). A preset that fires where Codex did not
    would not show in the paired table."""
    out: list[tuple[str, str, int, int]] = []
    for folder, name, trace in _loaded(src):
        for session in trace.sessions:
            version = session.client.removeprefix("codex").strip()
            recorded = sum(e.trigger != "manual" for e in session.events)
            made = len(_simulated(name, trace, session.id, {})["auto"])
            if made != recorded:
                out.append((folder, version, recorded, made))
    return out


def _simulated(
    name: str, trace: Trace, session_id: str, overrides: dict[str, Any], seed: int = 0
) -> dict[str, list[tuple[int, int]]]:
    """(request, context of its main call) of each compaction the preset makes: its own
    ("auto", stage ``compact``) and the replayed /compact commands ("manual")."""
    policy = registry.build("codex", overrides)  # each session under its version's preset
    one = Trace(
        trace.format, trace.source_digest, [s for s in trace.sessions if s.id == session_id]
    )
    frame = replay([(name, one)], policy, ReplayOptions(seed=seed))
    main = frame.filter(pl.col("kind") == "request")
    after = dict(zip(main["request"].to_list(), main["context_tokens"].to_list(), strict=True))
    out: dict[str, list[tuple[int, int]]] = {}
    for kind, stage in (("auto", "compact"), ("manual", "manual")):
        made = frame.filter(pl.col("stage") == stage)["request"].to_list()
        out[kind] = [(k, int(after.get(k, -1))) for k in made]
    return out


def choose(scores: dict[float, tuple[int, int]]) -> float:
    """The fitted value among `scores` (value -> (compactions within one request, their total
    offset in requests)): the most within one request; among those, the least total offset
    (a compaction two requests off is nearer than one six off, which the count alone cannot
    tell); among those, the middle value, the lower of two."""
    top = max(hits for hits, _ in scores.values())
    nearest = min(offset for hits, offset in scores.values() if hits == top)
    tied = sorted(v for v, (hits, offset) in scores.items() if (hits, offset) == (top, nearest))
    return tied[(len(tied) - 1) // 2]


def fit(
    src: Path, name: str, grid: list[float], seed: int = 0, *, single: bool = False
) -> dict[str, tuple[float, int, int, int]]:
    """Leave-one-source-out fit of the preset parameter `name` (0.118+:
    ``reasoning_estimate_factor``) under the run seed `seed`: for each held-out folder, the
    grid value `choose` takes on the automatic compactions of the other folders, and what it
    gives on the held-out folder: folder -> (value, within one request there, context after
    within 15% there, automatic compactions there). Key "all": the fit on every folder.
    With `single`, on the one-at-a-time rows (`single_rows`)."""
    measure = single_rows if single else rows
    found = {f: [r for r in measure(src, {name: f}, seed) if r.trigger != "manual"] for f in grid}
    folders = sorted({r.folder for r in found[grid[0]]})
    out: dict[str, tuple[float, int, int, int]] = {}
    for held in [*folders, "all"]:
        scores = {}
        for f in grid:
            fitted = [r for r in found[f] if r.folder != held]
            scores[f] = (sum(r.within_one for r in fitted), sum(r.offset for r in fitted))
        best = choose(scores)
        there = [r for r in found[best] if r.folder == held or held == "all"]
        hits = sum(r.within_one for r in there)
        out[held] = (best, hits, sum(r.after_within_15 for r in there), len(there))
    return out


def table(found: list[Row]) -> str:
    lines = [
        "| folder | cli | trigger | recorded k | sim k | within 1 | recorded after | sim after"
        " | within 15% |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in found:
        lines.append(
            f"| {r.folder} | {r.version} | {r.trigger} | {r.recorded_request} | {r.sim_request}"
            f" | {'yes' if r.within_one else 'no'} | {r.recorded_after:,} | {r.sim_after:,}"
            f" | {'yes' if r.after_within_15 else 'no'} |"
        )
    auto = [r for r in found if r.trigger != "manual"]
    if auto:
        one = sum(r.within_one for r in auto) / len(auto)
        after = sum(r.after_within_15 for r in auto) / len(auto)
        lines.append(
            f"\nautomatic: {len(auto)}; within one request: {one:.0%}; after within 15%:"
            f" {after:.0%}"
        )
    return "\n".join(lines)


def held_out(found: dict[str, tuple[float, int, int, int]]) -> tuple[int, int, int]:
    """(within one request, after within 15%, compactions) summed over the held-out folders
    of one `fit`."""
    folds = [v for held, v in found.items() if held != "all"]
    return sum(v[1] for v in folds), sum(v[2] for v in folds), sum(v[3] for v in folds)


def main(argv: list[str]) -> int:
    """The table, or with ``--fit`` the leave-one-source-out fit; ``--seeds N`` repeats the
    fit under run seeds 0..N-1. The preset draws each summary's size from the session's
    seeded rng, and that size moves the next compaction, so one seed's count is one draw:
    the mean over seeds is the figure to quote. ``--one-at-a-time``: both on the rows of
    `single_rows`."""
    if len(argv) < 1 or not Path(argv[0]).is_dir():
        print(
            "usage: codex_compactions TRACES [--one-at-a-time] [--fit [--seeds N]]",
            file=sys.stderr,
        )
        return 2
    src = Path(argv[0])
    single = "--one-at-a-time" in argv
    if "--fit" in argv:
        seeds = int(argv[argv.index("--seeds") + 1]) if "--seeds" in argv else 1
        grid = [round(1.0 + 0.05 * i, 2) for i in range(13)]
        totals = []
        for seed in range(seeds):
            found = fit(src, "reasoning_estimate_factor", grid, seed, single=single)
            for held, (value, hit, after, n) in found.items():
                print(
                    f"seed {seed} {held}: reasoning_estimate_factor {value}: within one request"
                    f" {hit} of {n}, context after within 15% {after} of {n}"
                )
            totals.append(held_out(found))
            hit, after, n = totals[-1]
            print(f"seed {seed} held out: within one request {hit} of {n}, after {after} of {n}")
        if seeds > 1:
            n = totals[0][2]
            hits = sum(t[0] for t in totals) / seeds
            afters = sum(t[1] for t in totals) / seeds
            print(
                f"held out over {seeds} seeds: within one request {hits:.1f} of {n}"
                f" ({hits / n:.1%}), after within 15% {afters:.1f} of {n} ({afters / n:.1%})"
            )
        return 0
    print(table(single_rows(src) if single else rows(src)))
    if single:
        return 0
    others = unmatched(src)
    print(f"sessions where the preset compacts a different number of times: {len(others)}")
    for folder, version, recorded, made in others:
        print(f"  {folder} {version}: recorded {recorded}, preset {made}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
