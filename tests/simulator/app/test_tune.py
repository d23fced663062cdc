"""Tuning (simulator/app/tune.py, `ctxsim tune`): a seeded study is deterministic, a rerun
continues it, constraints decide the best trial, and errors are one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from simulator.app import tune as tn
from simulator.app.cli import main
from tests.support import SAMPLES
from traces.load import load_all, units

optuna = pytest.importorskip("optuna")

BUFFER = "autocompact.buffer_tokens"
COLUMN = "autocompact__buffer_tokens"
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
    assert first.trials.row(0, named=True)[COLUMN] == 13_000
    assert first.best["objective"] <= first.baseline["cost"]
    assert first.best["objective"] == first.trials.filter(pl.col("feasible"))["objective"].min()
    other_seed = tn.tune(samples, spec("overflows=0", seed=6), tmp_path / "c", 8)
    assert other_seed.study != first.study
    assert other_seed.trials[COLUMN].to_list() != first.trials[COLUMN].to_list()


def test_a_rerun_continues_the_same_study(tmp_path: Path, samples) -> None:
    first = tn.tune(samples, spec(), tmp_path, 5)
    again = tn.tune(samples, spec(), tmp_path, 4)
    assert again.study == first.study
    assert (again.new_trials, again.trials.height) == (4, 9)
    assert again.trials["trial"].to_list() == list(range(9))
    assert again.trials.head(5).equals(first.trials)
    # The continuation draws new points rather than repeating the first run's.
    assert set(again.trials[COLUMN][5:]) - set(first.trials[COLUMN])
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


# -- loss, several objectives, the Pareto front ---------------------------------------------


def test_objectives_parse_and_every_row_metric_is_one() -> None:
    assert tn.parse_objective("cost") == tn.Objective("cost", False)
    assert tn.parse_objective("cost", maximize=True) == tn.Objective("cost", True)
    assert tn.parse_objective("max:human_verbatim_share") == tn.Objective(
        "human_verbatim_share", True
    )
    assert str(tn.parse_objective("min:stale_file_refs")) == "min:stale_file_refs"
    with pytest.raises(tn.TuneError, match="min:METRIC or max:METRIC"):
        tn.parse_objective("up:cost")
    with pytest.raises(tn.TuneError, match="--objective 'dollars'"):
        tn.parse_objective("dollars")
    loss = ("stale_file_refs", "resent_tokens", "summary_share", "human_verbatim_share")
    others = ("edits", "edit_tokens", "overflows", "compactions", "refetch_calls", "refetch_cost")
    assert set(loss + others) <= set(tn.METRICS)
    assert tn.parse_constraint("stale_file_refs<=3") == tn.Constraint("stale_file_refs", "<=", 3)
    with pytest.raises(tn.TuneError, match="given twice"):
        tn.TuneSpec(POLICY, spec().dimensions, objectives=(tn.Objective("cost"),) * 2)


def test_pareto_mask_by_hand() -> None:
    both_min = (tn.Objective("cost"), tn.Objective("stale_file_refs"))
    points = [(1, 5), (2, 3), (3, 4), (2, 3), (4, 1), (4, 2)]
    # (3, 4) is beaten by (2, 3); (4, 2) by (4, 1); the two equal (2, 3) both stay.
    assert tn.pareto_mask(points, both_min) == [True, True, False, True, True, False]
    keep_max = (tn.Objective("cost"), tn.Objective("human_verbatim_share", True))
    # Maximising the second: (1, 5) beats every other point.
    assert tn.pareto_mask(points, keep_max) == [True, False, False, False, False, False]
    assert tn.dominates((1, 1), (1, 2), both_min) and not tn.dominates((1, 2), (1, 2), both_min)


def test_a_loss_proxy_is_an_objective_and_a_constraint(tmp_path: Path, samples) -> None:
    """Loss proxies were refused (issue 14); now the fewest stale references is a question,
    and a bound on them decides feasibility. Each trial's figures are those of a plain run."""
    stale = tn.TuneSpec(
        POLICY,
        spec().dimensions,
        objectives=(tn.Objective("stale_file_refs"),),
        constraints=(tn.parse_constraint("stale_file_refs<=4"),),
        seed=3,
    )
    result = tn.tune(samples, stale, tmp_path, 8)
    trials = result.trials
    assert (trials["objective"] == trials["stale_file_refs"]).all()
    assert (trials["feasible"] == (trials["stale_file_refs"] <= 4)).all()
    assert result.best is not None
    assert result.best["stale_file_refs"] == trials.filter(pl.col("feasible"))["objective"].min()
    from simulator import policy as registry
    from simulator import run as service

    buffer = result.best[COLUMN]
    policy = registry.build(POLICY, {BUFFER: buffer})
    plain = tn.figures(service.rows(samples, policy, service.RunSettings(seed=3)))
    assert {k: result.best[k] for k in ("cost", "stale_file_refs", "resent_tokens")} == {
        k: plain[k] for k in ("cost", "stale_file_refs", "resent_tokens")
    }


