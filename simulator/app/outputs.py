"""Writing a run directory: the run's files, its report and charts, as one unit.

The run service (simulator/run.py) computes every file's bytes and writes nothing; this is
where they reach the disk, each set staged in a hidden sibling and swapped in at once
(simulator/app/files.py StagedDir), so a kill leaves the earlier complete run or this one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from simulator.app.files import StagedDir
from simulator.frames import (
    CHARTS_DIR,
    CHARTS_INDEX,
    MANIFEST_FILE,
    REPORT_FILE,
    RUN_FILES,
    RunOutputs,
)

#: Draws the report of a staged run directory (reading its Parquet files and manifest):
#: the files to add, by name relative to the run directory. The CLI passes reports/html.py.
Drawing = Callable[[Path], dict[str, bytes]]


def write(outputs: RunOutputs, out: Path, report: Drawing | None = None) -> list[str]:
    """Write a run directory as a unit; returns the names written (the report's last).

    Every file, the report drawn from them included, is built in a hidden sibling of `out`
    and swapped in at once (simulator/app/files.py StagedDir), so a kill leaves the earlier
    complete run or this one, never a mix. What an earlier run wrote there is replaced
    whole (its report and charts too, even when this run draws none: they describe the
    other run); anything else in `out` is kept as it was. OS errors: one OutputError line."""
    with StagedDir(out) as stage:
        replaced = written_by_ctxsim(stage.out)
        names = sorted(outputs.files, key=lambda name: name == MANIFEST_FILE)
        for name in names:
            stage.write(name, outputs.files[name])
        drawn = report(stage.path) if report is not None else {}
        for name in sorted(drawn):
            stage.write(name, drawn[name])
        stage.commit(replaced)
    return [*names, *sorted(drawn)]


def written_by_ctxsim(run_dir: Path) -> set[str]:
    """The files an earlier run or report wrote in `run_dir`, by relative name: the run's
    own file names, the charts its index lists (under charts/, never with `..`). Nothing
    else there is ctxsim's to replace or remove."""
    names = {*RUN_FILES, REPORT_FILE, CHARTS_INDEX}
    return names | listed_charts(run_dir)


def listed_charts(run_dir: Path) -> set[str]:
    """The charts named in `run_dir`'s charts index (what an earlier report drew); an
    unreadable or linked index names none."""
    index = run_dir / CHARTS_INDEX
    if not index.is_file() or index.is_symlink() or index.parent.is_symlink():
        return set()
    try:
        listed = index.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return set()
    charts = set()
    for name in listed:
        parts = PurePosixPath(name).parts
        if (
            name.endswith(".png")
            and len(parts) >= 2
            and parts[0] == CHARTS_DIR
            and ".." not in parts
            and not PurePosixPath(name).is_absolute()
        ):
            charts.add(str(PurePosixPath(name)))
    return charts


def write_report(run_dir: Path, files: dict[str, bytes]) -> None:
    """Put a report's files into its run directory as one unit (simulator/app/files.py
    StagedDir): the earlier report's page, index and charts are replaced, the run's data
    and anything ctxsim did not write are kept, and nothing is written or removed through
    a symbolic link (a linked charts/ is refused: R19)."""
    with StagedDir(run_dir) as stage:
        replaced = {REPORT_FILE, CHARTS_INDEX} | listed_charts(stage.out)
        for name in sorted(files):
            stage.write(name, files[name])
        stage.commit(replaced)
