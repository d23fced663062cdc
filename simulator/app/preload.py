"""The modules a sweep's fork server imports once for all its workers (issue 16).

Free of ctxsim's heavy imports, so that simulator/app/cli_sweep.py `_fork_server_now` can
name them before the command imports the engine (0.3 s), from the same list as
simulator/app/sweep.py `_preload`: the engine, the module of each policy entry point (a
package's modules are imported by a worker that builds one of its policies:
simulator/policy.py) and the price table, which the engine imports only at its first price
(simulator/pricing.py).
"""

from __future__ import annotations

from importlib.metadata import entry_points

#: simulator/policy.py ENTRY_POINT_GROUP, named here so that the fork server can start before
#: that module is imported (tests/simulator/app/test_startup.py checks that the two agree).
POLICY_GROUP = "ctxsim.policies"


def fork_server_modules(*main: str) -> list[str]:
    """The modules to preload, with `main` (the module each worker imports again as the
    parent's main module: `simulator.app.cli` under `ctxsim`) after the engine."""
    modules = ["simulator.app.sweep", "simulator.replay", *main, "genai_prices.data"]
    modules += sorted({ep.module for ep in entry_points(group=POLICY_GROUP)})
    return modules
