"""Writing outputs so that a reader never sees half a file, nor half a run directory.

A single file (`atomic_write`) is a temporary file in the same directory, fsynced and
renamed. A run directory (`StagedDir`) is built whole in a hidden sibling and swapped in
with one atomic exchange (Linux renameat2 RENAME_EXCHANGE), so a kill at any moment leaves
the old complete directory or the new complete one (issue 17: a kill between
requests.parquet and manifest.json used to leave a mixed run that `report` and `compare`
accepted). What the directory held that the run does not replace (the user's own files) is
carried over as hard links, never followed through a symbolic link: a run touches only what
it wrote (R19). Every file is created 0644 and every directory 0755, as compiled traces are
(R21: mkstemp's 0600 hid shared outputs), and every OS error becomes one OutputError line
naming the path (R15, R16), which the CLI prints with exit 2.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from types import TracebackType

FILE_MODE = 0o644
DIR_MODE = 0o755
#: Names of the hidden siblings a StagedDir builds in: `.{out name}.ctxsim-{pid}-{random}`.
STAGE_MARK = ".ctxsim-"
#: Test hook: the name of a point of `StagedDir.commit` at which the process kills itself
#: (SIGKILL), so a test can check what a kill there leaves
#: (tests/simulator/app/test_outputs_commit.py).
KILL_AT_ENV = "CTXSIM_TEST_KILL_AT"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
#: errno values that say the file system or kernel cannot exchange two names atomically.
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


class OutputError(OSError):
    """An output that cannot be written: one line naming the path and the cause."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot write an output"


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def _checkpoint(point: str) -> None:
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _write_file(path: Path, data: bytes) -> None:
    """A temporary file beside `path`, mode 0644, fsynced, renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), FILE_MODE)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _make_dirs(directory: Path, shown: Path) -> None:
    """Create `directory` and its missing parents (0755); a file in the way is an error."""
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise OutputError(f"cannot write {shown}: a file is in the way of its directory") from exc
    except OSError as exc:
        raise OutputError(f"cannot write {shown}: {_reason(exc)}") from exc
    if not directory.is_dir():
        raise OutputError(f"cannot write {shown}: a file is in the way of its directory")


def atomic_write(path: Path, data: bytes) -> None:
    """Write one output file whole (temporary file, fsync, rename), mode 0644."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise OutputError(f"cannot write {path}: it is a directory, not a file")
    _make_dirs(path.parent, path)
    try:
        _write_file(path, data)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc


#: What marks a directory as a ctxsim run's (simulator/frames.py MANIFEST_FILE): only such
#: a directory, or an empty one, is replaced by a new run directory.
RUN_MARK = "manifest.json"


def check_target(out: Path) -> Path:
    """The run directory `out` will be written at, checked before any work is done: an
    existing file, a file among its parents, an unwritable parent, or a directory that
    holds files but no run (`--out /run` must not swap a system directory for a copy of
    it) is one OutputError line. A symbolic link given as `out` itself is followed once, to
    the directory it names (links inside the run directory never are)."""
    out = Path(out)
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    if target.exists() and not target.is_dir():
        raise OutputError(f"cannot write {out}: it is a file, not a directory")
    if target.is_dir() and not (target / RUN_MARK).is_file():
        try:
            holds = any(os.scandir(target))
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {_reason(exc)}") from exc
        if holds:
            raise OutputError(
                f"cannot write {out}: it holds files but no ctxsim run; "
                "give a new or empty directory"
            )
    if os.path.ismount(target):
        raise OutputError(f"cannot write {out}: it is a mount point; give a directory in it")
    existing = target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"cannot write {out}: {existing.name} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {out}: permission denied")
    return target


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory names atomically; False where the system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _stale_stages(out: Path) -> Iterator[Path]:
    """Hidden siblings of `out` left by a killed StagedDir (its pid no longer runs)."""
    prefix = f".{out.name}{STAGE_MARK}"
    with contextlib.suppress(OSError):
        for entry in os.scandir(out.parent):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                yield Path(entry.path)


