"""Shared fixtures: where the real traces are (../shared/traces beside the checkout), and
one compiled copy of them per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import SHARED, Named, source_folders
from traces.load import load_all, units


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
