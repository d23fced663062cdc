"""Shared fixtures: where the real traces are (../shared/traces beside the checkout), and
one compiled copy of them per test session."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from simulator.model import Trace
from traces.load import load_all, units

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SAMPLES = ROOT / "traces" / "samples"

#: (name, trace) pairs, in the order `units` finds them.
Named = list[tuple[str, Trace]]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Tests never touch the user's compile cache."""
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def shared() -> Path:
    """The real traces; tests that need them skip cleanly where they are absent."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is absent")
    return SHARED


def source_folders(shared: Path, fmt: str = "") -> list[str]:
    """The source folders of ../shared/traces ("claude-code/vsla", ...), sorted: each holds
    one published source (SOURCES.tsv), the unit of leave-one-source-out measurement."""
    formats = [fmt] if fmt else sorted(p.name for p in shared.iterdir() if p.is_dir())
    return [
        f"{f}/{d.name}"
        for f in formats
        if (shared / f).is_dir() and f != "LICENSES"
        for d in sorted((shared / f).iterdir())
        if d.is_dir()
    ]


@pytest.fixture(scope="session")
def shared_corpus(shared: Path) -> Callable[[str], Named]:
    """`shared_corpus("claude-code")` or `shared_corpus("claude-code/vsla")`: every trace
    below that folder of ../shared/traces, compiled leniently once per test session
    (compiling the 2026 corpus takes tens of seconds and a dozen modules read it). A format
    folder is its source folders in sorted order. Callers must not mutate the traces."""
    memo: dict[str, Named] = {}

    def load(folder: str) -> Named:
        folder = folder.strip("/")
        if "/" not in folder:
            return [t for source in source_folders(shared, folder) for t in load(source)]
        if folder not in memo:
            memo[folder] = [
                (item.name.removesuffix(".ctxt"), item.trace)
                for item in load_all(units([shared / folder]), lenient=True)
            ]
        return memo[folder]

    return load


def stable_pick(items: list[str], k: int, salt: str) -> list[str]:
    """k items chosen by a keyed hash of each: the same choice on every machine and run."""
    ranked = sorted(items, key=lambda s: hashlib.sha256(f"{salt}\0{s}".encode()).digest())
    return ranked[:k]