def multi(seed: int = 4, refetch: bool = False) -> tn.TuneSpec:
    return tn.TuneSpec(
        POLICY,
        (tn.parse_dimension(f"{BUFFER}=1000:90000:500"),),
        objectives=(tn.Objective("cost"), tn.Objective("stale_file_refs")),
        constraints=(tn.parse_constraint("overflows=0"),),
        seed=seed,
        refetch=refetch,
        population=4,
    )


def test_a_multi_objective_study_is_seeded_and_its_front_is_the_undominated(
    tmp_path: Path, samples
) -> None:
    first = tn.tune(samples, multi(), tmp_path / "a", 10)
    again = tn.tune(samples, multi(), tmp_path / "b", 10)
    assert first.trials.equals(again.trials) and first.front.equals(again.front)
    assert first.trials.row(0, named=True)[COLUMN] == 13_000  # the shipped value first
    assert first.front.columns == ["trial", COLUMN, "cost", "stale_file_refs", "params_hash"]
    feasible = first.trials.filter(pl.col("feasible"))
    objectives = multi().objectives
    points = {r["trial"]: (r["cost"], r["stale_file_refs"]) for r in feasible.iter_rows(named=True)}
    on_front = set(first.front["trial"])
    assert on_front and on_front == set(first.trials.filter(pl.col("pareto"))["trial"])
    for trial, point in points.items():
        beaten = any(tn.dominates(q, point, objectives) for q in points.values())
        assert beaten == (trial not in on_front)
    # Ordered by cost, the cheapest first; the best by the first objective is on the front.
    assert first.front["cost"].to_list() == sorted(first.front["cost"].to_list())
    assert first.best is not None and first.best["trial"] in on_front
    assert first.trials["best_so_far"].null_count() == first.trials.height  # one objective only


def test_refetch_is_part_of_the_study_and_of_its_figures(tmp_path: Path, samples) -> None:
    closed = tn.tune(samples, multi(refetch=True), tmp_path, 2)
    opened = tn.tune(samples, multi(refetch=False), tmp_path, 2)
    assert closed.study != opened.study  # another question, another study
    assert closed.trials["refetch_calls"].null_count() == 0
    assert opened.trials["refetch_calls"].null_count() == opened.trials.height


def test_tune_command_with_two_objectives_writes_the_front_identically(tmp_path: Path) -> None:
    args = [SAMPLES, "--policy", POLICY, "--param", f"{BUFFER}=1000:90000:500"]
    args += ["--objective", "cost", "--objective", "stale_file_refs", "--constraint"]
    args += ["overflows=0", "--trials", "8", "--population", "4", "--seed", "1"]
    outputs = []
    for name in ("a", "b"):
        result = tune_cli(*args, "--out", tmp_path / name)
        assert result.exit_code == 0, result.output
        assert "Pareto front (" in result.output
        assert "pareto.parquet, pareto.png" in result.output
        outputs.append(
            [(tmp_path / name / f).read_bytes() for f in ("trials.parquet", "pareto.parquet")]
            + [(tmp_path / name / "pareto.png").read_bytes()]
        )
    assert outputs[0] == outputs[1]
    assert outputs[0][2].startswith(b"\x89PNG")
    front = pl.read_parquet(tmp_path / "a" / "pareto.parquet")
    assert front.height >= 1 and front.columns[1] == COLUMN
    refused = tune_cli(*args, "--maximize", "--out", tmp_path / "c")
    assert refused.exit_code == 2 and "write max:METRIC" in refused.output


@pytest.mark.parametrize("unpriced", [0, 3])
def test_the_report_marks_dollars_that_leave_out_unpriced_calls(unpriced: int) -> None:
    """As the run summary and the sweep table do: a cost that leaves out calls whose model
    has no price is marked, and the note says so."""
    from reports.tables import UNPRICED_NOTE
    from simulator.app.cli_sweep import _tune_report

    figures = dict.fromkeys(tn.METRICS, 0) | {"cost": 12.5, "unpriced_calls": unpriced}
    result = tn.TuneResult(
        study="s", trials=pl.DataFrame({"trial": [0]}), new_trials=1, best=None,
        baseline=figures, shipped={BUFFER: 13_000},
    )  # fmt: skip
    lines = _tune_report(result, spec())
    cost = next(line for line in lines if "cost $" in line)
    assert ("cost $12.5000*" in cost) == bool(unpriced)
    assert ("cost $12.5000 " in cost) == (not unpriced)
    assert (UNPRICED_NOTE in lines) == bool(unpriced)
