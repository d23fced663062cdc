"""Sweeps (simulator/app/sweep.py, `ctxsim sweep`): grid parsing, cells, the dataset, executors
agreeing with a plain replay, resume, and a sweep killed with SIGKILL and rerun."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from click.testing import CliRunner

from simulator import frames as outputs
from simulator import policy as registry
from simulator import run as service
from simulator.app import sweep as sw
from simulator.app.cli import main
from simulator.app.cli_sweep import progress_line
from simulator.frames import REQUEST_ORDER, inert_grid_keys
from simulator.workers import start_fork_server
from tests.support import SAMPLES
from traces.load import load_all, units

CTXSIM = Path(sys.executable).parent / "ctxsim"
BUFFER = "autocompact.buffer_tokens"
COLUMN = "autocompact__buffer_tokens"


@pytest.fixture(scope="module")
def samples() -> list[tuple[str, Any]]:
    return [(item.name.removesuffix(".ctxt"), item.trace) for item in load_all(units([SAMPLES]))]


def small_config() -> sw.SweepConfig:
    """Two policies x three buffers: six cells."""
    return sw.SweepConfig(
        policies=("claude-code@2.1.88", "claude-code@1.0"),
        grid=((None, BUFFER, [8_000, 13_000, 30_000]),),
    )


def digests(root: Path) -> dict[str, str]:
    """Every file under root (relative path -> sha256)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- grid values --------------------------------------------------------------------------


def test_ranges_include_stop_only_on_the_grid() -> None:
    assert sw.parse_values("5000:20000:5000") == [5000, 10000, 15000, 20000]
    assert sw.parse_values("5000:22000:5000") == [5000, 10000, 15000, 20000]
    assert sw.parse_values("1_000:3_000:1_000") == [1000, 2000, 3000]
    assert sw.parse_values("0.1:0.5:0.1") == [0.1, 0.2, 0.3, 0.4, 0.5]  # no 0.30000000000000004
    assert sw.parse_values("0.5:1:0.25") == [0.5, 0.75, 1.0]
    assert sw.parse_values("3:3:1") == [3]


def test_lists_are_json_values_or_text() -> None:
    assert sw.parse_values("1,2,3") == [1, 2, 3]
    assert sw.parse_values("true, false, null") == [True, False, None]
    assert sw.parse_values("5m,1h,recorded") == ["5m", "1h", "recorded"]
    assert sw.parse_values('[[1, 2], {"a": 1}]') == [[1, 2], {"a": 1}]
    assert sw.parse_values("1,1,2") == [1, 2]  # a repeated value is one cell


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1:10:0", "positive"),
        ("10:1:1", "empty"),
        ("0:1e9:1", "at most"),
        ("1,,2", "empty value"),
        ("[1, 2", "JSON array"),
        ("", "no values"),
    ],
)
def test_bad_values_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(sw.SweepError, match=message):
        sw.parse_values(text)


def test_grid_options_take_an_optional_policy_scope() -> None:
    assert sw.parse_grid("snip.enabled=true,false") == (None, "snip.enabled", [True, False])
    scoped = sw.parse_grid("claude-code@1.0:autocompact.buffer_tokens=1000:3000:1000")
    assert scoped == ("claude-code@1.0", BUFFER, [1000, 2000, 3000])
    with pytest.raises(sw.SweepError, match="expected"):
        sw.parse_grid("no-equals-sign")


def test_a_sweep_file_and_the_command_line_merge(tmp_path: Path) -> None:
    (tmp_path / "cc8k.toml").write_text(
        'extends = "claude-code@2.1.88"\n[params]\n"autocompact.buffer_tokens" = 8000\n'
    )
    path = tmp_path / "sweep.toml"
    path.write_text(
        'policies = ["claude-code@2.1.88", "cc8k.toml"]\nseed = 3\n'
        '[params]\n"snip.enabled" = true\n'
        '[grid]\n"autocompact.buffer_tokens" = { start = 5000, stop = 15000, step = 5000 }\n'
        '"cache.ttl" = ["5m", "1h"]\n'
        '"claude-code@2.1.88:autocompact.reserve_cap_tokens" = "10000:20000:10000"\n'
    )
    config = sw.load_sweep_file(path)
    assert config.policies == ("claude-code@2.1.88", str(tmp_path / "cc8k.toml"))
    assert config.seed == 3
    assert config.grid[0] == (None, BUFFER, [5000, 10000, 15000])
    assert config.grid[2] == (
        "claude-code@2.1.88",
        "autocompact.reserve_cap_tokens",
        [10000, 20000],
    )
    merged = config.merged(sw.SweepConfig(grid=((None, BUFFER, [1000]),), seed=9))
    assert merged.seed == 9
    assert [g[1] for g in merged.grid] == ["cache.ttl", "autocompact.reserve_cap_tokens", BUFFER]
    cells = sw.build_cells(merged)
    # 2.1.88: 1 buffer x 2 TTLs x 2 reserve caps; the variant: 1 buffer x 2 TTLs.
    assert len(cells) == 6
    variant = [c for c in cells if c.spec.label == "cc8k"]
    assert {c.spec.name for c in variant} == {"claude-code@2.1.88"}
    assert all(dict(c.spec.params)["snip.enabled"] is True for c in cells)
    assert all(dict(c.spec.params)[BUFFER] == 1000 for c in cells)


