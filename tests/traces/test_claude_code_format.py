"""Reading Claude Code transcripts as current clients write them (issue 12): entry types no
list names, a first line longer than the detector's first read, every command's line about
what it skipped and passed over, and logged against priced output in `traces stats`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from reports.trace_stats import TABLE_COLUMNS, session_stats
from simulator.app.cli import main
from simulator.model import Kind
from simulator.pricing import PriceBook
from tests.traces.test_claude_code_forks import A2, Call, Transcript, conversation
from traces import discover as disc
from traces.load import load_unit
from traces.source import SourceFile


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def current(session: str = "sess-a") -> Transcript:
    """A 2.1.2xx-style file: metadata lines first and between the conversation lines."""
    t = conversation(session)
    head = [
        {"type": "ai-title", "sessionId": session, "aiTitle": "a title"},
        {"type": "permission-mode", "sessionId": session, "permissionMode": "default"},
    ]
    t.lines[2:2] = [{"type": "worktree-state", "sessionId": session, "worktree": None}]
    t.lines[:0] = head
    return t


def test_unlisted_metadata_types_are_counted_not_refused() -> None:
    """ai-title, permission-mode and worktree-state (2.1.8x+) carry no message: skipped and
    counted in strict mode, and the session reads as if they were absent."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (unit,) = disc.discover([current().write(Path(tmp) / "p" / "sess-a.jsonl")])
        trace = load_unit(unit, lenient=False).trace
        (unit2,) = disc.discover([conversation().write(Path(tmp) / "q" / "sess-a.jsonl")])
        plain = load_unit(unit2, lenient=False).trace
    assert trace.skipped == {}
    assert trace.stats["lines_metadata"] == 3
    assert trace.stats["lines_metadata_unlisted"] == 3
    assert trace.stats["lines"] == plain.stats["lines"] + 3
    assert trace.sessions[0].requests.equals(plain.sessions[0].requests)


def test_a_metadata_line_with_a_uuid_keeps_its_childs_place(tmp_path: Path) -> None:
    """A child naming an unlisted entry as its parent still has the path to the root."""
    t = conversation()
    t.lines.insert(3, {"type": "bridge-session", "uuid": "m1", "parentUuid": "u2"})
    t.lines[4]["parentUuid"] = "m1"  # a2 answers through the metadata line
    (unit,) = disc.discover([t.write(tmp_path / "p" / "sess-a.jsonl")])
    session = load_unit(unit).trace.sessions[0]
    texts = session.view_mask(1) & (session.blocks["kind"] == Kind.TEXT)
    assert int(texts.sum()) == 3  # both questions and the first answer


def test_a_first_line_longer_than_the_first_read_is_still_detected(tmp_path: Path) -> None:
    """The shape of ../shared/repro/fidelity/bigfirst: a queue-operation line of 100 KiB
    first. The session is read, and its subagent file joins it."""
    big = {"type": "queue-operation", "operation": "enqueue", "content": "x" * 100_000}
    t = conversation()
    t.lines.insert(0, {**big, "sessionId": "sess-a"})
    main_file = t.write(tmp_path / "proj" / "sess-a.jsonl")
    assert main_file.read_bytes().index(b"\n") > 1 << 16
    agent = Transcript("sess-a", agent="a1b2")
    agent.user("s1", "look this up")
    agent.call("sa1", Call("msg_s1", (3, 0, 4_000, 20)))
    agent.write(tmp_path / "proj" / "sess-a" / "subagents" / "agent-a1b2.jsonl")

    assert disc.detect(SourceFile(main_file, "sess-a.jsonl")) == "claude-code"
    units, others = disc.discover_all([tmp_path])
    assert others == []
    (unit,) = units
    assert unit.roles == ["subagent"]
    trace = load_unit(unit).trace
    assert [(s.kind, s.parent, s.n_requests) for s in trace.sessions] == [
        ("main", -1, 2),
        ("subagent", 0, 1),
    ]


