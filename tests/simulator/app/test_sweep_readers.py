"""Sweep and tuning Parquet read by any tool with no option beyond hive partitioning (issue
15): pyarrow.dataset, pyarrow.parquet.read_table, polars, and DuckDB where it is installed.
No column name holds a dot, times are timestamp[ms, UTC], the partition column is only in
the path, and a policy label a reader would take for a number or a date is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from simulator import run as service
from simulator.app import sweep as sw
from simulator.frames import REQUEST_ORDER
from simulator.policy import from_spec
from tests.support import SAMPLES
from traces.load import load_all, units

BUFFER = "autocompact.buffer_tokens"
TIMESTAMP = pa.timestamp("ms", tz="UTC")


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[sw.Cell], pl.DataFrame]:
    """A sweep of two policies over two grid parameters (one dotted), and the rows a plain
    run of its cells gives (in the cell files' order)."""
    samples: list[tuple[str, Any]] = [
        (item.name.removesuffix(".ctxt"), item.trace) for item in load_all(units([SAMPLES]))
    ]
    config = sw.SweepConfig(
        policies=("claude-code@2.1.88", "claude-code@1.0"),
        grid=((None, BUFFER, [8_000, 30_000]), (None, "snip.enabled", [False, True])),
    )
    cells = sw.build_cells(config)
    out = tmp_path_factory.mktemp("sweep")
    sw.run_sweep(out, cells, config, sw.SweepSettings(samples), executor_name="serial")
    expected = pl.concat(
        [service.rows(samples, from_spec(c.spec)) for c in cells], how="vertical"
    ).sort(list(REQUEST_ORDER))
    return out, cells, expected


def _check(frame: pl.DataFrame, expected: pl.DataFrame) -> None:
    """Every reader gives the run service's rows: same values, `ts` the same instants."""
    assert frame.height == expected.height
    assert set(frame.columns) == set(expected.columns) - {"ts_ms"} | {"ts"}
    got = frame.with_columns(pl.col("policy").cast(pl.String)).sort(list(REQUEST_ORDER))
    assert got["ts"].dt.epoch("ms").equals(expected["ts_ms"], check_names=False)
    plain = [c for c in expected.columns if c != "ts_ms"]
    assert got.select(plain).equals(expected.select(plain))


def test_pyarrow_dataset_with_hive_partitioning(swept) -> None:
    out, cells, expected = swept
    table = ds.dataset(out / sw.DATA_DIR, partitioning="hive").to_table()
    assert table.schema.field("ts").type == TIMESTAMP
    assert pa.types.is_string(table.schema.field("policy").type)
    assert pa.types.is_large_string(table.schema.field("params_hash").type)
    assert table.column_names.count("policy") == 1
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    _check(frame, expected)
    assert sorted(set(frame["params_hash"])) == sorted(c.spec.param_hash for c in cells)


def test_pyarrow_read_table(swept) -> None:
    out, _cells, expected = swept
    table = pq.read_table(out / sw.DATA_DIR)
    assert table.schema.field("ts").type == TIMESTAMP
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    _check(frame, expected)


def test_polars_reads_the_directory_and_the_glob(swept) -> None:
    out, _cells, expected = swept
    by_dir = pl.read_parquet(out / sw.DATA_DIR, hive_partitioning=True)
    by_glob = pl.scan_parquet(out / sw.DATA_DIR / "**" / "*.parquet", hive_partitioning=True)
    for frame in (by_dir, by_glob.collect(), sw.scan(out).collect()):
        assert frame.schema["ts"] == pl.Datetime("ms", "UTC")
        assert frame.schema["params_hash"] == pl.String
        _check(frame, expected)


def test_duckdb_reads_the_dataset_and_the_tables_without_quoting(swept) -> None:
    duckdb = pytest.importorskip("duckdb")
    out, cells, expected = swept
    pattern = str(out / sw.DATA_DIR / "**" / "*.parquet")
    rows = duckdb.sql(
        f"select policy, params_hash, count(*) as n, min(ts) as first from read_parquet("
        f"'{pattern}', hive_partitioning = true) group by all order by all"
    ).fetchall()
    assert len(rows) == len(cells)
    assert all(isinstance(r[1], str) and len(r[1]) == 12 for r in rows)
    assert sum(r[2] for r in rows) == expected.height
    assert all(r[3].tzinfo is not None for r in rows)
    cheapest = duckdb.sql(
        f"select autocompact__buffer_tokens, cost_total from '{out / sw.CELLS_FILE}' "
        "order by cost_total limit 1"
    ).fetchall()
    assert cheapest and cheapest[0][0] in (8_000, 30_000)


def test_cells_table_has_no_dotted_column_and_every_reader_agrees(swept) -> None:
    out, cells, _expected = swept
    path = out / sw.CELLS_FILE
    table = pq.read_table(path)
    assert not [c for c in table.column_names if "." in c]
    grid = ["autocompact__buffer_tokens", "snip__enabled"]
    assert table.column_names[:4] == ["policy", "params_hash", *grid]
    assert pl.from_arrow(table).equals(pl.read_parquet(path))
    assert ds.dataset(path).to_table().num_rows == len(cells)


def test_column_names_and_their_clash() -> None:
    assert sw.column_name(BUFFER) == "autocompact__buffer_tokens"
    assert sw.column_name("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE") == "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"
    with pytest.raises(sw.SweepError, match="share a column name"):
        sw.column_names(["a.b", "a__b"])


@pytest.mark.parametrize("label", ["123", "2024-01-01", "0x1f", "true", "NaN", "inf", ".5"])
def test_a_label_a_reader_would_type_is_refused(label: str) -> None:
    with pytest.raises(sw.SweepError, match="must start with a letter"):
        sw.check_label(label)


def test_a_variant_named_like_a_date_is_refused_before_any_cell(tmp_path: Path) -> None:
    variant = tmp_path / "2026-11-30.toml"
    variant.write_text('extends = "claude-code@2.1.88"\n')
    config = sw.SweepConfig(policies=(str(variant),), grid=((None, BUFFER, [1000, 2000]),))
    with pytest.raises(sw.SweepError, match="'2026-11-30'"):
        sw.build_cells(config)
    for fine in ("claude-code@2.1.88", "none", "cc-buffer-8k", "e5"):
        sw.check_label(fine)


def test_trials_and_pareto_tables_read_anywhere(tmp_path: Path) -> None:
    """A multi-objective study's trials.parquet and pareto.parquet: no dotted column, and
    pyarrow reads what polars wrote."""
    pytest.importorskip("optuna")
    from click.testing import CliRunner

    from simulator.app.cli import main

    args = ["tune", str(SAMPLES), "--policy", "claude-code@2.1.88"]
    args += ["--param", f"{BUFFER}=1000:60000:1000", "--objective", "cost"]
    args += ["--objective", "stale_file_refs", "--trials", "6", "--population", "4"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("trials.parquet", "pareto.parquet"):
        table = pq.read_table(tmp_path / name)
        assert "autocompact__buffer_tokens" in table.column_names
        assert not [c for c in table.column_names if "." in c]
        assert pl.from_arrow(table).equals(pl.read_parquet(tmp_path / name))
