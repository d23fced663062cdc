"""A new peer policy is one module: dropped into policies/peers/ of a copy of the source,
with no other file touched, it is registered, takes typed parameters, gets every case of
the conformance suite and a line on its session charts at the limit it states.

The copy runs in a subprocess with the copy first on the path, so the installed package
(and this process's registry) never see the extra policy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import ROOT

#: The whole new policy: drop the oldest rounds above half the window. Written as a user
#: would, from the base classes and the typed parameter helpers only.
MODULE = '''
"""`halfway`: drop the oldest API-round groups once the view passes half the window."""

from __future__ import annotations

from typing import Any, ClassVar

from policies.base import ConversationSession
from simulator.params import Declarations, Param, fraction
from simulator.policy import Emitter, Limits, Policy, SessionContext, SessionPolicy, register


class HalfwaySession(ConversationSession):
    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params)
        self.trigger = int(params["share"] * self.window)

    def limits(self) -> Limits:
        return Limits(threshold=self.trigger + 1)

    def transform(self, k: int, out: Emitter) -> None:
        conv = self.conv
        groups = conv.groups()
        if conv.total() <= self.trigger or len(groups) < 3:
            return
        conv.replace_range(groups[1], groups[-1], [], edit="window")


PARAMS: dict[str, Param] = {
    "share": fraction("drop rounds above this share of the window", "ours", open_low=True),
}


@register
class Halfway(Policy):
    name = "halfway"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {"share": 0.5}
    declared: ClassVar[Declarations] = PARAMS

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return HalfwaySession(ctx, self.params)
'''

#: Run in the copy: the registry lists the policy, its parameter is checked, and a replay
#: of a session that passes half the window carries the stated threshold, which the chart
#: draws as a line.
PROBE = """
from simulator import policy as registry
from simulator.params import ParamError
from simulator.replay import replay
from reports.charts import stated_lines
from tests.support.scripted import Script

assert "halfway" in registry.names(), registry.names()
try:
    registry.build("halfway", {"share": "1.5"})
except (ParamError, ValueError) as exc:
    print("refused:", exc)
s = Script(prefix=10_000)
s.user(1_000)
s.request()
for _ in range(12):
    s.rounds(1, 9_900)
    s.request()
rows = replay([("t", s.trace())], registry.build("halfway"))
lines = stated_lines(rows)
print("threshold", sorted({v for v in rows["threshold_tokens"].to_list()}))
print("lines", [(line.label, line.tokens) for line in lines])
print("edits", int(rows["edits"].sum()))
"""


def _copy(tmp: Path) -> Path:
    """The source packages, the conformance suite and its helpers, copied as they are."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("simulator", "policies", "traces", "reports"):
        shutil.copytree(ROOT / package, tmp / package, ignore=ignore)
    shutil.copytree(ROOT / "tests" / "support", tmp / "tests" / "support", ignore=ignore)
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(ROOT / "tests" / name, tmp / "tests" / name)
    (tmp / "tests" / "policies").mkdir()
    (tmp / "tests" / "policies" / "__init__.py").write_text("")
    shutil.copy2(
        ROOT / "tests" / "policies" / "test_conformance.py",
        tmp / "tests" / "policies" / "test_conformance.py",
    )
    shutil.copy2(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "CTXSIM_CACHE_DIR": str(cwd / ".cache")}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300
    )


def test_a_new_peer_policy_is_one_module(tmp_path: Path) -> None:
    copy = _copy(tmp_path / "src")
    before = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    (copy / "policies" / "peers" / "halfway.py").write_text(textwrap.dedent(MODULE))
    after = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    assert after - before == {Path("policies/peers/halfway.py")}  # the one file added

    probe = _run([sys.executable, "-c", PROBE], copy)
    assert probe.returncode == 0, probe.stderr
    out = probe.stdout
    assert "refused:" in out and "share" in out  # typed: 1.5 is no share of the window
    # Sonnet 4.5 (the scripted model): a 200,000-token window, so half of it + 1.
    assert "threshold [100001]" in out, out
    assert "100001" in out.split("lines", 1)[1], out  # the chart's line is the stated one
    assert int(out.rsplit("edits", 1)[1]) > 0, out  # its truncations are on the record

    suite = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/policies/test_conformance.py",
            "-o",
            "addopts=",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-k",
            "halfway",
        ],
        copy,
    )
    assert suite.returncode == 0, suite.stdout + suite.stderr
    passed = [line for line in suite.stdout.splitlines() if " passed" in line]
    # Every case parametrized by policy ran for it (the real-trace one skips without
    # ../shared beside the copy).
    assert passed and int(passed[-1].split()[0]) >= 3, suite.stdout
