"""The per-folder fidelity table (simulator/app/measure/fidelity_folders.py): bars and
figures by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from simulator.app.measure.fidelity_folders import BARS, figures, main, table
from tests.support import SAMPLES


def _rows(session: str, matched: list[bool], rec: list[float], sim: list[float]) -> pl.DataFrame:
    n = len(matched)
    zero = [0] * n
    return pl.DataFrame(
        {
            "trace": [session] * n,
            "session_index": [0] * n,
            "session": [session] * n,
            "kind": ["request"] * n,
            "matched": matched,
            "rec_cache_read": zero,
            "sim_cache_read": zero,
            "rec_cache_write_5m": zero,
            "rec_cache_write_1h": zero,
            "sim_cache_write_5m": zero,
            "sim_cache_write_1h": zero,
            "rec_cost": rec,
            "sim_cost": sim,
        }
    )


def test_figures_by_hand() -> None:
    # Session a: +1% on $2; session b: -3% on $1 -> median |error| 2%, corpus (2.02+0.97-3)/3.
    rows = pl.concat(
        [_rows("a", [True, True], [1.0, 1.0], [1.01, 1.01]), _rows("b", [False], [1.0], [0.97])]
    )
    f = figures(rows)
    assert f["requests"] == 3 and f["sessions"] == 2
    assert abs(f["matched"] - 2 / 3) < 1e-12
    assert abs(f["median"] - 0.02) < 1e-12
    assert abs(f["corpus"] - (2.99 / 3 - 1)) < 1e-12


def test_bars_each_bound() -> None:
    cc = BARS["claude-code"]
    good = {"matched": 0.98, "median": 0.005, "p90": 0.02, "corpus": -0.01}
    assert cc.met(good)
    for key, bad in [("matched", 0.979), ("median", 0.0051), ("p90", 0.021), ("corpus", 0.011)]:
        assert not cc.met({**good, key: bad}), key
    assert BARS["codex"].met({**good, "p90": 0.5, "matched": 0.95, "corpus": 0.02})


def test_table_has_a_line_per_folder_and_all() -> None:
    rows = {"x": _rows("a", [True], [1.0], [1.0]), "y": _rows("b", [False], [1.0], [2.0])}
    lines = table(rows, BARS["claude-code"]).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["x", "y", "all"]
    assert lines[1].endswith("met") and lines[2].endswith("short") and lines[3].endswith("short")


def test_a_policy_other_than_as_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--policy` replays every folder under that policy; an unknown one is a usage
    error, not a traceback."""
    folder = tmp_path / "root" / "samples"
    shutil.copytree(SAMPLES, folder, ignore=shutil.ignore_patterns("*.py", "*.md"))
    assert main([str(tmp_path / "root")]) == 0
    recorded = capsys.readouterr().out.splitlines()
    assert main([str(tmp_path / "root"), "--policy", "claude-code@1.0"]) == 0
    policy = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in policy] == ["folder", "samples", "all"]
    assert policy[1] != recorded[1]  # a 1.0 pipeline is not the recording
    assert main([str(tmp_path / "root"), "--policy", "no-such-policy"]) == 2
    assert capsys.readouterr().out.startswith("usage:")
