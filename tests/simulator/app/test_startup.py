"""What a command imports before it works (issue 16): the price table (genai-prices, 0.19 s)
only when a price is looked up, and a policy module only when a policy it registers is built
or listed (every policy module: 0.13 s). Each probe runs in a fresh interpreter, so what it
finds in `sys.modules` is what the code imported, not what other tests did.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from simulator import policy as registry
from tests.support import ROOT, SAMPLES


def _probe(code: str, *args: str, cache: Path | None = None) -> dict[str, object]:
    """Run `code` in a fresh interpreter from the checkout; it prints one JSON object."""
    env = {**os.environ, **({"CTXSIM_CACHE_DIR": str(cache)} if cache else {})}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _policy_modules() -> set[str]:
    """Every module of the policy entry points (a package's: each module in it), found
    without importing them."""
    out = set()
    for point in entry_points(group=registry.ENTRY_POINT_GROUP):
        spec = importlib.util.find_spec(point.module)
        assert spec is not None
        places = spec.submodule_search_locations
        if places:
            out |= {f"{point.module}.{m.name}" for m in pkgutil.iter_modules(list(places))}
        else:
            out.add(point.module)
    return out


MODULES = _policy_modules()


def test_importing_the_cli_and_the_engine_imports_no_price_table_and_no_policy() -> None:
    out = _probe(
        """
        import json, sys
        import simulator.app.cli, simulator.app.cli_sweep, simulator.app.sweep
        import simulator.run, simulator.replay, simulator.models, simulator.pricing
        from simulator.pricing import PriceBook
        book = PriceBook()
        version = book.version  # what a sweep's manifest records: no lookup
        print(json.dumps({"modules": sorted(sys.modules), "version": version}))
        """
    )
    modules = set(out["modules"])  # type: ignore[arg-type]
    assert not {m for m in modules if m.split(".")[0] == "genai_prices"}
    assert not modules & MODULES
    assert str(out["version"]).startswith("genai-prices ")


def test_the_first_price_imports_the_table() -> None:
    out = _probe(
        """
        import json, sys
        from simulator.models import facts
        from simulator.pricing import PriceBook
        book = PriceBook()
        before = "genai_prices.data" in sys.modules
        cost = book.price("claude-sonnet-4-5-20250929", 1_000_000, 0, 0, 0, 0).total
        print(json.dumps({"before": before, "after": "genai_prices.data" in sys.modules,
                          "cost": cost, "window": facts("gpt-5").window}))
        """
    )
    assert out["before"] is False and out["after"] is True
    # Sonnet 4.5 above 200,000 tokens of input: $6 per million for the whole request.
    assert out["cost"] == pytest.approx(6.0)
    assert out["window"] == 272_000  # gpt-5: 400,000 less 128,000 of output


def test_building_one_policy_imports_only_its_module_and_the_names_are_all_known() -> None:
    out = _probe(
        """
        import json, sys
        from simulator import policy as registry
        from simulator.frames import code_digest
        names = registry.names()
        where = {n: registry.module_of(n) for n in names}
        registry.build("claude-code@2.1.88")
        registry.build("masking")
        digest = code_digest()
        loaded = sorted(m for m in sys.modules if m.startswith("policies."))
        registry._load_all()
        print(json.dumps({
            "names": names, "where": where, "loaded": loaded, "digest": digest,
            "registered": {n: c.__module__ for n, c in registry._REGISTRY.items()},
        }))
        """
    )
    registered: dict[str, str] = out["registered"]  # type: ignore[assignment]
    # Every name is known before its module is imported, and from the module that registers it.
    assert out["names"] == sorted(registered)
    assert out["where"] == registered
    loaded = set(out["loaded"])  # type: ignore[arg-type]
    policy_modules = loaded & MODULES
    assert policy_modules == {"policies.claude_code.policy", "policies.peers.masking"}
    assert "policies.peers.codex" not in loaded
    # The digest reads the same files as when every policy module was imported.
    from simulator.frames import code_digest

    assert out["digest"] == code_digest()


def test_a_sweep_main_process_imports_only_the_named_policy(tmp_path: Path) -> None:
    out = _probe(
        """
        import atexit, json, sys
        def report():
            mods = sorted(sys.modules)
            print(json.dumps({"modules": mods}))
        from simulator.app.cli import main
        atexit.register(report)
        main(sys.argv[1:])
        """,
        "sweep",
        str(SAMPLES / "claude-code"),
        "--policy",
        "masking",
        "--grid",
        "keep_observations=2,5",
        "--out",
        str(tmp_path / "sweep"),
        "--workers",
        "1",
        "--no-charts",
        cache=tmp_path / "cache",
    )
    modules = set(out["modules"])  # type: ignore[arg-type]
    assert (tmp_path / "sweep" / "sweep.json").is_file()
    assert not {m for m in modules if m.split(".")[0] in ("genai_prices", "matplotlib")}
    assert modules & MODULES == {"policies.peers.masking"}
    # Compiled traces (format 5, traces/compiled.py) are written and read without Parquet.
    assert "pyarrow.parquet" not in modules


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in modules.items():
        (package / f"{name}.py").write_text(textwrap.dedent(source))


LITERAL = '''
from simulator.policy import Policy, register


@register
class One(Policy):
    """The first."""

    name: str = "probe-one"  # a literal, annotated

    def session(self, ctx):
        raise NotImplementedError


@register
class Two(One):
    name = "probe-two"
'''

COMPUTED = """
from simulator.policy import Policy, register

NAME = "probe-" + "computed"


@register
class Computed(Policy):
    name = NAME

    def session(self, ctx):
        raise NotImplementedError
"""


def _registry_of(
    monkeypatch: pytest.MonkeyPatch, root: Path, package: str, modules: dict[str, str]
) -> None:
    """The registry, fresh, with one package entry point holding `modules`."""
    _package(root, package, modules)
    monkeypatch.syspath_prepend(str(root))
    point = EntryPoint("probe", package, registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point])
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_INDEX", None)
    monkeypatch.setattr(registry, "_UNREAD", [])
    monkeypatch.setattr(registry, "_all_loaded", False)
    for name in [package, *(f"{package}.{m}" for m in modules)]:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_names_come_from_the_source_and_a_name_it_does_not_show_from_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package entry point whose modules register a literal name and a computed one: the
    literal ones are listed without importing their module, the computed one's module is
    imported to list it, and building a literal one imports its module only."""
    _registry_of(monkeypatch, tmp_path, "startup_probe", {"literal": LITERAL, "computed": COMPUTED})

    assert registry.names() == ["probe-computed", "probe-one", "probe-two"]
    assert "startup_probe.computed" in sys.modules  # imported: its source shows no name
    assert "startup_probe.literal" not in sys.modules
    assert registry.module_of("probe-two") == "startup_probe.literal"
    assert "startup_probe.literal" not in sys.modules
    assert registry.get("probe-two").__module__ == "startup_probe.literal"
    with pytest.raises(registry.PolicyError, match="did you mean 'probe-one'"):
        registry.get("probe-onr")


CLASH = """
from simulator.policy import Policy, register


@register
class Again(Policy):
    name = "probe-two"

    def session(self, ctx):
        raise NotImplementedError
"""


def test_two_modules_registering_one_name_fail_when_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when every module was imported at the first use: a name two modules register is
    refused, not taken from whichever module is read first."""
    _registry_of(monkeypatch, tmp_path, "startup_clash", {"literal": LITERAL, "again": CLASH})

    assert registry.names() == ["probe-one", "probe-two"]
    with pytest.raises(registry.PolicyError, match="two policies are named 'probe-two'"):
        registry.get("probe-two")


def test_the_preload_list_is_named_without_the_engine() -> None:
    """`ctxsim sweep` names the fork server's modules before it imports the engine
    (simulator/app/cli_sweep.py `_fork_server_now`): the list's module imports none of it,
    and names what the pool's own list does, with the CLI, and every policy module."""
    out = _probe(
        """
        import json, sys
        from simulator.app.preload import fork_server_modules
        print(json.dumps({"modules": sorted(sys.modules), "list": fork_server_modules("m")}))
        """
    )
    modules = set(out["modules"])  # type: ignore[arg-type]
    heavy = {"numpy", "polars", "pyarrow", "pydantic", "simulator.policy", "simulator.replay"}
    assert not heavy & ({m.split(".")[0] for m in modules} | modules)
    from simulator.app import preload, sweep

    assert preload.POLICY_GROUP == registry.ENTRY_POINT_GROUP
    points = sorted({p.module for p in entry_points(group=registry.ENTRY_POINT_GROUP)})
    engine = ["simulator.app.sweep", "simulator.replay"]
    assert out["list"] == [*engine, "m", "genai_prices.data", *points]
    assert sweep._preload() == [m for m in out["list"] if m != "m"]  # type: ignore[union-attr]
