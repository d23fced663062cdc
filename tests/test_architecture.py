"""The dependency rule of DESIGN.md section 1, checked on the import statements of every
package: the core (simulator/ but simulator/app/) imports no policy, reader, report or
application module; policies and readers take only the core's model and view types;
reports draw and compare what the core computes and import only the core; the application
(simulator/app/) wires them all together."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

#: The application: the CLI, the Python API, sweeps, tuning, fidelity, writing run
#: directories and the measurement scripts, the only modules that wire readers, policies
#: and reports together.
APP = ROOT / "simulator" / "app"
#: What `policies` and `traces` may take from the core: its model and view types (the trace
#: model; the view, its prefix items and history schedule; the policy protocol and its
#: typed parameters; the facts of the models a session runs on).
CORE_TYPES = {
    "simulator",
    "simulator.model",
    "simulator.view",
    "simulator.history",
    "simulator.prefix",
    "simulator.policy",
    "simulator.params",
    "simulator.models",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _is_app(module: str) -> bool:
    return module == "simulator.app" or module.startswith("simulator.app.")


def test_core_imports_no_policy_reader_report_or_application() -> None:
    core = [p for p in _modules("simulator") if APP not in p.parents]
    assert len(core) > 10  # the rule is checked on the core, not on an empty list
    for path in core:
        bad = {
            m
            for m in _imports(path)
            if m.split(".")[0] in ("policies", "traces", "reports") or _is_app(m)
        }
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_reports_import_only_the_core() -> None:
    for path in _modules("reports"):
        bad = {m for m in _imports(path) if m.split(".")[0] in ("policies", "traces") or _is_app(m)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_policies_and_traces_use_only_core_model_and_view_types() -> None:
    for package, forbidden in (
        ("policies", {"traces", "reports"}),
        ("traces", {"policies", "reports"}),
    ):
        for path in _modules(package):
            mods = _imports(path)
            core = {m for m in mods if m.split(".")[0] == "simulator"}
            assert core <= CORE_TYPES, (
                f"{path.relative_to(ROOT)} imports {sorted(core - CORE_TYPES)}"
            )
            other = {m for m in mods if m.split(".")[0] in forbidden}
            assert not other, f"{path.relative_to(ROOT)} imports {sorted(other)}"
