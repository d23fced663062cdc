"""Parameter tuning with Optuna: a policy's best configurations under constraints.

A trial replays every session of the trace set under one configuration, with the loss
proxies, and records the run's figures (simulator/frames.py `overall_summary`: cost,
compactions, overflows, edits, the loss proxies, ... every figure of a run summary); the
objectives are one or more of them and constraints bound others (`overflows=0`: a
configuration that overflows is not a candidate, however cheap). Cost alone is the wrong
question for a compaction threshold: open-loop replay counts what compacting earlier saves
and nothing of what the agent then lacks, so the cheapest buffer is at the edge of any range
(issue 14). Hence several objectives (`--objective cost --objective stale_file_refs`): the
answer is then the Pareto front, every feasible configuration no other beats on all
objectives at once, written as a table and a chart. One objective: Optuna's TPE sampler; two
or more: its NSGA-II (the multi-objective sampler built into Optuna), a generation of
`population` trials at a time. Both steer by the constraints too, and the best reported is
the best *feasible* trial (by the first objective).

The study lives in `DIR/study.db` (SQLite): rerunning the same command adds trials to the
same study. Its name is derived from everything the trials depend on (policy, fixed
parameters, search space, objective, constraints, traces, seed, cache), so changing any
of them starts another study beside it instead of mixing incomparable trials; an explicit
`--study` name with other settings is refused. The sampler is seeded with the seed and
the number of trials already in the study: a run is deterministic, and a continuation
does not replay the first run's random start-up points.
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import polars as pl

from simulator import policy as registry
from simulator import run as service
from simulator.app.sweep import (
    SweepError,
    column_names,
    parse_values,
    row_figures,
    run_settings,
    split_key,
)
from simulator.frames import CELL_FIGURES, policy_entry, rules_versions, trace_entry
from simulator.model import Trace
from simulator.policy import Policy, PolicyError
from simulator.replay import default_prices
from simulator.variants import build_variant, load_variant

if TYPE_CHECKING:
    import optuna  # type: ignore[import-not-found,unused-ignore]

STUDY_FILE = "study.db"
TRIALS_FILE = "trials.parquet"
CHART_FILE = "trials.png"
PARETO_FILE = "pareto.parquet"
PARETO_CHART = "pareto.png"

#: Objective and constraint names -> the figure they read: every figure of a sweep cell
#: (simulator/app/sweep.py CELL_FIGURES: the run summary's, then the re-fetch model's), `cost`
#: for cost_total.
METRICS = {"cost": "cost_total", **{c: c for c in CELL_FIGURES if c != "cost_total"}}
#: Figures that are fractions or dollars (Float64 columns); every other figure is a count.
FLOAT_METRICS = frozenset(
    {"cost"} | {m for m in METRICS if m.endswith(("_share", "_ratio", "_cost"))}
)


class TuneError(ValueError):
    """A bad search space, constraint or study: one line for the user."""


# -- search space and constraints -----------------------------------------------------------


@dataclass(frozen=True)
class Dimension:
    """One tuned parameter: an integer or float range (with an optional step) or a list of
    choices."""

    key: str
    low: float = 0
    high: float = 0
    step: float | None = None
    integer: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.choices:
            index = trial.suggest_categorical(self.key, list(range(len(self.choices))))
            return self.choices[int(index)]
        if self.integer:
            return trial.suggest_int(
                self.key, int(self.low), int(self.high), step=int(self.step or 1)
            )
        return trial.suggest_float(self.key, self.low, self.high, step=self.step)

    def contains(self, value: Any) -> bool:
        """Whether the sampler could propose `value` (used to enqueue the shipped one)."""
        if self.choices:
            return value in self.choices
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        if not self.low <= value <= self.high:
            return False
        if self.integer and value != int(value):
            return False
        step = self.step or (1 if self.integer else None)
        return step is None or math.isclose(
            (value - self.low) / step, round((value - self.low) / step)
        )

    def trial_value(self, value: Any) -> Any:
        """What optuna stores for `value` (a choice is stored by its index)."""
        return self.choices.index(value) if self.choices else value

    def as_dict(self) -> dict[str, Any]:
        if self.choices:
            return {"key": self.key, "choices": list(self.choices)}
        return {
            "key": self.key,
            "low": self.low,
            "high": self.high,
            "step": self.step,
            "integer": self.integer,
        }


_RANGE = re.compile(r"\s*([^:]+):([^:]+)(?::([^:]+))?\s*")


def parse_dimension(text: str) -> Dimension:
    """`KEY=LOW:HIGH[:STEP]` (integers when both ends are) or `KEY=a,b,c` / `KEY=[...]`."""
    scope, key, rest = split_key(text, "--param")
    if scope is not None:
        raise TuneError(f"--param {text!r}: a tuned parameter takes no POLICY: prefix")
    match = _RANGE.fullmatch(rest)
    if match and not rest.strip().startswith("["):
        low_text, high_text, step_text = match.groups()
        try:
            low, high = _number(low_text), _number(high_text)
            step = _number(step_text) if step_text is not None else None
        except ValueError:
            raise TuneError(f"--param {key}: expected LOW:HIGH[:STEP] numbers") from None
        if high <= low:
            raise TuneError(f"--param {key}: HIGH must be above LOW")
        if step is not None and step <= 0:
            raise TuneError(f"--param {key}: STEP must be positive")
        integer = all(isinstance(v, int) for v in (low, high, step) if v is not None)
        return Dimension(key, low, high, step, integer)
    try:
        choices = parse_values(rest)
    except SweepError as exc:
        raise TuneError(f"--param {key}: {exc}") from None
    if len(choices) < 2:
        raise TuneError(f"--param {key}: give a range LOW:HIGH or at least two choices")
    return Dimension(key, choices=tuple(choices))


def _number(text: str) -> int | float:
    """8000, 13_000, 0.5, or a size in k ("8k" is 8000)."""
    cleaned = text.strip().replace("_", "")
    if cleaned[-1:] in ("k", "K"):
        scaled = _number(cleaned[:-1]) * 1000
        return int(scaled) if float(scaled).is_integer() else scaled
    try:
        return int(cleaned)
    except ValueError:
        value = float(cleaned)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class Constraint:
    """`metric OP bound`; violation() is <= 0 exactly when the constraint holds."""

    metric: str
    op: str
    bound: float

    def violation(self, figures: dict[str, Any]) -> float:
        value = figures[self.metric]
        if value is None:
            return math.inf
        v = float(value)
        if self.op == "=":
            return abs(v - self.bound)
        if self.op == "<=":
            return v - self.bound
        return self.bound - v

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


_CONSTRAINT = re.compile(r"\s*([a-z_]+)\s*(<=|>=|==|=)\s*([-+0-9.eE_]+)\s*")


def parse_constraint(text: str) -> Constraint:
    """`overflows=0`, `breaker_trips<=1`, `cache_hit_ratio>=0.8`."""
    match = _CONSTRAINT.fullmatch(text)
    if not match:
        raise TuneError(f"--constraint {text!r}: expected METRIC=VALUE, METRIC<=VALUE or >=")
    metric, op, raw = match.groups()
    _check_metric(metric, "--constraint")
    try:
        bound = float(_number(raw))
    except ValueError:
        raise TuneError(f"--constraint {text!r}: {raw!r} is not a number") from None
    return Constraint(metric, "=" if op == "==" else op, bound)


def _check_metric(name: str, option: str) -> None:
    if name not in METRICS:
        raise TuneError(f"{option} {name!r}: one of {', '.join(METRICS)}")


@dataclass(frozen=True)
class Objective:
    """A figure to minimise, or to maximise (the share of human words kept)."""

    metric: str
    maximize: bool = False

    def __post_init__(self) -> None:
        _check_metric(self.metric, "--objective")

    @property
    def direction(self) -> Literal["minimize", "maximize"]:
        return "maximize" if self.maximize else "minimize"

    def __str__(self) -> str:
        return f"{'max' if self.maximize else 'min'}:{self.metric}"


def parse_objective(text: str, maximize: bool = False) -> Objective:
    """`cost`, `min:stale_file_refs` or `max:human_verbatim_share` (`maximize` for a bare
    name: the --maximize flag)."""
    direction, sep, metric = text.strip().partition(":")
    if not sep:
        return Objective(direction, maximize)
    if direction not in ("min", "max"):
        raise TuneError(f"--objective {text!r}: expected METRIC, min:METRIC or max:METRIC")
    return Objective(metric.strip(), direction == "max")


# -- the study ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneSpec:
    """What is tuned and how: the policy, fixed parameters, space, objectives, constraints."""

    policy: str  # a registered name or a variant .toml file
    dimensions: tuple[Dimension, ...]
    objectives: tuple[Objective, ...] = (Objective("cost"),)
    constraints: tuple[Constraint, ...] = ()
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    cache: str = "auto"
    #: Replay with the re-fetch model (simulator/run.py RunSettings.refetch) or open loop.
    refetch: bool = False
    #: NSGA-II's generation size (several objectives only): how many trials it draws at
    #: random before it breeds from the best; a sampler setting, so not in the study's name.
    population: int = 16

    def __post_init__(self) -> None:
        keys = [d.key for d in self.dimensions]
        if not keys:
            raise TuneError("nothing to tune: give --param KEY=LOW:HIGH")
        if len(set(keys)) != len(keys):
            raise TuneError(f"--param {keys[0]!r}: a parameter is given twice")
        fixed = {k for k, _ in self.params} & set(keys)
        if fixed:
            raise TuneError(f"{sorted(fixed)[0]!r} is both tuned (--param) and fixed (-P)")
        if not self.objectives:
            raise TuneError("no objective: give --objective METRIC")
        metrics = [o.metric for o in self.objectives]
        if len(set(metrics)) != len(metrics):
            raise TuneError(f"--objective {metrics[0]!r}: an objective is given twice")
        if self.population < 2:
            raise TuneError("--population: at least 2")
        try:
            column_names(keys)
        except SweepError as exc:
            raise TuneError(str(exc)) from None

    @property
    def multi(self) -> bool:
        """Several objectives: NSGA-II and a Pareto front."""
        return len(self.objectives) > 1

    @property
    def columns(self) -> dict[str, str]:
        """Tuned parameter -> its column in trials.parquet and pareto.parquet (no dots)."""
        return column_names(d.key for d in self.dimensions)

    def build(self, values: dict[str, Any]) -> Policy:
        """The policy with the fixed parameters, then `values`."""
        params = {**dict(self.params), **values}
        if self.policy.endswith(".toml"):
            return build_variant(load_variant(Path(self.policy)), params)
        return registry.build(self.policy, params)


def check_space(spec: TuneSpec) -> Policy:
    """The policy with the fixed parameters, after checking that every tuned key exists
    (did-you-mean otherwise) and that its declaration accepts both ends of its range and
    every choice: a bad range is one line before the first trial, not a failed study. A
    range over a whole-number parameter must be integral (a float range would propose
    8000.37 tokens)."""
    try:
        base = spec.build({})
        for d in spec.dimensions:
            ends = d.choices or ((int(d.low), int(d.high)) if d.integer else (d.low, d.high))
            for value in ends:
                spec.build({d.key: value})
            declared = type(base).declared.get(d.key)
            if not d.choices and declared is not None and declared.whole and not d.integer:
                raise TuneError(
                    f"--param {d.key}={d.low:g}:{d.high:g}: expected whole numbers"
                    f" ({declared.accepts})"
                )
    except PolicyError as exc:
        raise TuneError(str(exc)) from None
    return base


def figures(frame: pl.DataFrame) -> dict[str, Any]:
    """The tunable figures of a replay (METRICS names)."""
    summary = row_figures(frame).row(0, named=True)
    return {name: summary[column] for name, column in METRICS.items()}


def _settings(spec: TuneSpec, traces: Sequence[tuple[str, Trace]]) -> dict[str, Any]:
    base = spec.build({})
    return {
        "policy": policy_entry(base.spec()),
        "fixed": dict(spec.params),
        "space": [d.as_dict() for d in spec.dimensions],
        "objectives": [str(o) for o in spec.objectives],
        "constraints": [str(c) for c in spec.constraints],
        "seed": spec.seed,
        "cache": spec.cache,
        "refetch": spec.refetch,
        "prices": default_prices().version,
        **rules_versions(),
        "traces": [trace_entry(name, trace) for name, trace in traces],
    }


def default_study_name(spec: TuneSpec, settings: dict[str, Any]) -> str:
    digest = hashlib.sha256(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)).hexdigest()
    label = Path(spec.policy).stem if spec.policy.endswith(".toml") else spec.policy
    return f"{label}-{'-'.join(o.metric for o in spec.objectives)}-{digest[:10]}"


@dataclass
class TuneResult:
    """A study after this run: its trials, the best feasible one and the Pareto front."""

    study: str
    trials: pl.DataFrame
    new_trials: int
    #: The best feasible trial by the first objective.
    best: dict[str, Any] | None
    #: The figures of the policy as shipped (fixed parameters only, nothing tuned).
    baseline: dict[str, Any] = field(default_factory=dict)
    shipped: dict[str, Any] = field(default_factory=dict)
    stale_failed: int = 0
    #: The feasible trials no other feasible trial beats on every objective (`front_frame`).
    front: pl.DataFrame = field(default_factory=pl.DataFrame)


def _sampler_seed(seed: int, existing: int) -> int:
    data = f"{seed}\0{existing}".encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:4], "little")


def tune(
    traces: Sequence[tuple[str, Trace]],
    spec: TuneSpec,
    out: Path,
    trials: int,
    *,
    study_name: str | None = None,
    on_trial: Callable[[int, int], None] | None = None,
) -> TuneResult:
    """Run `trials` more trials of the study in `out/study.db`; return every trial."""
    try:
        import optuna
    except ImportError:
        raise TuneError("tuning needs Optuna: pip install 'ctxsim[tune]'") from None
    base = check_space(spec)
    chosen = run_settings(spec.seed, spec.cache, spec.refetch)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = _settings(spec, traces)
    name = study_name or default_study_name(spec, settings)
    out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(out / STUDY_FILE).resolve()}"
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        load_if_exists=True,
        directions=[o.direction for o in spec.objectives],
    )
    recorded = study.user_attrs.get("ctxsim")
    if recorded is None:
        study.set_user_attr("ctxsim", settings)
    elif recorded != settings:
        raise TuneError(f"study {name!r} in {out / STUDY_FILE} was run with other settings")
    stale = [t.number for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    for number in stale:  # a run killed mid-trial: that trial will never finish
        study.tell(number, state=optuna.trial.TrialState.FAIL)
    existing = len(study.get_trials(deepcopy=False))
    prices = default_prices()
    shipped = {d.key: base.params.get(d.key) for d in spec.dimensions}
    if existing == 0 and all(d.contains(shipped[d.key]) for d in spec.dimensions):
        # The shipped configuration is the first trial: the study starts from what is known.
        study.enqueue_trial({d.key: d.trial_value(shipped[d.key]) for d in spec.dimensions})

    # Optuna 5 reads constraints the trial sets itself; older ones ask a function.
    per_trial = hasattr(optuna.trial.Trial, "set_constraint")

    def constraints(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
        values: Sequence[float] = trial.user_attrs.get("constraints", [math.inf])
        return values

    function = constraints if spec.constraints and not per_trial else None
    seed = _sampler_seed(spec.seed, existing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.multi:
            study.sampler = optuna.samplers.NSGAIISampler(
                population_size=spec.population, seed=seed, constraints_func=function
            )
        else:
            study.sampler = optuna.samplers.TPESampler(seed=seed, constraints_func=function)

    def objective(trial: optuna.Trial) -> float | list[float]:
        values = {d.key: d.suggest(trial) for d in spec.dimensions}
        policy = spec.build(values)
        found = figures(service.rows(traces, policy, chosen, prices))
        trial.set_user_attr("params", values)
        trial.set_user_attr("params_hash", policy.spec().param_hash)
        trial.set_user_attr("figures", found)
        violations = [c.violation(found) for c in spec.constraints]
        trial.set_user_attr("constraints", violations)
        if per_trial:
            for c, v in zip(spec.constraints, violations, strict=True):
                trial.set_constraint(str(c), v)
        scores = []
        for o in spec.objectives:
            value = found[o.metric]
            if value is None:
                raise TuneError(f"objective {o.metric!r} is null (unpriced calls, or no rows?)")
            scores.append(float(value))
        return scores if spec.multi else scores[0]

    done = 0

    def callback(_study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        nonlocal done
        done += 1
        if on_trial is not None:
            on_trial(done, trials)

    if trials:
        study.optimize(objective, n_trials=trials, callbacks=[callback], catch=())
    frame = trials_frame(study.get_trials(deepcopy=False), spec)
    baseline = figures(service.rows(traces, base, chosen, prices))
    return TuneResult(
        study=name,
        trials=frame,
        new_trials=done,
        best=best_trial(frame, spec),
        baseline=baseline,
        shipped=shipped,
        stale_failed=len(stale),
        front=front_frame(frame, spec),
    )


def _better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[Objective]) -> bool:
    """`a` is at least as good as `b` on every objective and better on one."""
    pairs = list(zip(a, b, objectives, strict=True))
    if any(_better(y, x, o.maximize) for x, y, o in pairs):
        return False
    return any(_better(x, y, o.maximize) for x, y, o in pairs)


def pareto_mask(points: Sequence[Sequence[float]], objectives: Sequence[Objective]) -> list[bool]:
    """For each point, whether no other point dominates it (equal points all stay)."""
    return [
        not any(dominates(q, p, objectives) for j, q in enumerate(points) if j != i)
        for i, p in enumerate(points)
    ]


def trials_frame(trials: Sequence[optuna.trial.FrozenTrial], spec: TuneSpec) -> pl.DataFrame:
    """One row per trial: number, state, the tuned values (a column each, `column_name`),
    `objective` (the first objective's value), every figure, whether it meets the
    constraints, the best feasible first objective up to it (one objective only) and
    whether it is on the Pareto front of the feasible trials. No times: the same study
    gives the same bytes."""
    rows: list[dict[str, Any]] = []
    best: float | None = None
    first = spec.objectives[0]
    columns = spec.columns
    for t in sorted(trials, key=lambda t: t.number):
        found: dict[str, Any] = t.user_attrs.get("figures", {})
        values: dict[str, Any] = t.user_attrs.get("params", {})
        violations: list[float] = t.user_attrs.get("constraints", [])
        complete = t.state.name == "COMPLETE"
        feasible = complete and all(v <= 0 for v in violations)
        objective = t.values[0] if complete and t.values else None
        improves = best is None or (
            objective is not None and _better(objective, best, first.maximize)
        )
        if feasible and objective is not None and improves:
            best = objective
        row = {"trial": t.number, "state": t.state.name.lower()}
        row.update({columns[d.key]: values.get(d.key) for d in spec.dimensions})
        row["objective"] = objective
        row.update({name: found.get(name) for name in METRICS})
        row["feasible"] = feasible
        row["best_so_far"] = best if complete and not spec.multi else None
        row["params_hash"] = t.user_attrs.get("params_hash")
        rows.append(row)
    on_front = _front_flags(rows, spec)
    for row, flag in zip(rows, on_front, strict=True):
        row["pareto"] = flag
    schema: dict[str, Any] = {"trial": pl.Int64, "state": pl.String}
    for d in spec.dimensions:
        schema[columns[d.key]] = _dimension_dtype(d, [r[columns[d.key]] for r in rows])
    schema["objective"] = pl.Float64
    for name in METRICS:
        schema[name] = pl.Float64 if name in FLOAT_METRICS else pl.Int64
    schema.update({"feasible": pl.Boolean, "best_so_far": pl.Float64, "params_hash": pl.String})
    schema["pareto"] = pl.Boolean
    for d in spec.dimensions:
        column = columns[d.key]
        if schema[column] == pl.String:
            for r in rows:
                if not isinstance(r[column], str | None):
                    r[column] = orjson.dumps(r[column]).decode()
    return pl.DataFrame(rows, schema=schema, orient="row")


def _front_flags(rows: list[dict[str, Any]], spec: TuneSpec) -> list[bool]:
    """Per trial row: feasible, every objective known, and not dominated by another such."""
    metrics = [o.metric for o in spec.objectives]
    candidates = [
        i for i, r in enumerate(rows) if r["feasible"] and all(r[m] is not None for m in metrics)
    ]
    points = [[float(rows[i][m]) for m in metrics] for i in candidates]
    flags = [False] * len(rows)
    for i, keep in zip(candidates, pareto_mask(points, spec.objectives), strict=True):
        flags[i] = keep
    return flags


def front_frame(trials: pl.DataFrame, spec: TuneSpec) -> pl.DataFrame:
    """The Pareto front (pareto.parquet): per trial on it, its number, the tuned values,
    each objective and the params hash, ordered by the first objective (best first) then
    trial number."""
    metrics = [o.metric for o in spec.objectives]
    columns = [spec.columns[d.key] for d in spec.dimensions]
    front = trials.filter(pl.col("pareto")).select(["trial", *columns, *metrics, "params_hash"])
    return front.sort([metrics[0], "trial"], descending=[spec.objectives[0].maximize, False])


def _dimension_dtype(d: Dimension, values: list[Any]) -> Any:
    if not d.choices:
        return pl.Int64 if d.integer else pl.Float64
    kinds = {type(v) for v in d.choices}
    if kinds <= {bool}:
        return pl.Boolean
    if kinds <= {int}:
        return pl.Int64
    if kinds <= {int, float}:
        return pl.Float64
    return pl.String


def best_trial(frame: pl.DataFrame, spec: TuneSpec) -> dict[str, Any] | None:
    """The best feasible trial by the first objective (the lowest number among equals)."""
    feasible = frame.filter(pl.col("feasible"))
    if feasible.is_empty():
        return None
    ordered = feasible.sort(["objective", "trial"], descending=[spec.objectives[0].maximize, False])
    row: dict[str, Any] = ordered.row(0, named=True)
    return row
