"""The sweep's printed table marks dollars that leave out unpriced calls, as `ctxsim run`'s
summary does (simulator/app/cli_sweep.py `_table`)."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from reports.tables import UNPRICED_NOTE
from simulator.app.cli_sweep import _table
from simulator.frames import CELL_FIGURES


def _cells(unpriced: list[int]) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for i, n in enumerate(unpriced):
        row: dict[str, Any] = dict.fromkeys(CELL_FIGURES, 0)
        row.update(policy="codex", params_hash=f"h{i}", window_fraction=0.8 + i / 10)
        row.update(cost_total=10.0 + i, unpriced_calls=n, cache_hit_ratio=0.5)
        row.update(human_verbatim_share=1.0, summary_share=0.0, refetch_cost=0.0)
        rows.append(row)
    return pl.DataFrame(rows).select("policy", "params_hash", "window_fraction", *CELL_FIGURES)


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # every column shown: the cost is the fourth


def _cost_cells(text: str) -> list[str]:
    return [line.split()[3] for line in text.splitlines() if line.startswith("codex")]


def test_a_cell_whose_dollars_leave_out_calls_is_marked() -> None:
    text = _table(_cells([0, 191]), {})
    assert _cost_cells(text) == ["10.0000", "11.0000*"]
    assert UNPRICED_NOTE in text


def test_no_mark_and_no_note_when_every_call_is_priced() -> None:
    text = _table(_cells([0, 0]), {})
    assert _cost_cells(text) == ["10.0000", "11.0000"]
    assert UNPRICED_NOTE not in text
