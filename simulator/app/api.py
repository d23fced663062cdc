"""ctxsim from Python (a notebook, a script): load traces, replay them under policies, read
the polars frames, write a run directory. The same run service as `ctxsim run`
(simulator/run.py), so the same inputs give the same rows and the same bytes::

    from simulator.app import api

    traces = api.load(["~/.claude/projects/-work-app"], lenient=True)
    run = api.replay(traces, ["as-recorded", "claude-code",
                              ("claude-code", {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": 60})])
    run.requests          # one row per simulated call (reports/METRICS.md)
    run.sessions          # one row per session and policy
    run.summary           # one row per policy: cost, recorded cost, compactions, ...
    api.write(run, "out/pct-60")   # requests.parquet, sessions.parquet, manifest.json

Like the CLI, this module wires readers and policies together; the core never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from simulator import run as service
from simulator.app import outputs
from simulator.frames import RunOutputs, policy_summary
from simulator.model import Trace
from simulator.policy import Policy
from simulator.variants import build_named

#: A policy as the API takes it: a built Policy, a registered name or a variant .toml file,
#: or (name, parameters) with parameters as `-P` takes them ("8k", "1h", true/false).
PolicyInput = Policy | str | Path | tuple[str | Path, dict[str, Any]]


@dataclass(frozen=True)
class Run:
    """A replayed run: its frames, and the exact bytes `write` saves."""

    outputs: RunOutputs

    @property
    def requests(self) -> pl.DataFrame:
        return self.outputs.requests

    @property
    def sessions(self) -> pl.DataFrame:
        return self.outputs.sessions

    @property
    def summary(self) -> pl.DataFrame:
        """One row per policy spec: the run summary's figures (reports/METRICS.md)."""
        return policy_summary(self.outputs.requests)

    @property
    def manifest(self) -> dict[str, Any]:
        return self.outputs.manifest


def load(
    paths: Sequence[str | Path], *, lenient: bool = False, cache: bool = True
) -> list[tuple[str, Trace]]:
    """(name, trace) for every trace under `paths` (files, session directories, projects
    trees), compiled or taken from the compile cache, named as `ctxsim run` names them.
    Bad input raises traces.errors.TraceError naming file and line (`lenient` skips and
    counts damaged lines instead); two different traces under one name, NameClash."""
    from traces.cache import CompileCache, default_root
    from traces.load import load as load_paths
    from traces.load import named_traces

    compile_cache = CompileCache(default_root()) if cache else None
    expanded = [Path(p).expanduser() for p in paths]
    return named_traces(load_paths(expanded, lenient=lenient, cache=compile_cache))


def policy(spec: PolicyInput) -> Policy:
    """A built policy from any PolicyInput (parameters checked as `-P` checks them)."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, tuple):
        name, params = spec
        return build_named(str(name), params)
    return build_named(str(spec), {})


def replay(
    traces: Sequence[tuple[str, Trace]],
    policies: Sequence[PolicyInput],
    *,
    seed: int = 0,
    cache: str = "auto",
    lenient: bool = False,
    refetch: bool = False,
) -> Run:
    """Replay every trace under every policy (`cache`: the prompt-cache model, "auto" by
    each model's provider; `lenient` is recorded in the manifest; `refetch`: the
    semi-closed loop of simulator/refetch.py, off for the open loop)."""
    built = [policy(p) for p in policies]
    settings = service.RunSettings(seed=seed, cache=cache, lenient=lenient, refetch=refetch)
    return Run(service.run(traces, built, settings))


def write(run: Run, out: str | Path) -> Path:
    """Save the run's files under `out` (created if needed), each written atomically; `ctxsim
    report OUT` and `ctxsim compare` read the directory."""
    target = Path(out).expanduser()
    outputs.write(run.outputs, target)
    return target
