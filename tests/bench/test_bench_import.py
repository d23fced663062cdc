"""Import throughput on all of ../shared/traces: cold, warm, and a floor measured beside them.

The floor is what any importer must do at least: parse every line with orjson and encode
with tiktoken exactly the texts the importer tokenizes (captured from a real import). The
targets (issue: foundation) are cold import within 1.5x of the floor and warm import at
least 20x faster than cold. Run with `make bench`; ratios come from one run.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson
import pytest

from traces import tokens
from traces.cache import CompileCache
from traces.load import import_into, load_all, load_unit, units
from traces.source import ImportUnit
from traces.tokens import count_tokens

pytestmark = pytest.mark.benchmark(group="import")


def _units(shared: Path) -> list[ImportUnit]:
    return units([shared])


def _megabytes(found: list[ImportUnit]) -> float:
    return sum(f.path.stat().st_size for u in found for f in u.files) / 1e6


def _tokenizing_modules() -> list[object]:
    """Every reader module that calls count_tokens: the builder, and the readers that
    count a text themselves (codex, swe_agent); missing one would lower the floor."""
    return [
        m
        for name, m in sorted(sys.modules.items())
        if name.startswith("traces.")
        and m is not tokens
        and getattr(m, "count_tokens", None) is tokens.count_tokens
    ]


@pytest.fixture(scope="module")
def corpus(shared: Path) -> tuple[list[ImportUnit], list[str]]:
    """The units, and every text the importer tokenizes (captured once)."""
    found = _units(shared)
    texts: list[str] = []
    original = tokens.count_tokens

    def capture(text: str) -> int:
        texts.append(text)
        return original(text)

    modules = _tokenizing_modules()
    assert {getattr(m, "__name__", "") for m in modules} >= {"traces.builder", "traces.codex"}
    for m in modules:
        m.count_tokens = capture  # type: ignore[attr-defined]
    try:
        for unit in found:
            load_unit(unit, lenient=True)
    finally:
        for m in modules:
            m.count_tokens = original  # type: ignore[attr-defined]
    return found, texts


def _floor(found: list[ImportUnit], texts: list[str]) -> int:
    n = 0
    for unit in found:
        for f in unit.files:
            data = f.read()
            if unit.format == "swe-agent":
                orjson.loads(data)
                continue
            for line in data.split(b"\n"):
                try:  # noqa: SIM105 (contextlib.suppress would slow the floor down)
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    pass
    for text in texts:
        n += count_tokens(text)
    return n


def test_floor_parse_and_tokenize(benchmark, corpus) -> None:
    found, texts = corpus
    benchmark.extra_info["MB"] = _megabytes(found)
    benchmark.pedantic(_floor, args=(found, texts), rounds=3, iterations=1)


def _import(found: list[ImportUnit], out: Path, cache: CompileCache, jobs: int) -> None:
    """What `ctxsim traces import SRC --out OUT` does."""
    import_into(load_all(found, lenient=True, cache=cache, jobs=jobs), out)


@pytest.mark.parametrize("jobs", [1, 2])
def test_cold_import(benchmark, corpus, tmp_path: Path, jobs: int) -> None:
    found, _ = corpus
    benchmark.extra_info["MB"] = _megabytes(found)
    root = tmp_path / "cache"
    out = tmp_path / "out"

    def setup() -> tuple[tuple[CompileCache], dict[str, object]]:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        return (CompileCache(root),), {}

    benchmark.pedantic(
        lambda cache: _import(found, out, cache, jobs), setup=setup, rounds=3, iterations=1
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_warm_import(benchmark, corpus, tmp_path: Path, jobs: int) -> None:
    found, _ = corpus
    benchmark.extra_info["MB"] = _megabytes(found)
    cache = CompileCache(tmp_path / "cache")
    out = tmp_path / "out"
    _import(found, out, cache, jobs)

    benchmark.pedantic(lambda: _import(found, out, cache, jobs), rounds=5, iterations=1)