def test_bad_sweep_files_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('policies = ["claude-code"]\nworkers = 3\n')
    with pytest.raises(sw.SweepError, match=r"bad\.toml: unknown key 'workers'"):
        sw.load_sweep_file(path)
    path.write_text('[grid]\n"x" = { start = 1, stop = 2 }\n')
    with pytest.raises(sw.SweepError, match=r"bad\.toml: grid 'x'"):
        sw.load_sweep_file(path)


# -- cells --------------------------------------------------------------------------------


def test_cells_are_the_product_of_policies_and_grid_values() -> None:
    config = sw.SweepConfig(
        policies=("claude-code@2.1.88", "none"),
        grid=((None, BUFFER, [1000, 2000, 3000]), (None, "snip.enabled", [False, True])),
    )
    cells = sw.build_cells(config)
    # `none` has neither parameter: one cell; claude-code: 3 x 2.
    assert [c.spec.label for c in cells] == ["claude-code@2.1.88"] * 6 + ["none"]
    first = cells[0]
    assert first.values == ((BUFFER, 1000), ("snip.enabled", False))
    assert first.defaults == ((BUFFER, 13_000), ("snip.enabled", False))
    assert (
        first.spec
        == registry.build("claude-code@2.1.88", {BUFFER: 1000, "snip.enabled": False}).spec()
    )
    label, digest = first.key
    assert first.path == f"data/policy={label}/{digest}.parquet"
    assert len({c.key for c in cells}) == len(cells)


def test_a_misspelt_parameter_fails_with_a_hint() -> None:
    config = sw.SweepConfig(policies=("claude-code",), grid=((None, "autocompact.bufer", [1]),))
    with pytest.raises(sw.SweepError, match=re.escape("did you mean 'autocompact.buffer_tokens'")):
        sw.build_cells(config)
    two = sw.SweepConfig(policies=("claude-code", "none"), grid=((None, "nope", [1]),))
    with pytest.raises(sw.SweepError, match="no parameter 'nope'"):
        sw.build_cells(two)
    scoped = sw.SweepConfig(policies=("none",), grid=(("claude-code", BUFFER, [1]),))
    with pytest.raises(sw.SweepError, match="not selected"):
        sw.build_cells(scoped)


# -- the dataset and the executors --------------------------------------------------------


