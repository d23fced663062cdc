"""The compile cache heals (issue 17): a damaged entry is rebuilt with one note, never copied
by `traces import`; an unwritable cache is one warning; a killed writer's temporary files
are cleaned; an in-place edit that restores mtime is seen (R18, R15, R23)."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.app.cli import main
from tests.support import ROOT, SAMPLES
from traces import compiled
from traces.cache import STALE_TMP_SECONDS, CompileCache
from traces.discover import discover
from traces.load import import_into, load_all, load_unit

SESSION = SAMPLES / "claude-code" / "-work-demo" / "3e8a0b6d-1c47-4f92-8d15-6a9e2f4c7b08.jsonl"


def _one(path: Path, cache: CompileCache | None) -> tuple[bytes, bool]:
    """(compiled bytes, whether they came from the cache) of the one trace at `path`."""
    (unit,) = discover([path])
    item = load_unit(unit, cache=cache)
    return item.compiled_bytes(), item.cached


def _entry(cache: CompileCache) -> Path:
    (entry,) = cache.directory.rglob("*.ctxt")
    return entry


def _flip_in(path: Path, member: str) -> None:
    """Flip one byte in the middle of a stored zip member: its CRC no longer matches, while
    meta.json (and so a meta-only lookup) is intact (R18)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.file_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _bad_meta(path: Path) -> None:
    """Replace meta.json by one that is valid JSON but names no source."""
    with zipfile.ZipFile(path) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    entries[compiled.META] = b'{"format": "ctxsim compiled trace"}'
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)


