"""The fork server is started with its standard output and error on /dev/null, this
process's own left as they were (simulator/workers.py): a caller reading a command through
a pipe is not kept waiting by the server's teardown after the command has exited."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys
    from multiprocessing import forkserver
    from simulator.workers import start_fork_server

    if __name__ == "__main__":
        start_fork_server(multiprocessing.get_context("forkserver"))
        pid = forkserver._forkserver._forkserver_pid
        print("after", flush=True)
        print("error after", file=sys.stderr, flush=True)
        for fd in (1, 2):
            print(fd, os.readlink(f"/proc/{pid}/fd/{fd}"), flush=True)
    """
)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
@pytest.mark.skipif(
    "forkserver" not in __import__("multiprocessing").get_all_start_methods(),
    reason="no fork server here",
)
def test_the_fork_server_holds_no_pipe_of_the_caller(tmp_path: Path) -> None:
    script = tmp_path / "start.py"
    script.write_text(SCRIPT, encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root)},
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "after"  # this process's own output still reaches the pipe
    assert lines[1:] == ["1 /dev/null", "2 /dev/null"]
    assert done.stderr == "error after\n"
