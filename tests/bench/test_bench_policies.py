"""Every registered policy is linear in the session's length (issue 16).

Each policy replays a synthetic session (traces/synthetic.py) of 1,000 and of 10,000
requests; its time per request is the best round's CPU time (of this process, over the
request count) beside pytest-benchmark's wall time: the machine is shared, and wall time
counts other processes' turns on the cores; the best round, not the median, for the same
reason. Targets, read within one run (`make bench`): each policy's time per request at
10,000 requests within 1.5x of its own at 1,000 (a policy that rescans the whole
conversation every request grows with the session: masking went from 183 to 1,499 us a
request before its running index), and within 3x of claude-code's at 10,000 requests.

The cases run in order: claude-code first (the reference), then each policy at 1,000 and
at 10,000 requests; each 10,000-request case checks its policy against both targets.
Only the replay is timed: the sessions are generated once, in fixtures.

Variants of claude-code with a stage that is off by default are cases of their own,
checked against the growth target only (they are no registered policy). Context collapse
(`COLLAPSE`) replays with a 40,000-token window: at the default 200k one, the 1,000-request
session commits at 0.25 of its requests and the 10,000-request one at 0.93 (the summaries
pile up once the window is full), so its time per request grew 2.1x from the work alone
while the time per commit stayed flat; at 40k both commit at 0.99-1.00 of their requests,
and the case checks that the two commit rates are within 10% of each other, so the
per-request times compare the same work. Before its span search was indexed (issue 16),
with this window and the synthetic sessions of seed 1: 362 us a request at 1,000
requests, 3,222 at 10,000 (8.9x); after, 57 and 64 (1.11x; process CPU, best round, load
3.4-4.5 on the 2 cores).
"""

from __future__ import annotations

import time

import polars as pl
import pytest

from simulator import policy
from simulator.model import Trace
from simulator.replay import replay
from traces.synthetic import synthetic_trace

pytestmark = pytest.mark.benchmark(group="policies")

SIZES = (1_000, 10_000)
SEED = 11
REFERENCE = "claude-code"
#: Growth allowed from 1,000 to 10,000 requests, and the factor over claude-code.
LINEAR = 1.5
REFERENCE_FACTOR = 3.0
#: Rounds per size: a 10,000-request round of the slowest policy takes about 0.5 s.
ROUNDS = {1_000: 9, 10_000: 3}
#: Variant cases: name -> (registered policy, parameters).
COLLAPSE = "claude-code+collapse"
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    COLLAPSE: (
        REFERENCE,
        {"collapse.enabled": True, "autocompact.window_cap_tokens": 40_000},
    ),
}
#: How far apart the variants' commit rates (compaction calls per request) may be at the
#: two sizes for their per-request times to compare the same work.
SAME_WORK = 0.10


def _cases() -> list[tuple[str, int]]:
    order = [REFERENCE, *(n for n in policy.names() if n != REFERENCE), *VARIANTS]
    return [(name, size) for name in order for size in SIZES]


#: Compaction calls per request of each variant case, by (name, size).
WORK: dict[tuple[str, int], float] = {}


#: Best microseconds per request measured so far in this run, by (policy, size).
PER_REQUEST: dict[tuple[str, int], float] = {}


@pytest.fixture(scope="module")
def sessions() -> dict[int, Trace]:
    return {size: synthetic_trace(size, SEED) for size in SIZES}


@pytest.mark.parametrize(("name", "size"), _cases(), ids=[f"{n}-{s}" for n, s in _cases()])
def test_policy_per_request(benchmark, sessions: dict[int, Trace], name: str, size: int) -> None:
    base, params = VARIANTS.get(name, (name, {}))
    built = policy.build(base, params)
    named = [("synthetic", sessions[size])]
    cpu: list[float] = []
    last: list[pl.DataFrame] = []

    def timed() -> None:
        start = time.process_time()
        last[:] = [replay(named, built)]
        cpu.append(time.process_time() - start)

    benchmark.pedantic(timed, rounds=ROUNDS[size], warmup_rounds=1)
    if benchmark.stats is None:  # benchmarks disabled
        return
    us = min(cpu) / size * 1e6
    benchmark.extra_info["wall_us_per_request"] = round(
        float(benchmark.stats.stats.min) / size * 1e6, 2
    )
    PER_REQUEST[name, size] = us
    if name in VARIANTS:
        compactions = int((last[0]["kind"] == "compaction").sum())
        WORK[name, size] = compactions / size
        benchmark.extra_info["compactions_per_request"] = round(WORK[name, size], 3)
    benchmark.extra_info["requests"] = size
    benchmark.extra_info["us_per_request"] = round(us, 2)
    small, large = SIZES
    if size != large or (name, small) not in PER_REQUEST:
        return
    growth = us / PER_REQUEST[name, small]
    benchmark.extra_info["growth"] = round(growth, 2)
    reference = PER_REQUEST.get((REFERENCE, large))
    if reference is not None:
        benchmark.extra_info["over_claude_code"] = round(us / reference, 2)
    if name in VARIANTS:
        assert abs(WORK[name, large] - WORK[name, small]) <= SAME_WORK * WORK[name, small], (
            f"{name}: {WORK[name, small]:.2f} and {WORK[name, large]:.2f} compactions a request"
        )
        assert growth <= LINEAR, f"{name}: {growth:.2f}x per request from {small} to {large}"
        return
    assert growth <= LINEAR, f"{name}: {growth:.2f}x per request from {small} to {large}"
    if reference is not None:
        assert us <= REFERENCE_FACTOR * reference, (
            f"{name}: {us:.1f} us a request, {us / reference:.2f}x claude-code's"
        )
