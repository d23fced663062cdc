"""Malformed Claude Code transcripts: a located error when strict, a count when lenient.

Each fixture in tests/fixtures/bad is the 7-line session `valid.jsonl` with one defect
planted at a known line (see tests/fixtures/bad/README.md). Strict mode must raise a
TraceError naming the fixture and that line; --lenient must import and count the defect;
the CLI must print one "error: <label>:<line>: ..." line (exit 2) and write nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from simulator.app.cli import main
from simulator.model import Flag, Kind, Trace
from tests.support import FIXTURES
from traces import bounds, claude_code, codex, jsonl, swe_agent
from traces import source as source_mod
from traces.discover import discover
from traces.errors import TraceError
from traces.load import load_unit
from traces.source import ImportUnit, SourceFile

BAD = FIXTURES / "bad"
VALID = BAD / "valid.jsonl"
TOOL_RESULT_LINE = 4  # in valid.jsonl: the Read result


@dataclass(frozen=True)
class Case:
    fixture: str
    line: int  # where the defect was planted
    category: str
    requests: int  # requests of the session when imported leniently (valid.jsonl: 3)

    def __str__(self) -> str:
        return self.fixture.removesuffix(".jsonl")


CASES = [
    Case("truncated_last_line.jsonl", 7, "truncated-line", 2),
    Case("invalid_json.jsonl", 2, "invalid-json", 3),
    Case("wrong_type_usage.jsonl", 5, "wrong-type", 3),
    Case("wrong_type_content.jsonl", 6, "wrong-type", 3),
    Case("missing_usage.jsonl", 5, "missing-usage", 3),
    Case("duplicate_uuid.jsonl", 6, "duplicate-id", 3),
    Case("timestamp_order.jsonl", 7, "timestamp-order", 3),
    Case("orphan_tool_result.jsonl", 4, "orphan-tool-result", 3),
    Case("binary_garbage.jsonl", 2, "binary-garbage", 3),
    Case("empty.jsonl", 1, "empty-file", 0),
    # Impossible numbers (issue 17, R02-R07, R10): lenient keeps the request, without usage.
    Case("implausible_context.jsonl", 5, "implausible-usage", 3),
    Case("implausible_output.jsonl", 5, "implausible-usage", 3),
    Case("negative_cache_split.jsonl", 5, "wrong-type", 3),
    # Times outside 2020-2100 (R06): an assistant line's request is dropped, a user line's
    # time is not used.
    Case("year_0001.jsonl", 7, "bad-timestamp", 2),
    Case("year_3000.jsonl", 6, "bad-timestamp", 3),
    # A "type" that is a list (R01), and one of 100,000 characters (R08).
    Case("type_is_a_list.jsonl", 6, "missing-field", 3),
    Case("type_100k.jsonl", 6, "unknown-type", 3),
]


def _lenient_params() -> list[object]:
    return [pytest.param(c, id=str(c)) for c in CASES]


def _load(path: Path, *, lenient: bool) -> Trace:
    (unit,) = discover([path])
    return load_unit(unit, lenient=lenient).trace


def _cli(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner().invoke(main, args)


def _import(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lenient: bool
) -> tuple[Result, Path]:
    out = tmp_path / "out"
    out.mkdir()
    args = ["traces", "import", str(path), "--out", str(out), "--no-cache"]
    # damaged lines are skipped by default (issue 15): the strict cases ask for --strict
    return _cli(args + (["--lenient"] if lenient else ["--strict"]), tmp_path, monkeypatch), out


def _assert_cli_error(result: Result, out: Path, label: str, line: int, category: str) -> None:
    """One line on stderr naming `label`, the file as the command line gave it."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stdout + result.stderr
    (message,) = result.stderr.splitlines()
    assert message.startswith(f"error: {label}:{line}: "), message
    assert message.endswith(f"[{category}]"), message
    assert list(out.iterdir()) == []  # nothing written, not even a temporary file


def _valid_lines() -> list[str]:
    return VALID.read_text(encoding="utf-8").splitlines()


