"""Tuning (simulator/tune.py, `ctxsim tune`): a seeded study is deterministic, a rerun
continues it, constraints decide the best trial, and errors are one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from simulator import tune as tn
from simulator.cli import main
from traces.load import load_all, units

optuna = pytest.importorskip("optuna")

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples"
BUFFER = "autocompact.buffer_tokens"
POLICY = "claude-code@2.1.88"


@pytest.fixture(scope="module")
def samples() -> list[tuple[str, Any]]:
    return [(item.name.removesuffix(".ctxt"), item.trace) for item in load_all(units([SAMPLES]))]


def spec(*constraints: str, seed: int = 5, high: int = 60_000) -> tn.TuneSpec:
    return tn.TuneSpec(
        policy=POLICY,
        dimensions=(tn.parse_dimension(f"{BUFFER}=1000:{high}:500"),),
        constraints=tuple(tn.parse_constraint(c) for c in constraints),
        seed=seed,
    )


def test_dimensions_and_constraints_parse() -> None:
    d = tn.parse_dimension(f"{BUFFER}=1000:60000:500")
    assert (d.low, d.high, d.step, d.integer) == (1000, 60000, 500, True)
    assert d.contains(13_000) and not d.contains(13_250) and not d.contains(70_000)
    f = tn.parse_dimension("snip.trigger_fraction=0.5:0.95")
    assert (f.integer, f.step) == (False, None)
    c = tn.parse_dimension("cache.ttl=5m,1h")
    assert c.choices == ("5m", "1h")
    assert tn.parse_constraint("overflows=0") == tn.Constraint("overflows", "=", 0.0)
    assert tn.parse_constraint("cache_hit_ratio >= 0.8").violation({"cache_hit_ratio": 0.9}) < 0
    assert tn.parse_constraint("breaker_trips<=1").violation({"breaker_trips": 2}) == 1
    with pytest.raises(tn.TuneError, match="one of cost"):
        tn.parse_constraint("dollars=0")
    with pytest.raises(tn.TuneError, match="HIGH must be above LOW"):
        tn.parse_dimension(f"{BUFFER}=5:1")
    with pytest.raises(tn.TuneError, match="both tuned"):
        tn.TuneSpec(POLICY, (d,), params=((BUFFER, 1),))


def test_a_seeded_study_is_deterministic(tmp_path: Path, samples) -> None:
    first = tn.tune(samples, spec("overflows=0"), tmp_path / "a", 8)
    second = tn.tune(samples, spec("overflows=0"), tmp_path / "b", 8)
    assert first.study == second.study
    assert first.trials.equals(second.trials)
    assert first.best is not None and first.best == second.best
    # The shipped value is the first trial, so the best is never worse than it.
    assert first.trials.row(0, named=True)[BUFFER] == 13_000
    assert first.best["objective"] <= first.baseline["cost"]
    assert first.best["objective"] == first.trials.filter(pl.col("feasible"))["objective"].min()
    other_seed = tn.tune(samples, spec("overflows=0", seed=6), tmp_path / "c", 8)
    assert other_seed.study != first.study
    assert other_seed.trials[BUFFER].to_list() != first.trials[BUFFER].to_list()


def test_a_rerun_continues_the_same_study(tmp_path: Path, samples) -> None:
    first = tn.tune(samples, spec(), tmp_path, 5)
    again = tn.tune(samples, spec(), tmp_path, 4)
    assert again.study == first.study
    assert (again.new_trials, again.trials.height) == (4, 9)
    assert again.trials["trial"].to_list() == list(range(9))
    assert again.trials.head(5).equals(first.trials)
    # The continuation draws new points rather than repeating the first run's.
    assert set(again.trials[BUFFER][5:]) - set(first.trials[BUFFER])
    storage = f"sqlite:///{tmp_path / tn.STUDY_FILE}"
    assert len(optuna.load_study(study_name=first.study, storage=storage).trials) == 9


def test_constraints_decide_the_best_trial(tmp_path: Path, samples) -> None:
    """On the samples one compaction is cheapest; asking for at least two (which takes a
    buffer above about 60,000) makes those trials infeasible, and the best is the cheapest
    feasible one."""
    free = tn.tune(samples, spec(seed=1, high=90_000), tmp_path / "free", 12)
    bound = tn.tune(samples, spec("compactions>=2", seed=1, high=90_000), tmp_path / "bound", 12)
    assert free.best is not None and bound.best is not None
    assert free.best["compactions"] == 1
    assert bound.best["compactions"] >= 2
    assert bound.best["objective"] > free.best["objective"]
    trials = bound.trials
    assert trials.filter(~pl.col("feasible")).height > 0
    assert trials.filter(pl.col("feasible"))["compactions"].min() >= 2
    cheapest = trials.filter(pl.col("feasible")).sort("objective").row(0, named=True)
    assert bound.best["trial"] == cheapest["trial"]
    # The best feasible so far never rises and ends at the best.
    series = trials["best_so_far"].drop_nulls().to_list()
    assert series == sorted(series, reverse=True) and series[-1] == bound.best["objective"]


def test_a_trial_left_running_by_a_killed_run_is_marked_failed(tmp_path: Path, samples):
    first = tn.tune(samples, spec(), tmp_path, 2)
    storage = f"sqlite:///{tmp_path / tn.STUDY_FILE}"
    optuna.load_study(study_name=first.study, storage=storage).ask()  # never told
    again = tn.tune(samples, spec(), tmp_path, 1)
    assert again.stale_failed == 1
    assert again.trials["state"].to_list() == ["complete", "complete", "fail", "complete"]


def test_a_named_study_with_other_settings_is_refused(tmp_path: Path, samples) -> None:
    tn.tune(samples, spec(), tmp_path, 1, study_name="mine")
    with pytest.raises(tn.TuneError, match="other settings"):
        tn.tune(samples, spec("overflows=0"), tmp_path, 1, study_name="mine")


def tune_cli(*args: str | Path) -> Any:
    return CliRunner().invoke(main, ["tune", *(str(a) for a in args)])


def test_tune_command_prints_best_and_shipped_and_writes_files(tmp_path: Path) -> None:
    args = [SAMPLES, "--policy", POLICY, "--param", f"{BUFFER}=1000:60000:500"]
    args += ["--constraint", "overflows=0", "--constraint", "breaker_trips=0"]
    args += ["--trials", "6", "--seed", "2", "--out", tmp_path]
    result = tune_cli(*args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"study {POLICY}-cost-") and lines[0].endswith("6 trial(s), 6 new")
    assert lines[1].startswith("best (trial ") and f"{BUFFER}=" in lines[1]
    assert "overflows 0" in lines[2] and "cost $" in lines[2]
    assert lines[3] == f"shipped: {BUFFER}=13000"
    trials = pl.read_parquet(tmp_path / tn.TRIALS_FILE)
    assert trials.height == 6 and trials["feasible"].all()
    png = (tmp_path / tn.CHART_FILE).read_bytes()
    assert png.startswith(b"\x89PNG")
    again = tune_cli(*args[:-4], "--trials", "2", "--seed", "2", "--out", tmp_path)
    assert again.exit_code == 0, again.output
    assert "8 trial(s), 2 new" in again.output


def test_tune_exits_1_when_no_trial_is_feasible(tmp_path: Path) -> None:
    args = [SAMPLES, "--policy", POLICY, "--param", f"{BUFFER}=1000:60000:500"]
    result = tune_cli(*args, "--constraint", "cost<=0", "--trials", "2", "--out", tmp_path)
    assert result.exit_code == 1, result.output
    assert "no trial meets the constraints" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "autocompact.bufer_tokens=1:5"], "did you mean 'autocompact.buffer_tokens'"),
        (["--param", f"{BUFFER}=1:5", "--objective", "dollars"], "--objective 'dollars'"),
        (["--param", f"{BUFFER}=1:5", "--constraint", "overflows~0"], "expected METRIC"),
        (["--param", f"{BUFFER}=x:y"], "--param"),
    ],
)
def test_tune_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str):
    result = tune_cli(SAMPLES, *args, "--out", tmp_path / "o")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert message in result.output
