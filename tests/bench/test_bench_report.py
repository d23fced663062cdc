"""What the report costs a run (issue 16): `ctxsim run --policy claude-code` on the shared
Claude Code corpus with its report (charts/ and report.html) against `run --no-report`,
the whole command each time (interpreter start, compiled-trace cache warm, replay, files,
then the charts), as a user waits for it. Target: at most 1.5x. Read within one run
(`make bench`): the ratio of the best rounds, the machine being shared; each round with
the report follows a `--no-report` round of its own, so the two see the same load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark(group="report")

#: Best seconds per variant measured in this run.
BEST: dict[str, float] = {}
TARGET = 1.5


@pytest.fixture(scope="module")
def corpus(shared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = shared / "claude-code"
    if not root.is_dir():
        pytest.skip("../shared/traces/claude-code is absent")
    env = {**os.environ, "CTXSIM_CACHE_DIR": str(tmp_path_factory.mktemp("report-cache"))}
    warm = tmp_path_factory.mktemp("warm")
    _run(root, warm, env, report=False)  # compiles every trace once: rounds read the cache
    return root, env


def _run(root: Path, out: Path, env: dict[str, str], *, report: bool) -> None:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "simulator.app.cli", "run", str(root), "--lenient"]
    command += ["--policy", "claude-code", "--out", str(out)]
    if not report:
        command.append("--no-report")
    subprocess.run(command, env=env, check=True, capture_output=True)


@pytest.mark.parametrize("report", [False, True], ids=["no-report", "with-report"])
def test_run_with_and_without_report(
    benchmark, corpus: tuple[Path, dict[str, str]], tmp_path: Path, report: bool
) -> None:
    root, env = corpus
    out = tmp_path / "run"
    paired: list[float] = []

    def before_each_round() -> None:
        """A `--no-report` run just before each round with the report: on a shared machine
        the load changes within seconds, and a ratio of rounds taken apart measures it."""
        start = time.perf_counter()
        _run(root, tmp_path / "paired", env, report=False)
        paired.append(time.perf_counter() - start)

    setup = before_each_round if report else None
    benchmark.pedantic(
        _run, args=(root, out, env), kwargs={"report": report}, rounds=3, setup=setup
    )
    if benchmark.stats is None:
        return
    BEST[str(report)] = float(benchmark.stats.stats.min)
    if report:
        assert (out / "report.html").is_file()
        ratio = BEST["True"] / min(paired)
        benchmark.extra_info["over_no_report"] = round(ratio, 2)
        assert ratio <= TARGET, f"run with its report: {ratio:.2f}x run --no-report"
