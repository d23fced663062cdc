"""A run directory is committed as a unit (issue 17): `ctxsim run` killed with SIGKILL at
any point leaves the earlier complete run or the new complete run, byte for byte, with the
user's own files kept; the next run cleans up after the killed one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.app.cli import main
from simulator.app.files import KILL_AT_ENV, STAGE_MARK
from tests.support import ROOT
from tests.support.report_helpers import trace_a, trace_b
from traces import compiled

OLD = ("--policy", "as-recorded")
NEW = ("--policy", "as-recorded", "--policy", "none", "--seed", "1")


def _args(src: Path, out: Path, policies: tuple[str, ...]) -> list[str]:
    return ["run", str(src), "--no-cache", "--session-charts", "2", "--out", str(out), *policies]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """The traces, the old run (with a file of the user's), the new run and the new run
    without its report (--no-report), uninterrupted."""
    base = tmp_path_factory.mktemp("commit")
    src = base / "traces"
    src.mkdir()
    for name, trace in (("a", trace_a()), ("b", trace_b())):
        compiled.write(trace, src / f"{name}.ctxt")
    old, new, bare = base / "old", base / "new", base / "bare"
    for out, policies in ((old, OLD), (new, NEW), (bare, (*NEW, "--no-report"))):
        result = CliRunner().invoke(main, _args(src, out, policies))
        assert result.exit_code == 0, result.output
        (out / "notes.txt").write_text("the user's")
    return src, old, new, bare


def _killed_run(src: Path, out: Path, env: dict[str, str], *more: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "simulator.app.cli", *_args(src, out, (*NEW, *more))]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _check_whole(out: Path, old: Path, new: Path) -> str:
    got = _snapshot(out)
    if got == _snapshot(old):
        return "old"
    assert got == _snapshot(new), sorted(set(got) ^ set(_snapshot(new)))
    return "new"


def test_a_kill_at_each_point_of_the_commit_leaves_a_whole_run(
    runs: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    """Killed (simulator/app/files.py KILL_AT_ENV) with everything staged, with the user's
    files carried over, and just after the swap; without a report, to keep it quick (the
    kill while a report is drawn is the next test's)."""
    src, old, _, bare = runs
    for point, left in (("staged", "old"), ("carried", "old"), ("swapped", "new")):
        out = tmp_path / point
        shutil.copytree(old, out, symlinks=True)
        proc = _killed_run(src, out, {KILL_AT_ENV: point}, "--no-report")
        assert proc.wait(timeout=120) == -signal.SIGKILL
        assert _check_whole(out, old, bare) == left, point
        assert any(STAGE_MARK in p.name for p in tmp_path.iterdir())  # what it left
        # the next run removes what the killed one left beside the directory
        rerun = _args(src, out, (*NEW, "--no-report"))
        assert CliRunner().invoke(main, rerun).exit_code == 0
        assert _check_whole(out, old, bare) == "new"
        assert not [p.name for p in tmp_path.iterdir() if STAGE_MARK in p.name]


def test_a_kill_while_the_report_is_drawn_leaves_the_old_run(
    runs: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    """Killed as soon as the staged data files are complete (the report is being drawn
    from them), and again at the moment the stage appears (files still being written)."""
    src, old, new, _ = runs
    for ready in ("manifest.json", None):
        out = tmp_path / "run"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(old, out, symlinks=True)
        proc = _killed_run(src, out, {})
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            stages = [p for p in tmp_path.iterdir() if STAGE_MARK in p.name]
            if stages and (ready is None or (stages[0] / ready).exists()):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=120)
        state = _check_whole(out, old, new)
        assert state == "old" or proc.returncode == 0, (ready, proc.returncode)
