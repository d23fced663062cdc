"""What the loss columns cost on top of the replay they observe (issue: at most 1.25x): the
shared Claude Code corpus and a 10,000-request synthetic session, each replayed plain and
with the loss pass, under as-recorded and claude-code. Ratios are read within one run
(`make bench`): the machines are shared and noisy."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Named

from simulator import policy
from simulator.loss import replay_with_loss
from simulator.model import Trace
from simulator.replay import default_prices, replay
from traces.synthetic import synthetic_session

pytestmark = pytest.mark.benchmark(group="loss")

POLICIES = ("as-recorded", "claude-code")


@pytest.fixture(scope="module")
def synthetic_10k() -> Named:
    return [("synthetic", Trace("claude-code", "s", [synthetic_session(10_000, seed=1)]))]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("loss", [False, True], ids=["plain", "with-loss"])
def test_shared_claude_code_corpus(
    benchmark, shared_corpus: Callable[[str], Named], name: str, loss: bool
) -> None:
    traces = shared_corpus("claude-code")
    run = replay_with_loss if loss else replay
    benchmark.pedantic(
        run, args=(traces, policy.build(name)), kwargs={"prices": default_prices()}, rounds=3
    )


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("loss", [False, True], ids=["plain", "with-loss"])
def test_synthetic_10k(benchmark, synthetic_10k: Named, name: str, loss: bool) -> None:
    run = replay_with_loss if loss else replay
    benchmark.pedantic(
        run, args=(synthetic_10k, policy.build(name)), kwargs={"prices": default_prices()}, rounds=3
    )
