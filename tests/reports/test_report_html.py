"""report.html: `ctxsim report` and `ctxsim run` write it; one self-contained, reproducible
file; and it renders in headless Chromium (skipped where Debian's `chromium` is absent)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner, Result

from reports import charts
from simulator import policy as registry
from simulator.app.cli import main
from tests.support import SAMPLES
from tests.support.report_helpers import Toy, trace_a, trace_b, write_run
from traces import compiled

TRACES = [("a", trace_a()), ("b", trace_b())]
RUN_CHARTS = {"cost_by_policy", "cache_hit_ratio", "events_by_policy", "loss_by_policy"}


def ctxsim(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    write_run(out, TRACES, [registry.build("as-recorded"), Toy()])
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.*"))}


def test_report_writes_a_self_contained_reproducible_page(run_dir: Path, tmp_path: Path) -> None:
    result = ctxsim("report", run_dir)
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote report.html and 6 chart(s) to {run_dir}\n"
    first = _files(run_dir)
    assert set(first) == {
        "requests.parquet",
        "sessions.parquet",
        "manifest.json",
        "charts/index.txt",
        "report.html",
        *(f"charts/{name}.png" for name in RUN_CHARTS),
        "charts/sessions/a.0.png",
        "charts/sessions/b.0.png",
    }
    assert ctxsim("report", run_dir).exit_code == 0
    assert _files(run_dir) == first  # byte-identical, charts included

    html = first["report.html"].decode()
    assert html.startswith("<!doctype html>")
    assert "<script" not in html and "http://" not in html and "https://" not in html
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == 6 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert str(tmp_path) not in html and "/tmp" not in html
    for text in ("as-recorded", "toy", "Summary", "Sessions", "human kept", "stale file refs"):
        assert text in html, text
    # the summary row of the toy: 8 requests, 10 calls, 2 compactions, 1 overflow, 1 breaker
    # trip; its overflow marks it as a policy with a failed call, and the note says so
    toy_hash = Toy().spec().param_hash
    row = re.search(rf"<tr><td[^>]*>toy !</td><td[^>]*>{toy_hash}</td>(.*?)</tr>", html)
    assert row is not None
    cells = re.findall(r">([^<]*)</td>", row.group(1))
    assert cells[:5] == ["8", "10", "2", "1", "1"]  # requests, calls, compactions, ...
    assert "! Failed calls: toy (1 of 10 calls) sent a prompt larger than" in html
    assert "as-recorded !" not in html  # as-recorded does not overflow here


def test_session_charts_option_and_stale_charts(run_dir: Path) -> None:
    result = ctxsim("report", run_dir, "--session-charts", "2")
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (run_dir / "charts" / "sessions").iterdir())
    assert len(written) == 2
    mine = run_dir / "charts" / "sessions" / "mine.png"  # not written by ctxsim
    mine.write_bytes(b"a picture of the user's")
    result = ctxsim("report", run_dir, "--session-charts", "1")
    assert result.exit_code == 0, result.output
    # the chart the earlier report wrote and this one does not is gone; the user's stays
    assert sorted(p.name for p in (run_dir / "charts" / "sessions").iterdir()) == [
        "a.0.png",
        "mine.png",
    ]
    index = (run_dir / "charts" / "index.txt").read_text().splitlines()
    assert "charts/sessions/a.0.png" in index and "charts/sessions/mine.png" not in index


def test_a_linked_charts_directory_is_refused_and_nothing_outside_is_touched(
    run_dir: Path, tmp_path: Path
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "holiday.png").write_bytes(b"png")
    (photos / "index.txt").write_text("charts/holiday.png\n")
    (run_dir / "charts").symlink_to(photos)
    result = ctxsim("report", run_dir)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "symbolic link" in result.output
    assert len(result.output.splitlines()) == 1
    assert sorted(p.name for p in photos.iterdir()) == ["holiday.png", "index.txt"]


def test_report_on_something_that_is_not_a_run_exits_2(tmp_path: Path) -> None:
    result = ctxsim("report", tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {tmp_path.name}: no requests.parquet")


def test_run_writes_the_report_and_prints_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry._REGISTRY, Toy.name, Toy)
    src = tmp_path / "traces"
    src.mkdir()
    for name, trace in TRACES:
        compiled.write(trace, src / f"{name}.ctxt")
    out = tmp_path / "out"
    result = ctxsim("run", src, "--policy", "as-recorded", "--policy", "toy", "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "report.html").is_file()
    assert len(list((out / "charts").rglob("*.png"))) == 6
    lines = result.output.splitlines()
    assert lines[0].split()[:2] == ["policy", "params"]  # the table is reports/tables.py's
    assert any(line.startswith("toy ") for line in lines)
    wrote = next(line for line in lines if line.startswith("wrote "))
    assert wrote.startswith(
        "wrote requests.parquet, sessions.parquet, edits.parquet, manifest.json, "
    )
    assert "report.html and 6 chart(s)" in wrote
    assert lines[-1].startswith("input: 2 trace(s); skipped 0 line(s)")

    bare = tmp_path / "bare"
    result = ctxsim("run", src, "--policy", "as-recorded", "--no-report", "--out", bare)
    assert result.exit_code == 0, result.output
    assert {p.name for p in bare.iterdir()} == {
        "requests.parquet",
        "sessions.parquet",
        "edits.parquet",
        "manifest.json",
    }


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless Chromium (Debian's `chromium` package) is not installed")


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run(
        [browser, *flags, *args], capture_output=True, text=True, timeout=90, check=False
    )


def test_the_report_renders_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    assert ctxsim("report", run_dir).exit_code == 0
    page = (run_dir / "report.html").resolve().as_uri()
    dom = _headless(browser, tmp_path / "profile", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h1>ctxsim report</h1>" in dom.stdout
    assert dom.stdout.count("<img ") == 6 and dom.stdout.count("<table") == 3

    shot = tmp_path / "shot.png"
    done = _headless(
        browser, tmp_path / "profile", "--window-size=1280,1600", f"--screenshot={shot}", page
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = np.asarray(mpimg.imread(io.BytesIO(shot.read_bytes()), format="png"))[..., :3]
    assert pixels.shape[:2] == (1600, 1280)

    def painted(hex_color: str) -> int:
        rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        return int((np.abs(pixels - rgb).max(axis=-1) < 0.01).sum())

    # The embedded cost chart was decoded and painted: its bar colours cover real areas.
    colors = {color for _, label, color in charts.COMPONENTS if label != "cache write 1h"}
    for color in colors:
        assert painted(color) > 200, color


def test_the_report_reads_each_policy_against_the_recording(tmp_path: Path) -> None:
    """Recorded against simulated per policy, no sum across policies, and a spec shown by
    what it sets apart from its policy's defaults."""
    from reports.html import build_report
    from simulator.app import api

    samples = SAMPLES
    run = api.replay(
        api.load([samples], cache=False),
        ["as-recorded", "claude-code", ("claude-code@2.1.88", {"autocompact.buffer_tokens": "8k"})],
    )
    out = api.write(run, tmp_path / "run")
    html = build_report(out)["report.html"].decode()
    recorded = run.manifest["recorded_cost"]
    assert recorded is not None and recorded > 0
    assert f"recorded usage priced the same way: ${recorded:,.4f}" in html
    assert "all policies" not in html
    assert "vs recorded" in html
    # The samples' SWE-agent trajectory logged no usage: "vs recorded" is over the other
    # five sessions, and the page says so (the cost column covers all six).
    logged = [s for s in run.sessions.filter(pl.col("policy") == "as-recorded").iter_rows(
        named=True) if s["recorded_cost"] is not None]  # fmt: skip
    assert len(logged) == 5
    base = sum(s["recorded_cost"] for s in logged)
    assert (
        f"vs recorded: the spec&#x27;s dollars against the recording&#x27;s (${base:,.4f}) "
        "over the 5 of 6 replayed sessions (a subagent&#x27;s its own) that logged usage of "
        "priced models; cost covers every "
        "session." in html
    )
    assert "each session under the preset of its recorded version" in html
    base = len(run.manifest["policies"][2]["params"]) - 1
    assert f"autocompact.buffer_tokens=8000; {base} more at their defaults" in html
    assert "the defaults (2 parameters)" in html  # as-recorded


