"""What every worker process ctxsim starts does first: end with the process that asked for it.

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
"""

from __future__ import annotations

import multiprocessing
import os
import threading


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
