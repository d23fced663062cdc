"""Run Parquet files read as they are with any tool (issue 15): times are timestamp[ms, UTC],
no column name holds a dot, and pyarrow (read_table and dataset), polars and DuckDB (where
installed) read every file with no option."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib.metadata import version as package_version
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from simulator import policy as registry
from simulator import run as service
from simulator.app import api
from simulator.frames import prices_date
from simulator.pricing import PriceBook
from tests.support.report_helpers import MINUTE, T0, Toy, trace_a, trace_b

FILES = ("requests", "sessions", "edits")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = api.Run(
        service.run([("a", trace_a()), ("b", trace_b())], [registry.build("as-recorded"), Toy()])
    )
    return api.write(run, tmp_path_factory.mktemp("parquet") / "run")


def test_times_are_utc_millisecond_timestamps(run_dir: Path) -> None:
    requests = pq.read_table(run_dir / "requests.parquet")
    assert requests.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert "ts_ms" not in requests.schema.names
    sessions = pq.read_table(run_dir / "sessions.parquet")
    assert sessions.schema.field("start").type == pa.timestamp("ms", tz="UTC")
    # session a's requests are one minute apart from T0 (tests/support/report_helpers.py)
    rows = pl.read_parquet(run_dir / "requests.parquet").filter(
        (pl.col("trace") == "a") & (pl.col("kind") == "request") & (pl.col("policy") == "toy")
    )
    want = [datetime.fromtimestamp((T0 + k * MINUTE) / 1000, UTC) for k in range(5)]
    assert rows.sort("request")["ts"].to_list() == want
    first = pl.read_parquet(run_dir / "sessions.parquet").row(0, named=True)
    assert first["start"] == datetime.fromtimestamp(T0 / 1000, UTC)
    assert first["duration_s"] == 240.0


def test_no_column_name_holds_a_dot_or_needs_quoting(run_dir: Path) -> None:
    for name in FILES:
        columns = pq.read_schema(run_dir / f"{name}.parquet").names
        assert columns, name
        assert all(c.replace("_", "").isalnum() and c == c.lower() for c in columns), columns


def test_pyarrow_reads_every_file_and_a_dataset_of_them(run_dir: Path) -> None:
    for name in FILES:
        table = pq.read_table(run_dir / f"{name}.parquet")
        assert table.num_rows == pl.read_parquet(run_dir / f"{name}.parquet").height
    dataset = ds.dataset(run_dir / "requests.parquet", format="parquet")
    failed = dataset.to_table(filter=ds.field("failed")).num_rows
    assert failed == 1  # the toy's one overflowing request


def test_polars_reads_every_file_lazily(run_dir: Path) -> None:
    frame = pl.scan_parquet(run_dir / "requests.parquet").select(pl.col("ts").max()).collect()
    assert frame.schema["ts"] == pl.Datetime("ms", "UTC")
    assert frame.item() == datetime.fromtimestamp((T0 + 4 * MINUTE) / 1000, UTC)


def test_duckdb_reads_every_file_without_options(run_dir: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    got = con.execute(
        f"select count(*), max(ts) from read_parquet('{run_dir / 'requests.parquet'}') where failed"
    ).fetchone()
    assert got[0] == 1
    for name in FILES:
        con.execute(f"select * from read_parquet('{run_dir / f'{name}.parquet'}')").fetchall()


def test_the_prices_date_is_the_newest_dated_price_in_force() -> None:
    """genai-prices 0.2.3 dates Gemini 3.6 Flash's end of introductory rates 2027-01-01 and
    Gemini 4 Argon's price 2026-12-01: the newest in force decides the day."""
    if package_version("genai-prices") != "0.2.3":
        pytest.skip("the dates below are those of genai-prices 0.2.3's table")
    newest = prices_date(PriceBook())
    assert newest is not None and newest >= "2026-12-01"
    assert prices_date(PriceBook(as_of=datetime(2026, 12, 15, 12, tzinfo=UTC))) == "2026-12-01"
    assert prices_date(PriceBook(as_of=datetime(2000, 1, 1, tzinfo=UTC))) is None