DAMAGES = {
    "columns-crc": lambda p: _flip_in(p, compiled.COLUMNS),
    "meta-crc": lambda p: _flip_in(p, compiled.META),
    "truncated": _truncate,
    "bad-meta": _bad_meta,
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_entry_is_discarded_rebuilt_and_noted_once(tmp_path: Path, damage: str) -> None:
    notes: list[str] = []
    cache = CompileCache(tmp_path / "cache", note=notes.append)
    fresh, cached = _one(SESSION, cache)
    assert not cached
    DAMAGES[damage](_entry(cache))
    again, cached = _one(SESSION, cache)
    assert not cached  # compiled again, not served from the damaged entry
    assert again == fresh
    assert _entry(cache).read_bytes() == fresh  # the entry was replaced by a sound one
    assert len(notes) == 1
    assert notes[0].startswith("note: 3e8a0b6d-1c47-4f92-8d15-6a9e2f4c7b08.jsonl: cached")
    assert "\n" not in notes[0]
    assert str(tmp_path) not in notes[0]
    assert _one(SESSION, cache) == (fresh, True)  # and the next lookup is a hit


def test_an_entry_that_passes_its_crcs_but_not_decoding_is_rebuilt_when_decoded(
    tmp_path: Path,
) -> None:
    """A cache hit is checked (CRCs, meta.json) when found and decoded when first used; an
    entry whose checked bytes still fail to decode (here columns.zst replaced, with a
    valid CRC, by bytes that are no zstd frame) is discarded then and compiled again."""
    notes: list[str] = []
    cache = CompileCache(tmp_path / "cache", note=notes.append)
    fresh, _ = _one(SESSION, cache)
    entry = _entry(cache)
    with zipfile.ZipFile(entry) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    entries[compiled.COLUMNS] = b"not a zstd frame"
    with zipfile.ZipFile(entry, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    (unit,) = discover([SESSION])
    item = load_unit(unit, cache=cache)
    assert item.cached and notes == []  # found and checked, not decoded yet
    assert compiled.to_bytes(item.trace) == fresh
    assert not item.cached
    assert len(notes) == 1 and "columns.zst" in notes[0]
    assert _entry(cache).read_bytes() == fresh


def test_import_never_copies_a_damaged_entry(tmp_path: Path) -> None:
    """R18: `traces import` copied the damaged bytes into --out with exit 0."""
    cache = CompileCache(tmp_path / "cache", note=lambda _: None)
    fresh, _ = _one(SESSION, cache)
    _flip_in(_entry(cache), compiled.COLUMNS)
    summary = import_into(load_all(discover([SESSION]), cache=cache), tmp_path / "out")
    assert (summary.written, summary.from_cache) == (1, 0)
    (written,) = (tmp_path / "out").glob("*.ctxt")
    assert written.read_bytes() == fresh
    compiled.read(written)  # decodes


def test_cli_heals_a_damaged_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()

    def imported(out: str) -> tuple[bytes, str]:
        result = runner.invoke(
            main, ["traces", "import", str(SESSION), "--out", str(tmp_path / out)]
        )
        assert result.exit_code == 0, result.output
        return next((tmp_path / out).glob("*.ctxt")).read_bytes(), result.stderr

    first, _ = imported("one")
    _flip_in(_entry(CompileCache(tmp_path / "cache")), compiled.COLUMNS)
    second, stderr = imported("two")
    assert second == first
    notes = [line for line in stderr.splitlines() if "cached compilation" in line]
    assert len(notes) == 1 and notes[0].endswith("compiling again")


def test_import_copies_cached_bytes_without_encoding_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16: a warm import copies the cached file; it encodes no trace."""
    cache = CompileCache(tmp_path / "cache")
    fresh, _ = _one(SESSION, cache)

    def refuse(*_: object) -> bytes:
        raise AssertionError("a cached trace was encoded again")

    monkeypatch.setattr(compiled, "to_bytes", refuse)
    summary = import_into(load_all(discover([SESSION]), cache=cache), tmp_path / "out")
    assert summary.from_cache == 1
    (written,) = (tmp_path / "out").glob("*.ctxt")
    assert written.read_bytes() == fresh == _entry(cache).read_bytes()
    again = import_into(load_all(discover([written])), tmp_path / "out2")  # a .ctxt input
    assert again.written == 1
    assert next((tmp_path / "out2").glob("*.ctxt")).read_bytes() == fresh


def test_an_unwritable_cache_is_one_warning_and_the_run_goes_on(tmp_path: Path) -> None:
    """R15: the cache is an optimisation; a cache directory that cannot be made (here a
    file stands where it belongs; a read-only one fails the same way) is not an error."""
    blocker = tmp_path / "cache"
    blocker.write_bytes(b"")
    notes: list[str] = []
    cache = CompileCache(blocker, note=notes.append)
    found = discover([SAMPLES / "claude-code"])
    assert len(found) == 2
    items = list(load_all(found, cache=cache))
    assert [i.cached for i in items] == [False, False]
    assert len(notes) == 1 and notes[0].startswith("warning: compile cache not written")
    assert cache.disabled is not None


def test_cli_with_an_unwritable_cache_warns_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cache").write_bytes(b"")
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["traces", "import", str(SESSION), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 1
    assert result.stderr.count("warning: compile cache not written") == 1


def test_stale_tmp_files_are_swept_fresh_ones_kept(tmp_path: Path) -> None:
    """A writer killed between its temporary file and the rename leaves `.NAME.*.tmp`; the
    next writer deletes those older than STALE_TMP_SECONDS, never a live one."""
    cache = CompileCache(tmp_path)
    _one(SESSION, cache)
    shard = _entry(cache).parent
    (stat_shard,) = [d for d in (tmp_path / "stat-index-v2").iterdir() if d.is_dir()]
    old = [shard / ".x.ctxt.abc.tmp", stat_shard / ".k.123.tmp"]
    young = shard / ".y.ctxt.def.tmp"
    keep = shard / "notes.tmp"  # not a name the cache writes
    for path in (*old, young, keep):
        path.write_bytes(b"partial")
    past = os.stat(young).st_mtime - STALE_TMP_SECONDS - 5
    for path in (*old, keep):
        os.utime(path, (past, past))
    assert cache.sweep_tmp() == 2
    assert not any(p.exists() for p in old)
    assert young.exists() and keep.exists()


def test_the_first_write_of_a_process_sweeps(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    _one(SESSION, cache)
    stale = _entry(cache).parent / ".z.ctxt.q.tmp"
    stale.write_bytes(b"")
    os.utime(stale, (1_000_000, 1_000_000))
    _one(SAMPLES / "swe-agent" / "tinyledger-7.traj", CompileCache(tmp_path))
    assert not stale.exists()


def test_a_same_size_edit_with_mtime_restored_is_seen(tmp_path: Path) -> None:
    """R23: the stat index keyed on path, size, mtime, inode and device; an in-place edit of
    the same size whose mtime is put back (`cp -p`, `rsync -t --inplace`) changes only
    ctime, and the cache served the old compilation."""
    path = tmp_path / "a.jsonl"
    shutil.copyfile(SESSION, path)
    cache = CompileCache(tmp_path / "cache")
    before, _ = _one(path, cache)
    st = os.stat(path)
    data = path.read_bytes()
    edited = data.replace(b'"output_tokens":13,', b'"output_tokens":31,', 1)
    assert edited != data and len(edited) == len(data)
    with path.open("r+b") as fh:  # same inode, same size
        fh.write(edited)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns
    after, cached = _one(path, cache)
    assert not cached
    assert after != before
    assert after == _one(path, None)[0]


def test_a_file_name_that_is_not_utf8_is_read_and_named(tmp_path: Path) -> None:
    """R13: a valid trace whose name holds bytes that are not UTF-8 was a UnicodeEncodeError
    traceback (the stat index, run seeds); its name shows them as \\xNN."""
    folder = tmp_path / "t"
    folder.mkdir()
    name = os.fsdecode(b"\xff\xfe-name.jsonl")
    shutil.copyfile(SESSION, folder / name)
    (unit,) = discover([folder])
    assert unit.label == "t/\\xff\\xfe-name.jsonl"
    item = load_unit(unit, cache=CompileCache(tmp_path / "cache"))
    assert item.name.startswith("\\xff\\xfe-name-")
    item.name.encode()  # a name every output can carry
    out = tmp_path / "out"
    import_into([item], out)
    (written,) = out.glob("*.ctxt")
    assert written.name == item.name
    run = ["run", str(folder), "--out", str(tmp_path / "run"), "--no-report"]
    result = CliRunner().invoke(main, run)
    assert result.exit_code == 0, result.output


# -- traces import killed while it writes ------------------------------------------------

_KILLED_IMPORT = """
import os, pathlib, signal, sys
from traces import compiled
from traces.discover import discover
from traces.load import import_into, load_all

after = int(sys.argv[3])
write, unlink = compiled.write_bytes, pathlib.Path.unlink
written = []

def write_or_die(data, path, *, durable=True):
    if len(written) == after:
        os.kill(os.getpid(), signal.SIGKILL)
    write(data, path, durable=durable)
    written.append(path)

def unlink_or_die(self, missing_ok=False):  # the marker is removed last
    if self.name == compiled.INCOMPLETE_MARKER:
        os.kill(os.getpid(), signal.SIGKILL)
    unlink(self, missing_ok)

compiled.write_bytes = write_or_die
pathlib.Path.unlink = unlink_or_die
import_into(load_all(discover([pathlib.Path(sys.argv[1])])), pathlib.Path(sys.argv[2]))
"""


@pytest.mark.parametrize("after", [0, 1, 2])
def test_an_import_killed_while_writing_leaves_no_set_a_run_accepts(
    tmp_path: Path, after: int
) -> None:
    """SIGKILL before the first file, between files and after the last (before the import
    is marked complete): every later command refuses the directory with one line, until an
    import into it completes."""
    import subprocess
    import sys

    out = tmp_path / "out"
    root = ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_IMPORT, str(SAMPLES / "claude-code"), str(out), str(after)],
        env=env,
        cwd=root,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    assert len(list(out.glob("*.ctxt"))) == after
    runner = CliRunner()
    targets = [str(out), *(str(p) for p in sorted(out.glob("*.ctxt")))]
    for target in targets:
        result = runner.invoke(main, ["traces", "validate", target])
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.endswith("[incomplete-import]")
    done = runner.invoke(
        main, ["traces", "import", str(SAMPLES / "claude-code"), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert not (out / compiled.INCOMPLETE_MARKER).exists()
    result = runner.invoke(main, ["traces", "validate", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 trace(s), 0 problem(s)" in result.stdout


@pytest.mark.parametrize(
    ("central", "offset", "why"),
    [
        (False, 29, "the first local header's extra length: EOFError"),
        (True, 6, "the version needed to extract: NotImplementedError"),
        (True, 8, "the flag bits (encrypted): RuntimeError"),
        (True, 10, "the compression method: NotImplementedError"),
    ],
)
def test_a_lookup_of_a_damaged_entry_is_a_miss_not_a_traceback(
    tmp_path: Path, central: bool, offset: int, why: str
) -> None:
    """The 15-minute fuzz run found it: meta.json read from a damaged archive by `lookup`
    raised EOFError (a byte set to 0xFF in a zip header) where a miss was due; the same
    peek raised NotImplementedError and RuntimeError for other header bytes."""
    cache = CompileCache(tmp_path / "cache", note=lambda _: None)
    fresh, _ = _one(SESSION, cache)
    entry = _entry(cache)
    data = bytearray(entry.read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    base = int.from_bytes(data[eocd + 16 : eocd + 20], "little") if central else 0
    data[base + offset] = 0xFF  # in meta.json's headers (the first entry)
    entry.write_bytes(bytes(data))
    assert compiled.peek(entry) is None, why
    assert _one(SESSION, cache) == (fresh, False)


def test_an_unwritable_import_out_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R15 for `traces import`: --out under a file (a read-only directory fails the same
    way) was an OSError traceback."""
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "file").write_bytes(b"")
    out = tmp_path / "file" / "out"
    result = CliRunner().invoke(main, ["traces", "import", str(SESSION), "--out", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: out: cannot write: ") and line.endswith("[unwritable]")
