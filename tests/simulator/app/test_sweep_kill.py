"""A sweep killed with SIGKILL at several points of growing a finished sweep: after every
kill each output is either the old complete file or the new complete one (never a part),
and the resumed sweep ends byte-identical to one that was never interrupted.

The points are events seen on disk, so each phase is hit whatever the machine's speed:
the new manifest written (before any new cell), some new cells written, most of them, and
the new cells table written (the charts being drawn). The kill lands a few milliseconds
after the event, wherever the sweep then is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from simulator.app import sweep as sw
from tests.support import SAMPLES

CTXSIM = Path(sys.executable).parent / "ctxsim"
BUFFER = "autocompact.buffer_tokens"
OLD = ["--policy", "claude-code@2.1.88", "--grid", f"{BUFFER}=2000:20000:2000"]
NEW = ["--policy", "claude-code@2.1.88", "--policy", "claude-code@1.0"]
NEW += ["--grid", f"{BUFFER}=1000:40000:1000"]


def digests(root: Path) -> dict[str, str]:
    """Every finished file under root (relative path -> sha256); temporary files left out."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".tmp")
    }


def run(args: list[str], out: Path, env: dict[str, str]) -> None:
    command = [str(CTXSIM), "sweep", str(SAMPLES), *args, "--workers", "2", "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _as_from_a_terminal() -> None:
    """Ctrl-C as an interactive shell hands it to the command it starts: handled by default
    and not blocked. Both are inherited across exec, and a command started with SIGINT
    ignored or blocked rightly never sees it (a sweep of this file once ran to its end,
    status 0, after the group's SIGINT, inside the whole suite and never alone)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start(args: list[str], out: Path, env: dict[str, str], stderr: int = subprocess.DEVNULL) -> Any:
    """The sweep of the samples on 2 workers, in a session (process group) of its own."""
    command = [str(CTXSIM), "sweep", str(SAMPLES), *args, "--workers", "2", "--out", str(out)]
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )


def kill_when(args: list[str], out: Path, env: dict[str, str], event: Callable[[], bool]) -> bool:
    """Start the sweep, SIGKILL its whole process group once `event()` holds; False when
    the sweep ended first."""
    proc = start(args, out, env)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if event():
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.003)
    finally:
        proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def test_a_sweep_killed_at_each_phase_leaves_whole_files_and_resumes_identically(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "CTXSIM_CACHE_DIR": str(tmp_path / "cache")}
    old_dir, new_dir, killed = tmp_path / "old", tmp_path / "new", tmp_path / "killed"
    run(OLD, old_dir, env)
    old = digests(old_dir)
    shutil.copytree(old_dir, new_dir)
    shutil.copytree(old_dir, killed)
    run(NEW, new_dir, env)
    new = digests(new_dir)
    old_cells = {n for n in old if n.startswith("data/")}
    new_cells = {n for n in new if n.startswith("data/")}
    assert old_cells < new_cells and len(new_cells) == 40 + 40  # 2.1.88's old cells reused
    plan = orjson.loads((new_dir / sw.MANIFEST_FILE).read_bytes())
    planned = [{k: v for k, v in e.items() if k not in ("rows", "sha256")} for e in plan["cells"]]

    manifest = killed / sw.MANIFEST_FILE
    first_manifest = manifest.stat().st_mtime_ns

    def cells_written() -> int:
        return len(list((killed / sw.DATA_DIR).glob("*/*.parquet")))

    def new_cells_table() -> bool:
        path = killed / sw.CELLS_FILE
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest() == new[sw.CELLS_FILE]
        except OSError:
            return False

    events: list[tuple[str, Callable[[], bool]]] = [
        ("manifest", lambda: manifest.stat().st_mtime_ns != first_manifest),
        ("some cells", lambda: cells_written() >= len(old_cells) + 10),
        ("most cells", lambda: cells_written() >= len(new_cells) - 8),
        ("charts", new_cells_table),
    ]
    kills = 0
    for phase, event in events:
        kills += kill_when(NEW, killed, env, event)
        now = digests(killed)
        for name, digest in now.items():
            if name == sw.MANIFEST_FILE:
                data = orjson.loads(manifest.read_bytes())  # whole JSON, never a part
                kept = [
                    {k: v for k, v in e.items() if k not in ("rows", "sha256")}
                    for e in data["cells"]
                ]
                assert digest in (old[name], new[name]) or kept == planned, phase
            elif name.startswith(sw.DATA_DIR + "/"):
                assert digest == new[name], (phase, name)  # a cell file is only ever whole
            else:  # cells.parquet and charts: the old file or the new one
                assert digest in (old.get(name), new.get(name)), (phase, name)
    assert kills >= 3, "the sweep ended before most kills"
    run(NEW, killed, env)
    assert not list(killed.rglob("*.tmp"))
    assert digests(killed) == new


@pytest.mark.parametrize("count", [0, 1])
def test_a_directory_of_the_old_layout_is_refused(tmp_path: Path, count: int) -> None:
    """A sweep directory from before the layout change (hash as a partition) is not mixed."""
    (tmp_path / sw.MANIFEST_FILE).write_bytes(
        orjson.dumps({"format": "ctxsim-sweep 1", "settings": {}, "cells": [{}] * count})
    )
    config = sw.SweepConfig(policies=("none",))
    with pytest.raises(sw.SweepError, match="older layout"):
        sw.plan_manifest(tmp_path, sw.build_cells(config), config, sw.SweepSettings([]))


def _ended(pgid: int, seconds: float = 30) -> list[int]:
    """Wait up to `seconds` for every process of group `pgid` to end; those left (killed
    then, so that no test leaves one behind)."""
    deadline = time.monotonic() + seconds
    while _group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _group(pgid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (Linux /proc; zombies are not live)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while it was read
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_workers_end_with_a_sweep_killed_outright(tmp_path: Path) -> None:
    """SIGKILL to the sweep process alone (not its group: as the OOM killer does): its
    workers and fork server end too, instead of waiting on their queues for good."""
    env = {**os.environ, "CTXSIM_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "out"
    proc = start(NEW, out, env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(out.glob(f"{sw.DATA_DIR}/*/*.parquet"))) >= 2:  # the workers run
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert len(_group(proc.pid)) >= 3, "the sweep should have started its workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        left = _ended(proc.pid)
    assert left == [], "processes of the killed sweep were still running"


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rss_kib(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return 0
    return next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0
    )


#: The fork server's resident memory mid-import: about 20 MiB as the interpreter starts,
#: 80 MiB with its preload imported (measured on the samples' sweep).
IMPORTING_KIB = 40_000


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_while_the_fork_server_imports_prints_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole group) while the fork server imports the engine (its
    memory half grown; before, the signal would end a bare interpreter silently): one line
    and an exit, no traceback from it, and nothing left running."""
    env = {**os.environ, "CTXSIM_CACHE_DIR": str(tmp_path / "cache")}
    proc = start(NEW, tmp_path / "out", env, stderr=subprocess.PIPE)
    try:
        started = time.monotonic()
        deadline = started + 60
        server = 0
        while time.monotonic() < deadline and proc.poll() is None:
            if not server:
                server = next((p for p in _group(proc.pid) if "forkserver" in _cmdline(p)), 0)
            elif _rss_kib(server) >= IMPORTING_KIB:
                break
            time.sleep(0.002)
        assert proc.poll() is None, "the sweep ended before its fork server imported"
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic() - started
        _, err = proc.communicate(timeout=60)
        # Wherever it lands: simulator/app/cli.py _Main.
        assert proc.returncode == 130, f"SIGINT {sent:.2f} s after the start: {err!r}"
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    finally:
        left = _ended(proc.pid)
    assert left == [], "processes of the interrupted sweep were still running"
