"""Shared fixtures: where the real traces are (../shared/traces beside the checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SAMPLES = ROOT / "traces" / "samples"


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
