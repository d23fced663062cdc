"""The dependency rule of DESIGN.md section 1, checked on the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The CLI and the Python API are the modules that wire readers, policies and reports together.
WIRING = {
    ROOT / "simulator" / name for name in ("cli.py", "cli_sweep.py", "cli_options.py", "api.py")
}
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


def test_core_imports_no_policy_reader_or_report() -> None:
    for path in _modules("simulator"):
        if path in WIRING:
            continue
        bad = {m for m in _imports(path) if m.split(".")[0] in ("policies", "traces", "reports")}
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