def test_the_session_table_is_pivoted_by_policy_and_the_header_dates_the_prices(
    run_dir: Path,
) -> None:
    """One row per session with a group of columns per spec (the toy's overflow marked), and
    the price table's day (manifest `prices_date`), not the pricing instant 9999-12-31."""
    from reports.html import build_report

    html = build_report(run_dir)["report.html"].decode()
    sessions = html[html.index("<h2>Sessions</h2>") : html.index("<h2>Context over")]
    assert sessions.count("<tr><td") == 2  # sessions a and b, not 2 x 2 policy rows
    assert '<th class="group" colspan="3">as-recorded</th>' in sessions
    assert '<th class="group" colspan="3">toy</th>' in sessions
    row_a = re.search(r"<tr><td[^>]*>a</td>(.*?)</tr>", sessions)
    assert row_a is not None
    cells = re.findall(r">([^<]*)</td>", row_a.group(1))
    # #, session, requests, then as-recorded (cost, compactions, overflows), then the toy
    assert cells[:2] == ["0", "s-a"] and cells[2] == "5"
    # The figures of tests/simulator/test_metrics.py.
    assert cells[4:6] == ["0", "0"] and cells[7:9] == ["2", "1 !"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "9999" not in html.split("</p>", 1)[0].split('class="facts"')[1]
    assert f"its newest rates (the latest dated change: {manifest['prices_date']})" in html


def test_run_draws_the_same_report_with_chart_workers_started_before_its_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ctxsim run` starts chart workers before its replay when the report has enough
    charts (reports/charts.py pool_pays); the files are the bytes drawn without them."""
    monkeypatch.setitem(registry._REGISTRY, Toy.name, Toy)
    src = tmp_path / "traces"
    src.mkdir()
    for name, trace in TRACES:
        compiled.write(trace, src / f"{name}.ctxt")
    started: list[int] = []
    real = charts.ChartPool.__init__

    def counted(self: charts.ChartPool, workers: int = 0) -> None:
        started.append(workers)
        real(self, workers)

    monkeypatch.setattr(charts.ChartPool, "__init__", counted)
    drawn = {}
    for minimum in (100, 1):
        monkeypatch.setattr(charts, "POOL_MIN_CHARTS", minimum)
        out = tmp_path / f"out-{minimum}"
        result = ctxsim("run", src, "--policy", "as-recorded", "--policy", "toy", "--out", out)
        assert result.exit_code == 0, result.output
        drawn[minimum] = _files(out)
    assert started == [0]  # only the run whose report reached the minimum had workers
    assert drawn[1] == drawn[100]
    assert len([n for n in drawn[1] if n.endswith(".png")]) == 6
