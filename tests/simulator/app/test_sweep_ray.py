"""The same sweep on a local Ray instance and on the process pool: identical datasets.

Skips where Ray is not installed (`make test` installs it with the dev extras).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from simulator.app import sweep as sw
from simulator.app.cli import main
from tests.support import SAMPLES
from traces.load import load_all, units

ray = pytest.importorskip("ray")

BUFFER = "autocompact.buffer_tokens"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local instance for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        yield
    finally:
        ray.shutdown()


def digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_ray_and_the_process_pool_write_identical_datasets(local_ray: None, tmp_path: Path):
    samples: list[tuple[str, Any]] = [
        (item.name.removesuffix(".ctxt"), item.trace) for item in load_all(units([SAMPLES]))
    ]
    config = sw.SweepConfig(
        policies=("claude-code@2.1.88", "claude-code@1.0"),
        grid=((None, BUFFER, [5_000, 13_000, 40_000]), (None, "snip.enabled", [False, True])),
    )
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    on_ray = sw.run_sweep(tmp_path / "ray", cells, config, settings, executor_name="ray", workers=2)
    assert on_ray.computed == len(cells) == 12
    assert len(on_ray.peak_rss) == 2  # two actors, each loaded the traces once
    pool = sw.run_sweep(
        tmp_path / "pool", cells, config, settings, executor_name="process", workers=2
    )
    assert pool.computed == 12
    assert digests(tmp_path / "ray") == digests(tmp_path / "pool")
    assert ray.is_initialized()  # a running instance is used, and left running


def test_sweep_command_on_ray(local_ray: None, tmp_path: Path) -> None:
    args = ["sweep", str(SAMPLES), "--grid", f"{BUFFER}=10000:20000:10000"]
    args += ["--executor", "ray", "--no-charts"]
    ray_run = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "ray")])
    assert ray_run.exit_code == 0, ray_run.output
    assert "2 computed" in ray_run.output and "on Ray (local)" in ray_run.output
    pool_args = [a for a in args if a not in ("--executor", "ray")]
    pool_run = CliRunner().invoke(main, [*pool_args, "--out", str(tmp_path / "pool")])
    assert pool_run.exit_code == 0, pool_run.output
    assert digests(tmp_path / "ray") == digests(tmp_path / "pool")
