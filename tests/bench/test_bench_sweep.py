"""Sweep throughput on the process pool with 1 and 2 workers, in one run.

The sweep: claude-code@2.1.88 and claude-code@1.0, each over 60 autocompact buffers (120
cells), every cell replaying all the Claude Code traces of ../shared/traces. A round is a
whole `run_sweep` into a fresh directory, as `ctxsim sweep` pays it: starting the pool
(the fork server and the workers, each handed the traces once), every cell replayed and
written, the manifest and the cells table. Reported per worker count: cells per second,
simulated requests per second, and each worker's peak resident memory (ru_maxrss, as the
worker reports it with every cell); with 2 workers also the speed-up over 1 (issue
target: at least 1.8x). Loading the traces is outside the timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator.app import sweep as sw
from traces.load import load_all, units

pytestmark = pytest.mark.benchmark(group="sweep")

BUFFERS = "1000:60000:1000"
CONFIG = sw.SweepConfig(
    policies=("claude-code@2.1.88", "claude-code@1.0"),
    grid=((None, "autocompact.buffer_tokens", sw.parse_values(BUFFERS)),),
)
#: Cells per second by worker count, measured so far in this run (for the speed-up).
RATES: dict[int, float] = {}


@pytest.fixture(scope="module")
def claude_code(shared: Path) -> list[tuple[str, Any]]:
    root = shared / "claude-code"
    if not root.is_dir():
        pytest.skip("../shared/traces/claude-code is absent")
    return [
        (item.name.removesuffix(".ctxt"), item.trace)
        for item in load_all(units([root]), lenient=True)
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_sweep_throughput(
    benchmark, claude_code, tmp_path_factory: pytest.TempPathFactory, workers: int
) -> None:
    cells = sw.build_cells(CONFIG)
    settings = sw.SweepSettings(claude_code)
    results: list[sw.SweepResult] = []

    def once() -> None:
        out = tmp_path_factory.mktemp(f"sweep-{workers}w")
        results.append(
            sw.run_sweep(out, cells, CONFIG, settings, executor_name="process", workers=workers)
        )

    benchmark.pedantic(once, rounds=3, iterations=1)
    assert all(r.computed == len(cells) for r in results)
    if benchmark.stats is None:
        return
    median = float(benchmark.stats.stats.median)
    requests = results[-1].requests
    rate = len(cells) / median
    RATES[workers] = rate
    peaks = [max(r.peak_rss.values()) for r in results]
    info = benchmark.extra_info
    info["workers"] = workers
    info["cells"] = len(cells)
    info["requests_per_cell"] = requests // len(cells)
    info["cells_per_s"] = round(rate, 1)
    info["requests_per_s"] = round(requests / median)
    info["peak_rss_per_worker_mib"] = round(max(peaks) / 2**20, 1)
    if workers > 1 and 1 in RATES:
        info["speedup_vs_1_worker"] = round(rate / RATES[1], 2)
