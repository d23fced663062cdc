"""A run directory's files and errors (simulator/app/files.py): every output error is one line
and exit 2 (R15, R16), outputs are 0644 (R21), a run replaces what an earlier run wrote and
keeps the rest, and never writes or removes through a symbolic link (R19)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from simulator.app.cli import main
from simulator.app.files import STAGE_MARK, OutputError, StagedDir, atomic_write
from tests.support import ROOT
from tests.support.report_helpers import trace_a, trace_b
from traces import compiled


def ctxsim(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, trace in (("a", trace_a()), ("b", trace_b())):
        compiled.write(trace, folder / f"{name}.ctxt")
    return folder


def _run(src: Path, out: Path, *more: str) -> Result:
    return ctxsim("run", src, "--no-cache", "--session-charts", "1", "--out", out, *more)


def _one_error_line(result: Result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_out_that_is_a_file_or_under_a_file_is_one_line(src: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_error_line(_run(src, afile), "afile", "it is a file, not a directory")
    _one_error_line(_run(src, afile / "run"), "afile is a file, not a directory")
    assert afile.read_text() == "x"
    # a file where the run puts a directory (charts/) stops the run; the old run is kept
    out = tmp_path / "run"
    assert _run(src, out).exit_code == 0
    before = _snapshot(out)
    shutil.rmtree(out / "charts")
    (out / "charts").write_text("the user's")
    before = _snapshot(out)
    _one_error_line(_run(src, out, "--seed", "1"), "charts is a file where a directory")
    assert _snapshot(out) == before
    assert not [p for p in tmp_path.iterdir() if STAGE_MARK in p.name]


def test_a_directory_that_holds_files_but_no_run_is_refused(src: Path, tmp_path: Path) -> None:
    """`--out` naming a folder of other things (a system directory, a home) would swap it
    for a copy; only a new, an empty or a run directory is written."""
    folder = tmp_path / "things"
    folder.mkdir()
    (folder / "a.txt").write_text("mine")
    _one_error_line(_run(src, folder), "holds files but no ctxsim run")
    assert [p.name for p in folder.iterdir()] == ["a.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(src, empty).exit_code == 0


def test_an_unwritable_out_is_one_line() -> None:
    """As a user without write permission (R15); root bypasses permissions, so the check
    runs as `nobody` when the tests run as root."""
    import tempfile

    top = Path(tempfile.mkdtemp())
    try:
        os.chmod(top, 0o755)
        locked = top / "locked"
        locked.mkdir(mode=0o555)
        os.chmod(locked, 0o555)
        code = (
            "from pathlib import Path; from simulator.app.files import StagedDir, OutputError\n"
            f"try:\n    StagedDir(Path({str(locked / 'run')!r}))\n"
            "except OutputError as exc:\n    print(exc)\n"
        )
        command = [sys.executable, "-c", code]
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root without setpriv: no user to lack the permission")
            command = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", *command]
        cwd = ROOT
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)
        assert done.stdout.strip() == f"cannot write {locked / 'run'}: permission denied", (
            done.stdout + done.stderr
        )
        assert list(locked.iterdir()) == []
    finally:
        os.chmod(top / "locked", 0o755)
        shutil.rmtree(top)


def test_single_files_are_0644_and_errors_name_the_path(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "x.md"
    atomic_write(target, b"x")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o755
    with pytest.raises(OutputError, match=r"x.md: it is a directory, not a file"):
        (tmp_path / "d" / "x.md").mkdir(parents=True)
        atomic_write(tmp_path / "d" / "x.md", b"x")
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["x.md"]  # no .tmp left


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under root: its mode and its bytes (a link: its target)."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            data = os.readlink(path).encode()
        elif path.is_file():
            data = path.read_bytes()
        else:
            data = b""
        found[str(path.relative_to(root))] = (st.st_mode, data)
    return found


def test_run_outputs_are_0644_in_0755_directories(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(src, out).exit_code == 0
    for path in [out, *out.rglob("*")]:
        want = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_a_run_replaces_the_earlier_runs_files_and_keeps_the_users(
    src: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert _run(src, out, "--session-charts", "2").exit_code == 0
    assert len(list((out / "charts" / "sessions").iterdir())) == 2
    (out / "notes.txt").write_text("mine")
    (out / "charts" / "sessions" / "mine.png").write_bytes(b"a picture")
    (out / "mine").mkdir()
    (out / "mine" / "deep.txt").write_text("deep")
    (out / "link").symlink_to(tmp_path / "elsewhere")
    result = _run(src, out, "--session-charts", "1")
    assert result.exit_code == 0, result.output
    # the earlier run's second session chart is gone, everything of the user's is kept
    assert sorted(p.name for p in (out / "charts" / "sessions").iterdir()) == [
        "a.0.png",
        "mine.png",
    ]
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "mine" / "deep.txt").read_text() == "deep"
    assert os.readlink(out / "link") == str(tmp_path / "elsewhere")
    # a run without a report leaves no report of the earlier run beside its data
    assert _run(src, out, "--no-report").exit_code == 0
    assert not (out / "report.html").exists() and not (out / "charts" / "index.txt").exists()
    assert (out / "charts" / "sessions" / "mine.png").read_bytes() == b"a picture"
    assert not [p for p in tmp_path.iterdir() if STAGE_MARK in p.name]


def test_a_linked_charts_directory_stops_a_run_and_nothing_outside_changes(
    src: Path, tmp_path: Path
) -> None:
    """R19: OUT/charts a link to a folder of the user's pictures."""
    photos = tmp_path / "photos"
    (photos / "2024").mkdir(parents=True)
    (photos / "holiday.png").write_bytes(b"png")
    (photos / "2024" / "cat.png").write_bytes(b"png")
    (photos / "index.txt").write_text("charts/holiday.png\n")
    out = tmp_path / "run"
    assert _run(src, out).exit_code == 0  # an earlier run, whose charts/ became a link
    shutil.rmtree(out / "charts")
    (out / "charts").symlink_to(photos)
    before, run_before = _snapshot(photos), _snapshot(out)
    result = _run(src, out)
    _one_error_line(result, "charts is a symbolic link")
    assert _snapshot(photos) == before
    assert _snapshot(out) == run_before


def test_a_stage_left_by_a_killed_run_is_removed_by_the_next(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(src, out).exit_code == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    left = tmp_path / f".run{STAGE_MARK}{dead.stdout.strip()}-abc"
    left.mkdir()
    (left / "requests.parquet").write_bytes(b"half")
    mine = tmp_path / f".run{STAGE_MARK}{os.getpid()}-live"  # a live process's: kept
    mine.mkdir()
    assert _run(src, out).exit_code == 0
    assert not left.exists() and mine.exists()


def test_a_discarded_stage_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # a run directory
    (out / "keep.txt").write_text("k")
    with StagedDir(out) as stage:
        stage.write("requests.parquet", b"new")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    with pytest.raises(OutputError, match="is not inside it"), StagedDir(out) as stage:
        stage.write("../escape.txt", b"x")
    assert not (tmp_path / "escape.txt").exists()
