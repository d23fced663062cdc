"""What the loss columns cost on top of the replay they observe (issues 11 and 16: at most
1.25x): the shared Claude Code corpus and a 10,000-request synthetic session, each replayed
plain and with the loss proxies (`replay_with_loss`: the engine computes them on the same
rows, simulator/loss.py), under as-recorded, claude-code and masking (which rewrites an old
observation every request: the loss pass compares the view only from where it changed, the
view's "last changed" index, simulator/view.py), in one test so the ratio is read within
one run (`make bench`): the machines are shared and noisy, so the two sides run back to back
in each of 15 rounds, in process CPU time, and the ratio is the median of the rounds' ratios
(`_ratio` says why not the fastest round of each side).

Measured (three runs this round, the last with the set-up kept, on the shared 2-core
machine, load 1.0-2.6, the paired ratio, corpus / synthetic): as-recorded 1.10-1.24x /
1.17-1.20x, claude-code 1.11-1.19x / 1.11-1.21x, masking 1.08-1.20x / 1.01-1.17x; the
fastest-round ratios of the same runs 0.94-1.34x / 0.88-1.47x. The instructions the
columns add to the replay (callgrind, which the load does not move; simulator/loss.py's
module docstring): masking on the synthetic session 8.95% -> 7.67% this round; the
set-up, 4% of the as-recorded corpus replay, is now paid once per session."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from simulator import loss, policy
from simulator.loss import replay_with_loss
from simulator.model import Trace
from simulator.replay import default_prices, replay
from tests.support import SAMPLES, Named
from traces.load import load
from traces.synthetic import synthetic_session

pytestmark = pytest.mark.benchmark(group="loss")

POLICIES = ("as-recorded", "claude-code", "masking")
LIMIT = 1.25


@pytest.fixture(scope="module")
def synthetic_10k() -> Named:
    return [("synthetic", Trace("claude-code", "s", [synthetic_session(10_000, seed=1)]))]


#: Rounds: each runs both sides back to back, the order alternating from round to round.
ROUNDS = 15


def _paired_ratio(plain: list[float], lossy: list[float]) -> float:
    """The median over rounds of each round's loss time over its plain time."""
    return statistics.median(b / a for a, b in zip(plain, lossy, strict=True))


def _ratio(benchmark: Any, traces: Named, name: str) -> None:
    """Plain and with loss timed back to back in each of ROUNDS rounds (in CPU seconds of
    this process, each run on a collected heap: the engine defers the collector while it
    replays, so the previous run's garbage would land on the next; the order alternates so
    neither side always runs second): the median of the rounds' ratios.

    Why paired rounds and not the fastest round of each side: other processes' load slows
    this machine's rounds by 20-60% for seconds at a time (shared cores and caches), so
    the fastest of seven rounds of one side may be an unloaded round while the other side
    had none: in one run at load 0.8 the fastest of seven rounds of masking on the
    synthetic session were 0.48 s plain and 0.72 s with loss (1.49x), where three other
    runs within the hour gave 1.14-1.19x; 25 rounds did not always confirm both floors
    either. Two runs a fraction of a second apart share the machine's state, and the
    median leaves out the rounds where a burst hit one of them (it is not the lower of the
    two estimates: one run on the corpus under as-recorded gave 1.08x fastest-round, 1.17x
    paired). The fastest-round ratio is reported beside it (`min_ratio`)."""
    built = policy.build(name)
    prices = default_prices()
    times: dict[str, list[float]] = {"plain": [], "loss": []}
    sides = (("plain", replay), ("loss", replay_with_loss))
    for i in range(ROUNDS):
        for side, run in sides if i % 2 == 0 else sides[::-1]:
            gc.collect()  # the last run's garbage is collected before, not inside, this one
            start = time.process_time()
            run(traces, built, prices=prices)
            times[side].append(time.process_time() - start)
    benchmark.pedantic(replay_with_loss, args=(traces, built), kwargs={"prices": prices}, rounds=1)
    ratio = _paired_ratio(times["plain"], times["loss"])
    benchmark.extra_info["plain_s"] = round(statistics.median(times["plain"]), 4)
    benchmark.extra_info["loss_s"] = round(statistics.median(times["loss"]), 4)
    benchmark.extra_info["ratio"] = round(ratio, 3)
    benchmark.extra_info["min_ratio"] = round(min(times["loss"]) / min(times["plain"]), 3)
    assert ratio <= LIMIT, f"{name}: the loss columns {ratio:.2f}x the replay"


def test_paired_ratio_is_the_median_of_the_rounds() -> None:
    """A burst on one round's plain run (round 2) or loss run (round 4) moves its own
    ratio only: the median is the typical round's (hand-computed)."""
    plain = [1.0, 2.0, 1.0, 1.0, 1.0]
    lossy = [1.1, 1.1, 1.2, 3.0, 1.1]
    assert _paired_ratio(plain, lossy) == pytest.approx(1.1)
    assert _paired_ratio([1.0, 1.0, 1.0], [1.3, 1.2, 1.25]) == pytest.approx(1.25)


@pytest.mark.parametrize("name", POLICIES)
def test_shared_claude_code_corpus(
    benchmark: Any, shared_corpus: Callable[[str], Named], name: str
) -> None:
    _ratio(benchmark, shared_corpus("claude-code"), name)


@pytest.mark.parametrize("name", POLICIES)
def test_synthetic_10k(benchmark: Any, synthetic_10k: Named, name: str) -> None:
    _ratio(benchmark, synthetic_10k, name)


@pytest.mark.parametrize("name", ("as-recorded", "claude-code"))
def test_read_pairing_paths_agree(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The stale-reference pairing has a Python pass for sessions with few reads and uses
    and a numpy one for the rest (simulator/loss.py SMALL_EVENTS): forced each way, the
    loss columns are the same, and the samples and the synthetic session do have stale
    references to count."""
    traces: Named = [(item.name, item.trace) for item in load([SAMPLES])]
    traces.append(("synthetic", Trace("claude-code", "s", [synthetic_session(600, seed=3)])))
    built = policy.build(name)
    frames = []
    for small in (0, 10**9):
        monkeypatch.setattr(loss, "SMALL_EVENTS", small)
        frames.append(replay_with_loss(traces, built).select(list(loss.LOSS_SCHEMA)))
    assert frames[0].equals(frames[1])
    assert frames[0]["stale_file_refs"].sum() > 0
