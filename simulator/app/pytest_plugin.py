"""`ctxsim_replay`: a pytest fixture to assert on a replay in a project's own tests.

Installed with ctxsim (entry point `pytest11`), so a test only asks for it::

    def test_my_policy_keeps_the_cache(ctxsim_replay):
        base = ctxsim_replay("tests/traces", policy="as-recorded")
        mine = ctxsim_replay("tests/traces", policy="my-policy", params={"keep": 5})
        assert mine.summary["overflows"] == 0
        assert mine.summary["cost_total"] <= 1.02 * base.summary["cost_total"]

A replay gives what `ctxsim run` writes, as polars frames: `requests` (one row per call,
loss proxies included), `sessions` and `summary` (the run-summary figures of
reports/METRICS.md over all its rows); `write(dir)` saves the three run files, so
`ctxsim compare` or `ctxsim report` can read them. Nothing is read from or written to the
user's compile cache. This module imports only pytest at load time: a plugin that every
pytest run of an environment with ctxsim loads must not slow it down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import polars as pl

    from simulator.frames import RunOutputs
    from simulator.model import Trace


@dataclass(frozen=True)
class Replay:
    """One policy replayed over some traces: the run's rows and figures."""

    outputs: RunOutputs

    @property
    def requests(self) -> pl.DataFrame:
        return self.outputs.requests

    @property
    def sessions(self) -> pl.DataFrame:
        return self.outputs.sessions

    @property
    def summary(self) -> dict[str, Any]:
        """The run-summary figures (SUMMARY_COLUMNS of simulator/frames.py)."""
        from simulator.frames import overall_summary

        return overall_summary(self.requests)

    def write(self, out: Path) -> Path:
        """Save requests.parquet, sessions.parquet and manifest.json under `out`."""
        from simulator.app.outputs import write

        write(self.outputs, out)
        return out


TraceInput = str | Path | Sequence[str | Path] | Sequence[tuple[str, "Trace"]]


def _named(src: TraceInput, lenient: bool) -> list[tuple[str, Trace]]:
    """(name, trace) pairs from paths (files or directories) or given as they are."""
    from traces.load import load

    items: list[Any] = [src] if isinstance(src, str | Path) else list(src)
    if items and all(isinstance(i, tuple) for i in items):
        return [(str(name), trace) for name, trace in items]
    paths = [Path(i) for i in items]
    named: dict[str, Trace] = {}
    for item in load(paths, lenient=lenient, cache=None):
        named.setdefault(item.name.removesuffix(".ctxt"), item.trace)
    if not named:
        raise ValueError(f"no trace found in {', '.join(str(p) for p in paths)}")
    return list(named.items())


def replay_run(
    src: TraceInput,
    policy: str = "as-recorded",
    params: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    cache: str = "auto",
    lenient: bool = False,
) -> Replay:
    """Replay `src` under one policy exactly as `ctxsim run` does (the same run service,
    simulator/run.py: same rows, same bytes)."""
    from simulator import run as service
    from simulator.variants import build_named

    traces = _named(src, lenient)
    built = build_named(policy, params or {})  # a name or a variant .toml, as `-P` parses
    settings = service.RunSettings(seed=seed, cache=cache, lenient=lenient)
    return Replay(service.run(traces, [built], settings))


@pytest.fixture
def ctxsim_replay() -> Callable[..., Replay]:
    """`ctxsim_replay(src, policy="as-recorded", params=None, *, seed=0, cache="auto",
    lenient=False)`: replay traces (paths, or (name, Trace) pairs) and return a Replay."""
    return replay_run
