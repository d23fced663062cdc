"""Malformed Claude Code transcripts: a located error when strict, a count when lenient.

Each fixture in tests/fixtures/bad is the 7-line session `valid.jsonl` with one defect
planted at a known line (see tests/fixtures/bad/README.md). Strict mode must raise a
TraceError naming the fixture and that line; --lenient must import and count the defect;
the CLI must print one "error: <label>:<line>: ..." line (exit 2) and write nothing.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from simulator.cli import main
from simulator.model import Kind, Trace
from traces import jsonl
from traces.discover import discover
from traces.errors import TraceError
from traces.load import load_unit
from traces.source import ImportUnit, SourceFile

BAD = Path(__file__).parent / "fixtures" / "bad"
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
    return _cli(args + (["--lenient"] if lenient else []), tmp_path, monkeypatch), out


def _assert_cli_error(result: Result, out: Path, label: str, line: int, category: str) -> None:
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
    _assert_cli_error(result, out, case.fixture, case.line, case.category)


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
    _assert_cli_error(result, out, gz.name, 2, "invalid-json")


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
    _assert_cli_error(result, out, "garbage.jsonl", 1, "unknown-format")


def test_all_binary_file_named_explicitly_is_an_error_even_when_lenient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file given on the command line must be a trace (traces/discover.py)."""
    path = _random_bytes(tmp_path / "garbage.jsonl")
    result, out = _import(path, tmp_path, monkeypatch, lenient=True)
    _assert_cli_error(result, out, "garbage.jsonl", 1, "unknown-format")


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
    _assert_cli_error(result, out, "long.jsonl", TOOL_RESULT_LINE, "line-too-long")
    (tmp_path / "lenient").mkdir()
    result, out = _import(path, tmp_path / "lenient", monkeypatch, lenient=True)
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 1