def _with_big_tool_result(path: Path, n_chars: int) -> Path:
    """valid.jsonl with the tool_result (line 4) holding `n_chars` characters of log."""
    lines = _valid_lines()
    row = json.loads(lines[TOOL_RESULT_LINE - 1])
    block = "".join(
        f"2025-11-20 10:00:{i % 60:02d} INFO import row {i:06d} amount=-{i % 997}.{i % 100:02d}\n"
        for i in range(2_000)
    )
    text = (block * (n_chars // len(block) + 1))[:n_chars]
    row["message"]["content"][0]["content"] = text
    lines[TOOL_RESULT_LINE - 1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- the control ---------------------------------------------------------------------------


def test_valid_fixture_imports_cleanly() -> None:
    trace = _load(VALID, lenient=False)
    assert trace.skipped == {}
    (s,) = trace.sessions
    assert s.n_requests == 3
    assert s.requests["has_usage"].all()


def test_an_unlisted_metadata_type_is_skipped_and_counted_even_strict() -> None:
    """`unknown_type.jsonl` line 4 is an entry of a type no list names, with no message:
    metadata by its structure (Claude Code 2.1.8x+ adds such types with every release)."""
    trace = _load(BAD / "unknown_type.jsonl", lenient=False)
    control = _load(VALID, lenient=False)
    assert trace.skipped == {}
    assert trace.stats["lines_metadata"] == control.stats["lines_metadata"] + 1
    assert trace.stats["lines_metadata_unlisted"] == 1
    assert trace.stats["lines"] == control.stats["lines"] + 1
    (s,), (c,) = trace.sessions, control.sessions
    assert s.requests.equals(c.requests)
    assert np.array_equal(s.blocks["tokens_raw"], c.blocks["tokens_raw"])


def test_an_unknown_type_carrying_a_message_is_a_located_problem(tmp_path: Path) -> None:
    """An entry of an unknown type that holds a `message` would carry context the reader
    cannot place: a problem, never a silent skip."""
    lines = _valid_lines()
    planted = {"type": "hologram", "message": {"role": "user", "content": "x"}, "uuid": "h"}
    lines.insert(3, json.dumps(planted))
    path = tmp_path / "unknown_message.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        _load(path, lenient=False)
    assert (info.value.line, info.value.category) == (4, "unknown-type")
    trace = _load(path, lenient=True)
    assert trace.skipped == {"unknown-type": 1}
    assert trace.sessions[0].n_requests == 3


# -- each defect ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=str)
def test_strict_names_file_line_and_category(case: Case) -> None:
    with pytest.raises(TraceError) as info:
        _load(BAD / case.fixture, lenient=False)
    err = info.value
    assert (err.file, err.line, err.category) == (case.fixture, case.line, case.category)
    assert str(err).startswith(f"{case.fixture}:{case.line}: ")


@pytest.mark.parametrize("case", _lenient_params())
def test_lenient_imports_and_counts(case: Case) -> None:
    trace = _load(BAD / case.fixture, lenient=True)
    assert trace.skipped == {case.category: 1}
    assert trace.skipped_at == [f"file#0:{case.line}"]
    assert trace.sessions[0].n_requests == case.requests


@pytest.mark.parametrize("case", CASES, ids=str)
def test_cli_import_strict_is_one_line_and_writes_nothing(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, out = _import(BAD / case.fixture, tmp_path, monkeypatch, lenient=False)
    _assert_cli_error(result, out, str(BAD / case.fixture), case.line, case.category)


@pytest.mark.parametrize("case", _lenient_params())
def test_cli_import_lenient_succeeds(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, out = _import(BAD / case.fixture, tmp_path, monkeypatch, lenient=True)
    assert result.exit_code == 0, result.output
    assert "skipped 1 bad line(s)" in result.stdout
    written = 0 if case.category == "empty-file" else 1  # an empty file has nothing to keep
    assert len(list(out.glob("*.ctxt"))) == written


# -- what lenient mode keeps, case by case -------------------------------------------------


def test_lenient_usage_problems_leave_the_request_without_usage() -> None:
    for name in ("missing_usage.jsonl", "wrong_type_usage.jsonl"):
        s = _load(BAD / name, lenient=True).sessions[0]
        assert s.requests["has_usage"].tolist() == [True, False, True], name


def test_lenient_timestamp_order_is_clamped() -> None:
    ts = _load(BAD / "timestamp_order.jsonl", lenient=True).sessions[0].requests["ts"]
    # Request times are send times (the line each request answers), kept non-decreasing:
    # A is sent at 10:00:00, B at 10:00:04.2; C's own line (10:00:07) precedes its prompt
    # line (10:01:00), so C's time is its own line's, which still follows B's.
    assert ts.tolist() == [1763632800000, 1763632804200, 1763632807000]


def test_lenient_orphan_result_is_kept_unlinked() -> None:
    b = _load(BAD / "orphan_tool_result.jsonl", lenient=True).sessions[0].blocks
    results = b["kind"] == Kind.TOOL_RESULT
    assert results.sum() == 1
    assert b["link"][results].tolist() == [-1]


def test_reader_counts_an_empty_file_when_lenient() -> None:
    """The reader itself handles an empty file under --lenient (discover does not)."""
    path = BAD / "empty.jsonl"
    unit = ImportUnit("claude-code", [SourceFile(path, path.name)])
    trace = load_unit(unit, lenient=True).trace
    assert trace.skipped == {"empty-file": 1}
    assert trace.sessions[0].n_requests == 0


# -- gzip, binary, huge and over-long lines ------------------------------------------------


def test_gzip_fixture_reports_the_same_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gz = tmp_path / "invalid_json.jsonl.gz"
    gz.write_bytes(gzip.compress((BAD / "invalid_json.jsonl").read_bytes(), mtime=0))
    with pytest.raises(TraceError) as info:
        _load(gz, lenient=False)
    assert (info.value.file, info.value.line, info.value.category) == (gz.name, 2, "invalid-json")
    assert _load(gz, lenient=True).skipped == {"invalid-json": 1}
    result, out = _import(gz, tmp_path, monkeypatch, lenient=False)
    _assert_cli_error(result, out, str(gz), 2, "invalid-json")


def _random_bytes(path: Path) -> Path:
    data = b"\x00\x01" + random.Random(5).randbytes(4_096)  # NULs; never gzip or zip magic
    path.write_bytes(data)
    return path


def test_all_binary_file_is_rejected_at_line_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _random_bytes(tmp_path / "garbage.jsonl")
    with pytest.raises(TraceError) as info:
        _load(path, lenient=False)
    assert (info.value.file, info.value.line, info.value.category) == (
        "garbage.jsonl",
        1,
        "unknown-format",
    )
    result, out = _import(path, tmp_path, monkeypatch, lenient=False)
    _assert_cli_error(result, out, str(path), 1, "unknown-format")


def test_all_binary_file_named_explicitly_is_an_error_even_when_lenient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file given on the command line must be a trace (traces/discover.py)."""
    path = _random_bytes(tmp_path / "garbage.jsonl")
    result, out = _import(path, tmp_path, monkeypatch, lenient=True)
    _assert_cli_error(result, out, str(path), 1, "unknown-format")


def test_all_binary_file_in_a_directory_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    _random_bytes(folder / "garbage.jsonl")
    (folder / "valid.jsonl").write_bytes(VALID.read_bytes())
    result, out = _import(folder, tmp_path, monkeypatch, lenient=False)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.stdout + result.stderr
    assert len(list(out.glob("*.ctxt"))) == 1


def test_empty_file_in_a_directory_is_skipped_when_lenient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "valid.jsonl").write_bytes(VALID.read_bytes())
    result, out = _import(folder, tmp_path, monkeypatch, lenient=True)
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 1


def test_huge_line_imports_quickly(tmp_path: Path) -> None:
    n = 20_000_000
    path = _with_big_tool_result(tmp_path / "huge.jsonl", n)
    assert n < path.stat().st_size < jsonl.MAX_LINE_BYTES
    trace = _load(path, lenient=False)
    (s,) = trace.sessions
    assert trace.skipped == {}
    assert s.n_requests == 3
    result = s.blocks["kind"] == Kind.TOOL_RESULT
    assert s.blocks["chars"][result].tolist() == [n]
    assert s.blocks["tokens_raw"][result][0] > n // 10


def test_line_above_max_line_bytes_is_line_too_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 4_096)
    path = _with_big_tool_result(tmp_path / "long.jsonl", 10_000)
    with pytest.raises(TraceError) as info:
        _load(path, lenient=False)
    assert (info.value.file, info.value.line, info.value.category) == (
        "long.jsonl",
        TOOL_RESULT_LINE,
        "line-too-long",
    )
    trace = _load(path, lenient=True)
    assert trace.skipped == {"line-too-long": 1}
    assert trace.skipped_at == [f"file#0:{TOOL_RESULT_LINE}"]
    assert trace.sessions[0].n_requests == 3
    result, out = _import(path, tmp_path, monkeypatch, lenient=False)
    _assert_cli_error(result, out, str(path), TOOL_RESULT_LINE, "line-too-long")
    (tmp_path / "lenient").mkdir()
    result, out = _import(path, tmp_path / "lenient", monkeypatch, lenient=True)
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 1


# -- impossible numbers, hostile sizes (issue 17) -----------------------------------------


def test_lenient_implausible_usage_keeps_the_request_without_it() -> None:
    """R02/R07: 3e9 tokens of context or 1e12 of output is no recorded usage; the request
    stays, sized by the tokenizer, and the corpus sum is that of the other two calls."""
    control = _load(VALID, lenient=False).sessions[0]
    for name in ("implausible_context.jsonl", "implausible_output.jsonl"):
        s = _load(BAD / name, lenient=True).sessions[0]
        assert s.requests["has_usage"].tolist() == [True, False, True]
        assert int(s.requests["output"].max()) < 1_000
        assert int(s.requests["cache_read"][0]) == int(control.requests["cache_read"][0])


def test_a_type_that_is_a_list_alone_is_an_unknown_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R01: `{"type": []}` crashed format detection (an unhashable set lookup) in every
    command, even --lenient."""
    path = tmp_path / "list_type.jsonl"
    path.write_text('{"type":[]}\n', encoding="utf-8")
    for lenient in (False, True):
        out = tmp_path / f"out{lenient}"
        out.mkdir()
        args = ["traces", "import", str(path), "--out", str(out), "--no-cache"]
        result = _cli(args + (["--lenient"] if lenient else ["--strict"]), tmp_path, monkeypatch)
        _assert_cli_error(result, out, str(path), 1, "unknown-format")


def test_error_lines_quote_at_most_a_clip_of_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R08: a 100,000-character type printed a 100 KB error line."""
    result, _out = _import(BAD / "type_100k.jsonl", tmp_path, monkeypatch, lenient=False)
    (message,) = result.stderr.splitlines()
    assert len(message) < 300
    assert "(100002 chars)" in message  # the quoted repr: 100,000 characters and 2 quotes


def test_a_trace_error_is_one_short_line_whatever_its_message() -> None:
    err = TraceError("f.jsonl", 3, "x", "a\nb" + "c" * 10_000)
    assert "\n" not in str(err)
    assert len(str(err)) < 400


def test_a_gzip_bomb_is_refused_before_it_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R17: a 6 MB .gz of 6 GiB. With the ratio-free allowance lowered to 1 MiB, 32 MiB of
    one repeated line (gzip: about 1000 to 1) is refused as too large."""
    monkeypatch.setattr(source_mod, "GZIP_RATIO_FREE", 1 << 20)
    line = _valid_lines()[0].encode() + b"\n"
    data = gzip.compress(line * ((32 << 20) // len(line)), compresslevel=9)
    assert len(data) * source_mod.MAX_GZIP_RATIO < 32 << 20
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(TraceError) as info:
        SourceFile(path, path.name).read()
    assert info.value.category == "too-large"
    assert str(info.value).startswith("bomb.jsonl.gz: ")


def test_a_gzip_file_within_the_ratio_reads_whole(tmp_path: Path) -> None:
    data = VALID.read_bytes()
    path = tmp_path / "valid.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    assert SourceFile(path, path.name).read() == data


def test_one_long_shell_token_is_not_handed_to_shlex() -> None:
    """shlex is quadratic in a token's length (1.6 MB: 30 s): a line above MAX_SHLEX_CHARS
    is no simple command, and neither reader splits it."""
    token = "a" * 1_600_000
    start = time.monotonic()
    assert codex.shell_file_access(f"cat {token}") == (Flag.NONE, None)
    flag, _ = swe_agent.command_file_access(f"open {token}", None)
    assert flag == Flag.PATH_READ  # split on whitespace instead, in linear time
    assert time.monotonic() - start < 2
    # Below the bound the path is still found.
    assert codex.shell_file_access("cat src/app.py") == (Flag.PATH_READ, "src/app.py")


def test_a_time_without_a_zone_is_utc_whatever_the_machine_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R12: a naive timestamp was read in local time, so the bytes changed with TZ."""
    seen = set()
    for tz in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        seen.add(claude_code.parse_ts("2026-01-01T00:00:00"))
    monkeypatch.delenv("TZ")
    time.tzset()
    assert seen == {1_767_225_600_000}


def test_times_outside_2020_2100_are_no_times() -> None:
    assert claude_code.parse_ts("2019-12-31T23:59:59Z") is None
    assert claude_code.parse_ts("2020-01-01T00:00:00Z") == bounds.MIN_TS_MS
    assert claude_code.parse_ts("2100-01-01T00:00:00Z") is None
    assert codex.parse_ts("0001-01-01T00:00:00Z") is None
    assert codex.parse_ts("9999-12-31T23:59:59.999999-14:00") is None


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"input_tokens": 2**32, "output_tokens": 1}, "exceeds 10000000"),  # R10b
        ({"input_tokens": 10, "output_tokens": 10**12}, "exceeds 1000000"),
        ({"input_tokens": 10, "cached_input_tokens": -1, "output_tokens": 1}, "not a token"),
    ],
)
def test_codex_usage_bounds(usage: dict[str, int], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        codex.usage_from_openai(usage)


def test_usage_at_the_bounds_is_accepted() -> None:
    assert bounds.usage_problem(9_000_000, 1_000_000, 0, 0, 1_000_000) is None
    assert bounds.usage_problem(9_000_000, 1_000_000, 1, 0, 0) is not None
    assert bounds.usage_problem(0, 0, -1, 1, 0) is not None


# -- the file system: names, permissions, special files (issue 17, R13-R16) ----------------


def _one_line_error(result: Result, category: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stdout + result.stderr
    (message,) = result.stderr.splitlines()
    assert message.startswith("error: ") and message.endswith(f"[{category}]"), message
    return message


def test_an_explicit_fifo_is_an_error_not_zero_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO named on the command line read as an empty directory: "0 trace(s)", exit 0."""
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TraceError) as info:
        discover([fifo])
    assert (info.value.file, info.value.category) == ("f.jsonl", "not-a-file")
    result = _cli(
        ["traces", "import", str(fifo), "--out", str(tmp_path / "o")], tmp_path, monkeypatch
    )
    _one_line_error(result, "not-a-file")


def _deny(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    """Opening `denied` fails as it does for a user without read permission (the suite may
    run as root, whom chmod does not stop)."""
    real = Path.open

    def fake_open(self: Path, *args: object, **kwargs: object) -> object:
        if self == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", fake_open)


def test_an_unreadable_file_in_a_directory_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R14: a PermissionError traceback. An error, not a skip: a directory read without one
    of its sessions changes every total, and the line names the file to fix."""
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copyfile(VALID, folder / "a.jsonl")
    shutil.copyfile(VALID, folder / "b.jsonl")
    _deny(monkeypatch, folder / "a.jsonl")
    with pytest.raises(TraceError) as info:
        discover([folder])
    assert (info.value.file, info.value.category) == ("t/a.jsonl", "unreadable")
    assert "Permission denied" in info.value.message
    result = _cli(
        ["traces", "import", str(folder), "--out", str(tmp_path / "o")], tmp_path, monkeypatch
    )
    assert "a.jsonl" in _one_line_error(result, "unreadable")
    assert not (tmp_path / "o").exists()


def test_an_unreadable_subdirectory_is_not_skipped_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path.rglob passes over a directory it may not list; the walk names it instead."""
    folder = tmp_path / "t"
    (folder / "sub").mkdir(parents=True)
    shutil.copyfile(VALID, folder / "b.jsonl")
    shutil.copyfile(VALID, folder / "sub" / "a.jsonl")
    real = os.scandir

    def fake_scandir(path: object = ".") -> object:
        if Path(os.fsdecode(path)) == folder / "sub":  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", os.fsdecode(path))  # type: ignore[arg-type]
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", fake_scandir)
    with pytest.raises(TraceError) as info:
        discover([folder])
    assert (info.value.file, info.value.category) == ("t/sub", "unreadable")
    assert str(tmp_path) not in str(info.value)


def test_the_walk_finds_what_rglob_found(tmp_path: Path) -> None:
    """The walk that replaced Path.rglob lists the same files in the same order, follows
    file symlinks and not directory symlinks (rglob's behaviour)."""
    root = tmp_path / "r"
    for rel in ("b.jsonl", "a/x.jsonl", "a/b/y.jsonl.gz", "a-b/z.traj", "note.txt", "c/w.ctxt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"{}")
    (root / "link.jsonl").symlink_to(root / "b.jsonl")
    (root / "dirlink").symlink_to(root / "a", target_is_directory=True)
    expected = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name.removesuffix(".gz").endswith(source_mod_suffixes())
    )
    found = [f.path for f in source_mod.iter_files(root, source_mod_suffixes())]
    assert found == expected
    assert root / "dirlink" / "x.jsonl" not in found


def source_mod_suffixes() -> tuple[str, ...]:
    from traces.discover import SUFFIXES

    return SUFFIXES


def test_the_compiled_bytes_of_naive_times_do_not_change_with_tz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R12 end to end: a session whose times carry no zone compiles to the same bytes under
    any machine zone (the compile cache keys on the source, so it must), and Codex reads a
    naive time as UTC too."""
    lines = [_valid_lines()[0], _valid_lines()[1]]
    naive = [json.loads(line) for line in lines]
    for row in naive:
        row["timestamp"] = row["timestamp"].removesuffix("Z")
        assert "+" not in row["timestamp"]
    path = tmp_path / "naive.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in naive) + "\n")
    seen = set()
    for tz in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        (unit,) = discover([path])
        seen.add(load_unit(unit).compiled_bytes())
        assert codex.parse_ts("2026-01-01T00:00:00") == 1_767_225_600_000
    monkeypatch.delenv("TZ")
    time.tzset()
    assert len(seen) == 1