def test_a_first_line_beyond_the_detector_limit_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is on bytes read, not on where the first newline falls."""
    monkeypatch.setattr(disc, "DETECT_BYTES", 1_000)
    t = conversation()
    t.lines.insert(0, {"type": "queue-operation", "content": "x" * 2_000, "sessionId": "s"})
    t.write(tmp_path / "d" / "sess-a.jsonl")
    units, others = disc.discover_all([tmp_path / "d"])
    assert (units, others) == ([], ["d/sess-a.jsonl"])


# -- the line every command prints -----------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """One current transcript (3 metadata lines, 1 `<synthetic>` error line, 1 damaged
    line) and one file holding no trace."""
    t = current()
    t.lines.append(
        {
            "type": "assistant",
            "uuid": "x1",
            "parentUuid": t.parent,
            "sessionId": "sess-a",
            "timestamp": "2026-03-01T11:00:00.000Z",
            "message": {"model": "<synthetic>", "id": "e1", "role": "assistant", "content": []},
            "isApiErrorMessage": True,
        }
    )
    root = tmp_path / "in"
    path = t.write(root / "sess-a.jsonl")
    path.write_text(path.read_text() + '{"type": "user", "oops\n', encoding="utf-8")
    (root / "notes.json").write_text('{"hello": "world"}\n', encoding="utf-8")
    return root


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


LINE = (
    "input: 1 trace(s); skipped 4 line(s) (3 metadata, 1 client-error); "
    "1 damaged line(s) skipped; 0 copied call(s) counted once; "
    "passed over 1 file(s) holding no trace of a known format"
)


def test_stats_table_and_json_say_what_was_skipped(folder: Path) -> None:
    table = cli("traces", "stats", folder, "--lenient")
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[-1] == LINE
    as_json = cli("traces", "stats", folder, "--lenient", "--json")
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)  # stdout stays one JSON document
    assert len(document["sessions"]) == 1 and document["skipped_lines"] == 1
    assert as_json.stderr.splitlines()[-1] == LINE


def test_import_validate_run_and_fidelity_say_what_was_skipped(
    folder: Path, tmp_path: Path
) -> None:
    imported = cli("traces", "import", folder, "--out", tmp_path / "c", "--lenient")
    assert imported.exit_code == 0, imported.output
    assert imported.stdout.splitlines()[-1] == LINE
    again = cli("traces", "import", folder, "--out", tmp_path / "c2", "--lenient")
    assert "(1 from cache)" in again.stdout  # the counts come from the cached meta.json
    assert again.stdout.splitlines()[-1] == LINE
    validated = cli("traces", "validate", folder, "--lenient")
    assert validated.exit_code == 0, validated.output
    lines = validated.stdout.splitlines()
    assert lines[-2] == LINE
    assert lines[-1] == "1 trace(s), 1 problem(s), 1 file(s) passed over"
    ran = cli("run", folder, "--out", tmp_path / "r", "--no-report", "--lenient")
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.splitlines()[-1] == LINE
    fid = cli("fidelity", folder, "--lenient")
    assert fid.exit_code == 0, fid.output
    assert fid.stdout.splitlines()[-1] == LINE


def test_strict_commands_say_what_they_skipped_without_damage(tmp_path: Path) -> None:
    root = tmp_path / "in"
    current().write(root / "sess-a.jsonl")
    result = cli("fidelity", root)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "input: 1 trace(s); skipped 3 line(s) (3 metadata, 0 client-error); "
        "0 copied call(s) counted once; "
        "passed over 0 file(s) holding no trace of a known format"
    )


# -- output: logged and priced ------------------------------------------------------------


def test_stats_show_logged_and_priced_output_apart(tmp_path: Path) -> None:
    """A call whose logged output (1 token, a streaming snapshot) is far below its
    response's length is priced at the tokenizer's count; the logged figure stays shown."""
    t = Transcript("sess-a")
    t.user("u1", "write a long answer")
    t.call("a1", Call("msg_1", (3, 0, 10_000, 1)), "word " * 400)
    t.user("u2", "thanks")
    t.call("a2", A2)
    (unit,) = disc.discover([t.write(tmp_path / "p" / "sess-a.jsonl")])
    trace = load_unit(unit).trace
    df = session_stats([("t", trace)], PriceBook())
    (row,) = df.to_dicts()
    assert row["output_recorded"] == 1 + A2.usage[3]
    assert row["output"] > 350 + A2.usage[3]
    assert row["output"] == int(trace.sessions[0].requests["output"].sum())
    assert {c for c, _, _ in TABLE_COLUMNS} >= {"output", "output_recorded"}
