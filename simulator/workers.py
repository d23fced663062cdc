"""How ctxsim's worker processes start: their fork server deaf to Ctrl-C while it imports,
and each worker ending with the process that asked for it.

Sweeps (simulator/app/sweep.py) and chart drawing (reports/charts.py `ChartPool`) run
process pools whose workers are the fork server's children, blocked on their queues while
they wait for work. When the process that started them is killed outright (SIGKILL, the OOM
killer, a SIGTERM it has no handler for) nothing tells them: a sweep's workers, each holding
every trace, its fork server and its resource tracker were all still running 20 s after a
SIGKILL, and a `ctxsim run`'s chart worker likewise (seen here, before this module).
multiprocessing hands each child a sentinel of the process that asked for it
(`multiprocessing.parent_process()`: the driver, not the fork server), ready once that
process has exited; a daemon thread waits on it and ends the worker. The fork server and
the resource tracker end by themselves once no worker holds them.

Ctrl-C goes to the whole foreground process group, the fork server included. The fork
server ignores SIGINT only once it has imported its preload (CPython multiprocessing/
forkserver.py `main`): a Ctrl-C in the first second of a sweep printed its
KeyboardInterrupt traceback from the middle of an import, and the command ended with exit
status 1 (seen here: interrupted 0.3 and 0.8 s after the start). So the fork server is
started with SIGINT ignored, which it keeps through its imports, and each worker takes
Ctrl-C back as any Python process has it (`worker_start`), as the workers had it before.

The fork server is started with its standard output and error on /dev/null. It and every
worker it forks inherit them, and it outlives the command by its interpreter's teardown
(matplotlib and polars imported): a caller reading the command's output through a pipe
(`ctxsim run ... | tee`, a CI log, `subprocess.run(capture_output=True)`) saw its end
70-80 ms after the command had exited (`ctxsim run --policy claude-code` on the shared
Claude Code corpus). The workers print nothing a user reads: their results and errors go
back through the pool.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import BaseContext


def start_fork_server(context: BaseContext) -> None:
    """Start `context`'s fork server now, with Ctrl-C ignored while it starts (nothing for
    another start method, or where one is running; from another thread than the main one,
    which alone may change a signal's handling, it starts as multiprocessing starts it)."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _output_on_devnull():
            forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _output_on_devnull() -> Iterator[None]:
    """File descriptors 1 and 2 on /dev/null while a child is spawned (this module's
    docstring), this process's own put back after; nothing where they are not open."""
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def worker_start() -> None:
    """A pool's initializer: Ctrl-C raises KeyboardInterrupt here again (the fork server,
    started deaf to it, hands that on), and the worker ends with its parent."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    end_with_parent()


def end_with_parent() -> None:
    """Start the watch in this process (a pool's initializer); nothing where this process
    was not started by multiprocessing."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)  # the driver is gone: nobody will read this worker's results

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