def test_the_dataset_holds_the_rows_of_a_plain_replay(tmp_path: Path, samples) -> None:
    config = small_config()
    cells = sw.build_cells(config)
    result = sw.run_sweep(
        tmp_path, cells, config, sw.SweepSettings(samples), executor_name="serial"
    )
    assert (result.cells, result.skipped, result.computed) == (6, 0, 6)
    data = pl.scan_parquet(tmp_path / "data/**/*.parquet", hive_partitioning=True).collect()
    # The rows of the run service with the loss proxies, `ts_ms` as a UTC timestamp `ts`.
    expected = pl.concat(
        [service.rows(samples, registry.from_spec(c.spec)) for c in cells], how="vertical"
    )
    assert set(outputs.LOSS_SCHEMA) <= set(data.columns)
    assert "ts_ms" not in data.columns and data["ts"].dtype == pl.Datetime("ms", "UTC")
    assert data["ts"].dt.epoch("ms").sort().equals(expected["ts_ms"].sort(), check_names=False)
    order = list(REQUEST_ORDER)
    plain = expected.drop("ts_ms").columns
    assert data.select(plain).sort(order).equals(expected.select(plain).sort(order))
    assert data["params_hash"].dtype == pl.String
    assert result.rows == expected.height
    manifest = orjson.loads((tmp_path / sw.MANIFEST_FILE).read_bytes())
    assert manifest["settings"]["seed"] == 0
    assert [t["name"] for t in manifest["settings"]["traces"]] == [n for n, _ in samples]
    assert manifest["grids"] == [config.as_dict()]
    for entry, cell in zip(manifest["cells"], cells, strict=True):
        assert entry["params_hash"] == cell.spec.param_hash
        assert entry["spec"]["params"] == dict(cell.spec.params)
        file = tmp_path / entry["path"]
        assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert entry["rows"] == pl.read_parquet(file).height
    table = pl.read_parquet(tmp_path / sw.CELLS_FILE)
    assert table.columns[:3] == ["policy", "params_hash", COLUMN]
    assert table[COLUMN].to_list() == [8_000, 13_000, 30_000] * 2
    assert table.columns[3:] == list(sw.CELL_FIGURES)
    assert table["refetch_calls"].null_count() == 6  # open loop: not modelled
    cost = table.filter(pl.col("params_hash") == cells[0].spec.param_hash)["cost_total"].item()
    assert cost == pytest.approx(
        data.filter(pl.col("params_hash") == cells[0].spec.param_hash)["cost_total"].sum()
    )


def test_process_pools_of_one_and_two_workers_write_the_serial_bytes(
    tmp_path: Path, samples
) -> None:
    config = small_config()
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    runs = {}
    for name, executor, workers in [
        ("serial", "serial", 1),
        ("p1", "process", 1),
        ("p2", "process", 2),
    ]:
        result = sw.run_sweep(
            tmp_path / name, cells, config, settings, executor_name=executor, workers=workers
        )
        assert result.computed == len(cells)
        runs[name] = digests(tmp_path / name)
        if executor == "process":
            # One figure per worker process that ran a cell. The pool starts `workers`
            # processes, but one of them may take every cell before the other is up, so the
            # count of processes that report is between 1 and `workers`, never more.
            assert 1 <= len(result.peak_rss) <= workers
            assert os.getpid() not in result.peak_rss
            assert all(peak > 10 * 2**20 for peak in result.peak_rss.values())
    assert runs["serial"] == runs["p1"] == runs["p2"]


def test_a_fork_server_started_early_serves_the_pool(tmp_path: Path, samples) -> None:
    """`ctxsim sweep` starts the fork server before it loads the traces (issue 16): the
    pool then forks its workers from that server and writes the serial bytes."""
    config = small_config()
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    start_fork_server(sw._context())
    start_fork_server(sw._context())  # a second call finds it running
    early = sw.run_sweep(
        tmp_path / "early", cells, config, settings, executor_name="process", workers=2
    )
    sw.run_sweep(tmp_path / "serial", cells, config, settings, executor_name="serial")
    assert early.computed == len(cells)
    assert digests(tmp_path / "early") == digests(tmp_path / "serial")


def _children() -> list[Any]:
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("ForkServer")]


def test_a_pool_started_before_its_traces_writes_the_serial_bytes(tmp_path: Path, samples) -> None:
    """`ctxsim sweep` starts the pool before it loads the traces and feeds each trace as it
    is decoded (issue 16, `StartedPool`): fed out of order, twice, or only in part, the
    workers replay exactly the sweep's list of traces, and the files are the serial ones."""
    config = small_config()
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    sw.run_sweep(tmp_path / "serial", cells, config, settings, executor_name="serial")
    for workers in (1, 2):
        started = sw.start_pool([c.spec for c in cells], settings.run_settings, workers)
        for _, trace in reversed(samples[1:]):  # the first never fed: `give` sends it
            started.feed(trace)
            started.feed(trace)  # once only
        out = tmp_path / f"started-{workers}"
        result = sw.run_sweep(out, cells, config, settings, started=started)
        assert result.computed == len(cells)
        assert 1 <= len(result.peak_rss) <= workers and os.getpid() not in result.peak_rss
        assert digests(out) == digests(tmp_path / "serial")