class StagedDir:
    """A directory built in a hidden sibling of `out` and committed whole.

    `write` puts files in the stage; `path` is the stage, for a step that reads what was
    staged (the report is drawn from the staged Parquet files). `commit(replaced)` carries
    over every entry of the existing `out` that was neither written nor named in `replaced`
    (the earlier run's own files), then swaps the stage in. Leaving the `with` block
    without a commit removes the stage and leaves `out` as it was.
    """

    def __init__(self, out: Path) -> None:
        self.shown = Path(out)
        self.out = check_target(self.shown)
        _make_dirs(self.out.parent, self.shown)
        if self.out.is_dir():  # else a killed two-rename commit may hold the only copy
            for stale in _stale_stages(self.out):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            self.path = Path(
                tempfile.mkdtemp(
                    dir=self.out.parent, prefix=f".{self.out.name}{STAGE_MARK}{os.getpid()}-"
                )
            )
            os.chmod(self.path, DIR_MODE)
        except OSError as exc:
            raise OutputError(f"cannot write {self.shown}: {_reason(exc)}") from exc
        self.written: set[str] = set()
        self.device = 0  # the stage's file system, set at commit
        #: What is left to remove once done: the stage, or after a swap the old directory.
        self.leftover: Path | None = self.path

    def __enter__(self) -> StagedDir:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.discard()

    def discard(self) -> None:
        """Remove the stage (after a commit: the earlier directory it now holds)."""
        if self.leftover is not None:
            shutil.rmtree(self.leftover, ignore_errors=True)
            self.leftover = None

    def write(self, name: str, data: bytes) -> None:
        """Stage one file, `name` relative to the run directory (posix, no `..`)."""
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise OutputError(f"cannot write {self.shown}: {name!r} is not inside it")
        path = self.path.joinpath(*rel.parts)
        _make_dirs(path.parent, self.shown / name)
        try:
            _write_file(path, data)
        except OSError as exc:
            raise OutputError(f"cannot write {self.shown / name}: {_reason(exc)}") from exc
        self.written.add(str(rel))

    def commit(self, replaced: Iterable[str] = ()) -> None:
        """Carry the kept entries of `out` over and swap the stage in (one rename)."""
        drop = set(replaced) | self.written
        self.device = self.path.stat().st_dev
        parents = {str(p) for name in self.written for p in PurePosixPath(name).parents}
        parents.discard(".")
        _checkpoint("staged")
        try:
            if self.out.is_dir():
                self._carry("", drop, parents)
            _checkpoint("carried")
            _fsync_dir(self.path)
            if not self.out.exists():
                os.rename(self.path, self.out)
                self.leftover = None
            elif not _exchange(self.path, self.out):
                # No atomic exchange here: two renames; a kill between them leaves the old
                # directory beside `out` under the stage's name, never a mixed one.
                old = self.path.with_name(self.path.name + ".old")
                os.rename(self.out, old)
                os.rename(self.path, self.out)
                self.leftover = old
            _checkpoint("swapped")
            _fsync_dir(self.out.parent)
        except OutputError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write {self.shown}: {_reason(exc)}") from exc
        self.discard()

    def _conflict(self, rel: str, what: str) -> OutputError:
        return OutputError(f"cannot write {self.shown}: {rel} is {what}")

    def _carry(self, rel: str, drop: set[str], parents: set[str]) -> bool:
        """Hard-link (or re-create, for links and directories) what `out`/rel holds and the
        new directory keeps; never descends into or through a symbolic link. Whether the
        directory held anything."""
        source = self.out / rel if rel else self.out
        with os.scandir(source) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                continue  # an interrupted single-file write's leftover
            mode = entry.stat(follow_symlinks=False).st_mode
            target = self.path / name
            if stat.S_ISLNK(mode):
                if name in parents or name in self.written:
                    raise self._conflict(
                        name, "a symbolic link; a run writes only inside its run directory"
                    )
                if name not in drop:
                    os.symlink(os.readlink(entry.path), target)
            elif stat.S_ISDIR(mode):
                if name in self.written:
                    raise self._conflict(name, "a directory where a file is written")
                st = entry.stat(follow_symlinks=False)
                if st.st_dev != self.device or st.st_uid != os.geteuid():
                    # a copy would lose its mount or its owner: not a directory to carry
                    raise self._conflict(name, "a mount point or another user's directory")
                target.mkdir(mode=DIR_MODE, exist_ok=True)
                held = self._carry(name, drop, parents)
                if name in parents:
                    continue
                if held and not any(target.iterdir()):
                    target.rmdir()  # it held only what was replaced (an earlier report's)
                else:
                    os.chmod(target, stat.S_IMODE(mode))  # the user's keeps its mode
            elif name in parents:
                raise self._conflict(name, "a file where a directory is written")
            elif name in drop:
                continue
            elif stat.S_ISREG(mode):
                try:
                    os.link(entry.path, target, follow_symlinks=False)
                except OSError:
                    shutil.copy2(entry.path, target, follow_symlinks=False)
            else:
                raise self._conflict(name, "a special file a run directory cannot keep")
        return bool(listed)