def test_a_started_pool_stops_whenever_the_sweep_stops(tmp_path: Path, samples) -> None:
    """Closed before its traces came (bad input while loading, Ctrl-C), or handed to a
    sweep it was not started for, a started pool ends its waiting workers and nothing is
    computed."""
    config = small_config()
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    specs = [c.spec for c in cells]
    started = sw.start_pool(specs, settings.run_settings, 2, tmp_path / "never")
    started.feed(samples[0][1])
    started.close()
    started.close()  # a second close does nothing
    assert not _children()
    assert not (tmp_path / "never").exists()
    for other_specs, other_settings in [
        (specs[:1], settings.run_settings),
        (specs, sw.run_settings(1, "auto", False)),
    ]:
        other = sw.start_pool(other_specs, other_settings, 2)
        with pytest.raises(sw.SweepError, match="other cells or settings"):
            sw.run_sweep(tmp_path / "other", cells, config, settings, started=other)
        assert not _children()
    assert not list((tmp_path / "other").rglob("*.parquet"))


def test_a_sweep_that_fails_while_loading_stops_its_workers(tmp_path: Path) -> None:
    """A damaged line under --strict stops `ctxsim sweep` while its started workers wait
    for the traces: one error line, exit 2, no worker left and no cell computed."""
    src = tmp_path / "in"
    src.mkdir()
    bad = Path(__file__).parents[2] / "fixtures" / "bad" / "invalid_json.jsonl"
    (src / "s.jsonl").write_bytes(bad.read_bytes())
    out = tmp_path / "o"
    result = sweep_cli(src, "--strict", "--grid", f"{BUFFER}=1000,2000", "--out", out)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert "invalid JSON" in result.output
    assert not _children()
    assert not out.exists()


def test_duckdb_reads_the_dataset_as_it_is(tmp_path: Path, samples) -> None:
    duckdb = pytest.importorskip("duckdb")
    config = small_config()
    sw.run_sweep(
        tmp_path, sw.build_cells(config), config, sw.SweepSettings(samples), executor_name="serial"
    )
    pattern = str(tmp_path / "data" / "**" / "*.parquet")
    rows = duckdb.sql(
        f"select policy, params_hash, count(*) as n from read_parquet('{pattern}', "
        "hive_partitioning = true) group by all order by all"
    ).fetchall()
    assert len(rows) == 6
    assert all(isinstance(r[1], str) and len(r[1]) == 12 for r in rows)


def test_a_rerun_skips_finished_cells_and_redoes_partial_ones(tmp_path: Path, samples) -> None:
    config = small_config()
    cells = sw.build_cells(config)
    settings = sw.SweepSettings(samples)
    sw.run_sweep(tmp_path, cells, config, settings, executor_name="serial")
    before = digests(tmp_path)
    # One cell lost, one truncated as a crash of something else could leave it, and the
    # temporary file of a write that was killed.
    (tmp_path / cells[0].path).unlink()
    truncated = tmp_path / cells[1].path
    truncated.write_bytes(truncated.read_bytes()[:100])
    leftover = truncated.parent / f".{truncated.name}.abc.tmp"
    leftover.write_bytes(b"PAR1 half")
    result = sw.run_sweep(tmp_path, cells, config, settings, executor_name="serial")
    assert (result.skipped, result.computed, result.removed_leftovers) == (4, 2, 1)
    assert digests(tmp_path) == before
    again = sw.run_sweep(tmp_path, cells, config, settings, executor_name="serial")
    assert (again.skipped, again.computed) == (6, 0)
    assert digests(tmp_path) == before


def test_a_sweep_can_grow_but_not_change_settings(tmp_path: Path, samples) -> None:
    config = small_config()
    settings = sw.SweepSettings(samples)
    sw.run_sweep(tmp_path, sw.build_cells(config), config, settings, executor_name="serial")
    wider = sw.SweepConfig(
        policies=("claude-code@2.1.88",), grid=((None, BUFFER, [13_000, 50_000]),)
    )
    result = sw.run_sweep(tmp_path, sw.build_cells(wider), wider, settings, executor_name="serial")
    assert (result.skipped, result.computed) == (1, 1)
    manifest = orjson.loads((tmp_path / sw.MANIFEST_FILE).read_bytes())
    assert len(manifest["cells"]) == 7
    assert manifest["grids"] == [config.as_dict(), wider.as_dict()]
    assert pl.read_parquet(tmp_path / sw.CELLS_FILE).height == 7
    other = sw.SweepSettings(samples, seed=1)
    with pytest.raises(sw.SweepError, match="other seed"):
        sw.run_sweep(tmp_path, sw.build_cells(wider), wider, other, executor_name="serial")


# -- the command --------------------------------------------------------------------------


def sweep_cli(*args: str | Path) -> Any:
    return CliRunner().invoke(main, ["sweep", *(str(a) for a in args)])


def test_sweep_command_writes_dataset_manifest_table_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [SAMPLES, "--policy", "claude-code@2.1.88", "--policy", "claude-code@1.0"]
    args += ["--grid", f"{BUFFER}=10000:30000:10000", "-G", "snip.enabled=false,true"]
    args += ["--out", out, "--workers", "2"]
    result = sweep_cli(*args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("sweep: 12 cell(s), 0 finished before, 12 computed in ")
    assert "on 2 process(es); peak memory per worker" in result.output
    assert "claude-code@1.0" in result.output and "snip.enabled" in result.output
    charts = sorted(p.name for p in (out / "charts").iterdir())
    assert charts == [
        "heatmap-autocompact.buffer_tokens-vs-snip.enabled.png",
        "loss-autocompact.buffer_tokens.png",
        "loss-snip.enabled.png",
        "param-autocompact.buffer_tokens.png",
        "param-snip.enabled.png",
    ]
    first = digests(out)
    again = sweep_cli(*args)
    assert again.exit_code == 0, again.output
    assert "12 finished before, 0 computed" in again.output
    assert digests(out) == first  # charts and cells table too: byte-identical


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grid", "autocompact.bufer_tokens=1,2"], "did you mean 'autocompact.buffer_tokens'"),
        (["--grid", f"{BUFFER}=5:1:1"], "empty"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--address", "auto"], "--address needs --executor ray"),
        (["-P", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_sweep_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str):
    result = sweep_cli(SAMPLES, *args, "--out", tmp_path / "o")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert message in result.output
    assert not (tmp_path / "o").exists()


def test_progress_line() -> None:
    p = sw.Progress(total=120, skipped=20, done=17, elapsed=4.0)
    line = progress_line(p, width=10)
    assert line == "sweeping [###-------] 37/120 cells  4.2 cells/s  0:00:20 left"
    assert progress_line(sw.Progress(10, 0, 0, 0.0), width=4).endswith("-:--:-- left")


# -- killed and rerun ---------------------------------------------------------------------

KILL_ARGS = ["--policy", "claude-code@2.1.88", "--grid", f"{BUFFER}=1000:240000:1000"]
KILL_ARGS += ["--workers", "2", "--no-charts"]


def test_a_sweep_killed_with_sigkill_resumes_to_the_same_dataset(tmp_path: Path) -> None:
    """The whole process group (driver, fork server, workers) dies at once mid-sweep; the
    rerun finishes it, and the directory then equals an uninterrupted sweep's, byte for
    byte (dataset, manifest and cells table)."""
    env = {**os.environ, "CTXSIM_CACHE_DIR": str(tmp_path / "cache")}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    command = [str(CTXSIM), "sweep", str(SAMPLES), *KILL_ARGS]
    proc = subprocess.Popen(
        [*command, "--out", str(killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list((killed / "data").glob("*/*.parquet"))) >= 20:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    written = len(list((killed / "data").glob("*/*.parquet")))
    assert 20 <= written < 240, written
    manifest = orjson.loads((killed / sw.MANIFEST_FILE).read_bytes())
    assert "sha256" not in manifest["cells"][0]  # it never finished
    resumed = subprocess.run(
        [*command, "--out", str(killed)], env=env, capture_output=True, text=True, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"{written} finished before" in resumed.stdout
    full = subprocess.run(
        [*command, "--out", str(clean)], env=env, capture_output=True, text=True, check=False
    )
    assert full.returncode == 0, full.stderr
    assert not list(killed.rglob("*.tmp"))
    assert digests(killed) == digests(clean)
    assert len(digests(clean)) == 240 + 2


def test_a_sweep_refuses_to_resume_across_a_change_of_cache_rules_model_facts_or_code(
    tmp_path: Path, samples, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of a spec depend on the cache rules, the model facts and the code of the
    engine and the policies as well as on its parameters: a sweep made under other ones is
    not resumed."""
    config = small_config()
    settings = sw.SweepSettings(samples)
    sw.run_sweep(tmp_path, sw.build_cells(config), config, settings, executor_name="serial")
    manifest = orjson.loads((tmp_path / sw.MANIFEST_FILE).read_bytes())
    recorded = {k: manifest["settings"][k] for k in ("cache_rules", "model_facts", "replay_code")}
    assert recorded == outputs.rules_versions()
    for key, message in (
        ("cache_rules", "other cache rules"),
        ("model_facts", "other model facts"),
        ("replay_code", "other replay code"),
    ):
        changed = {**recorded, key: "0" * 12}
        monkeypatch.setattr(sw, "rules_versions", lambda changed=changed: changed)
        with pytest.raises(sw.SweepError, match=message):
            sw.run_sweep(tmp_path, sw.build_cells(config), config, settings, executor_name="serial")
    monkeypatch.setattr(sw, "rules_versions", lambda: recorded)
    result = sw.run_sweep(
        tmp_path, sw.build_cells(config), config, settings, executor_name="serial"
    )
    assert result.computed == 0


def test_row_figures_of_a_many_chunk_frame_are_one_row(samples) -> None:
    """A replay's rows come in many chunks; the figures (the re-fetch ones null in the open
    loop) are one row all the same, equal to those of the rechunked frame."""
    rows = service.rows(samples, registry.build("claude-code@2.1.88"))
    parts = pl.concat([rows[:7], rows[7:30], rows[30:]], how="vertical", rechunk=False)
    assert parts.n_chunks() == 3
    figures = sw.row_figures(parts)
    assert figures.height == 1 and figures.columns == list(sw.CELL_FIGURES)
    assert figures.equals(sw.row_figures(rows.rechunk()))
    assert figures["refetch_calls"].item() is None
    assert figures["compactions"].item() == (rows["kind"] == "compaction").sum()


# -- a swept parameter that changes nothing ---------------------------------------------------


def _cells(rows: list[tuple[str, int, bool, float, int]]) -> pl.DataFrame:
    """A cells table: (policy, buffer, snip, cost, compactions) per cell, the other
    figures alike in every cell."""
    cols = ("policy", "autocompact__buffer_tokens", "snip__enabled", "cost_total", "compactions")
    frame = pl.DataFrame(rows, schema=list(cols), orient="row")
    return frame.with_columns(pl.lit("h").alias("params_hash"), pl.lit(0).alias("overflows"))


def test_a_parameter_is_inert_where_cells_differing_in_it_alone_agree() -> None:
    # The buffer moves nothing under @1.0 (a share of the window) nor @2.1.88 here: inert;
    # snip moves @2.1.88's cost: not inert, although @1.0's cells agree along it.
    cells = _cells(
        [
            ("claude-code@1.0", 10_000, False, 5.0, 2),
            ("claude-code@1.0", 20_000, False, 5.0, 2),
            ("claude-code@1.0", 10_000, True, 5.0, 2),
            ("claude-code@1.0", 20_000, True, 5.0, 2),
            ("claude-code@2.1.88", 10_000, False, 6.0, 3),
            ("claude-code@2.1.88", 20_000, False, 6.0, 3),
            ("claude-code@2.1.88", 10_000, True, 5.5, 3),
            ("claude-code@2.1.88", 20_000, True, 5.5, 3),
        ]
    )
    assert inert_grid_keys(cells) == ["autocompact__buffer_tokens"]
    # One figure apart (a compaction more in one cell): the buffer mattered there.
    moved = cells.with_columns(
        pl.when((pl.col("autocompact__buffer_tokens") == 20_000) & pl.col("snip__enabled"))
        .then(4)
        .otherwise(pl.col("compactions"))
        .alias("compactions")
    )
    assert inert_grid_keys(moved) == []


def test_a_parameter_no_two_cells_differ_in_alone_is_not_called_inert() -> None:
    # Each policy sweeps its own values: no pair of cells differs in the buffer alone.
    cells = _cells(
        [("claude-code@1.0", 10_000, False, 5.0, 2), ("claude-code@2.1.88", 20_000, False, 5.0, 2)]
    )
    assert inert_grid_keys(cells) == []


def test_the_sweep_command_says_when_a_swept_parameter_changed_nothing(tmp_path: Path) -> None:
    """claude-code@1.0 compacts at a share of the window: its buffer is read by nothing."""
    args = [SAMPLES, "--policy", "claude-code@1.0", "--grid", f"{BUFFER}=10000,30000"]
    result = sweep_cli(*args, "--out", tmp_path / "out", "--no-charts")
    assert result.exit_code == 0, result.output
    assert f"note: {BUFFER} changed nothing" in result.output
    other = sweep_cli(
        SAMPLES, "--policy", "claude-code@2.1.88", "--grid", f"{BUFFER}=1000,150000",
        "--out", tmp_path / "other", "--no-charts",
    )  # fmt: skip
    assert other.exit_code == 0, other.output
    assert "changed nothing" not in other.output
