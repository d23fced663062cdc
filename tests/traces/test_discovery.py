"""Finding a user's sessions with no SRC (traces/home.py), the filters (traces/select.py),
damaged lines skipped by default with their count, --strict, and error paths as given.

The fake home is built here from tests/fixtures: two Claude Code sessions (projects
`alpha`, started 2026-05-02 10:00 UTC, and `beta`, 2026-06-10 10:00 UTC, whose file ends in
one damaged line) under ~/.claude/projects, and the Codex rollout of
tests/fixtures/codex/rollout_2026.jsonl (project `egret-workspace`, 2025-01-02 03:05 UTC)
under ~/.codex/sessions.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from simulator.app.cli import main
from tests.support import FIXTURES
from traces.home import HomeError, default_places
from traces.select import Filters, SessionInfo, folder_project, parse_date

VALID = FIXTURES / "bad" / "valid.jsonl"
ROLLOUT = FIXTURES / "codex" / "rollout_2026.jsonl"
SID = {"alpha": "aaaa1111-0000-4000-8000-000000000001", "beta": "bbbb2222-0000-4000-8000-00000002"}


def session_file(path: Path, project: str, day: str, *, damaged: bool = False) -> Path:
    """valid.jsonl as a session of `project` (cwd /home/me/src/<project>) on `day`."""
    lines = []
    for raw in VALID.read_text(encoding="utf-8").splitlines():
        obj = json.loads(raw)
        obj["sessionId"] = SID[project]
        obj["cwd"] = f"/home/me/src/{project}"
        obj["timestamp"] = obj["timestamp"].replace("2025-11-20", day)
        message = obj.get("message")
        if isinstance(message, dict) and "id" in message:
            message["id"] = f"{message['id']}_{project}"  # each session its own calls
        lines.append(json.dumps(obj))
    if damaged:
        lines.append('{"type": "user", "oops')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    projects = root / ".claude" / "projects"
    session_file(projects / "-home-me-src-alpha" / f"{SID['alpha']}.jsonl", "alpha", "2026-05-02")
    beta = projects / "-home-me-src-beta" / f"{SID['beta']}.jsonl"
    session_file(beta, "beta", "2026-06-10", damaged=True)
    codex = root / ".codex" / "sessions" / "2025" / "01" / "02" / "rollout-fixture.jsonl"
    codex.parent.mkdir(parents=True)
    codex.write_bytes(ROLLOUT.read_bytes())
    monkeypatch.setenv("HOME", str(root))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    return root


def ctxsim(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _projects(result: Result) -> list[str]:
    """The project column of a `traces stats` table (rows between the rule and TOTAL)."""
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line) == {"─"})
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("TOTAL"):
            return rows
        if line[:1] != " ":
            rows.append(line.split()[0])
    raise AssertionError(result.stdout)


def _read_line(result: Result) -> str:
    (line,) = [x for x in result.output.splitlines() if x.startswith("read ")]
    return line


# -- where the data lives ------------------------------------------------------------------


def test_default_places_are_the_agents_own(tmp_path: Path) -> None:
    home = tmp_path / "h"
    (home / ".claude" / "projects").mkdir(parents=True)
    (home / ".codex" / "sessions").mkdir(parents=True)
    found = default_places("all", {}, home)
    assert [(p.agent, p.shown) for p in found] == [
        ("claude-code", "~/.claude/projects"),
        ("codex", "~/.codex/sessions"),
    ]
    assert [p.agent for p in default_places("codex", {}, home)] == ["codex"]
    (home / ".config" / "claude" / "projects").mkdir(parents=True)  # the XDG place, first
    assert [p.shown for p in default_places("claude-code", {}, home)] == [
        "~/.config/claude/projects",
        "~/.claude/projects",
    ]


def test_claude_config_dir_replaces_the_home_folders(tmp_path: Path) -> None:
    home = tmp_path / "h"
    (home / ".claude" / "projects").mkdir(parents=True)
    for name in ("one", "two"):
        (tmp_path / name / "projects").mkdir(parents=True)
    env = {"CLAUDE_CONFIG_DIR": f"{tmp_path / 'one'}, {tmp_path / 'two'}"}  # ccusage's list
    found = default_places("claude-code", env, home)
    assert [p.path for p in found] == [tmp_path / "one" / "projects", tmp_path / "two" / "projects"]
    codex_env = {"CODEX_HOME": str(tmp_path / "one")}
    (tmp_path / "one" / "sessions").mkdir()
    assert [p.path for p in default_places("codex", codex_env, home)] == [
        tmp_path / "one" / "sessions"
    ]


def test_no_folder_at_all_is_one_line_naming_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(HomeError, match=r"~/\.claude/projects, ~/\.codex/sessions"):
        default_places("all", {"CLAUDE_CONFIG_DIR": ""}, tmp_path)
    with pytest.raises(HomeError, match=r"~/\.config/claude/projects, ~/\.claude/projects;"):
        default_places("claude-code", {}, tmp_path)


def test_no_src_reads_every_agent_found(home: Path) -> None:
    result = ctxsim("traces", "stats")
    assert result.exit_code == 0, result.output
    assert _projects(result) == ["alpha", "beta", "egret-workspace"]  # in file-label order
    assert _read_line(result) == (
        "read 3 session(s) in 3 project(s), 2025-01-02 to 2026-06-10 "
        "from ~/.claude/projects, ~/.codex/sessions"
    )
    assert "2026-05-02 10:00" in result.stdout  # start times in the table
    only = ctxsim("traces", "stats", "--agent", "claude-code")
    assert _projects(only) == ["alpha", "beta"]


def test_claude_config_dir_is_read_instead_of_the_home_folder(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "elsewhere"
    session_file(other / "projects" / "-srv-gamma" / f"{SID['alpha']}.jsonl", "alpha", "2026-07-01")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(other))
    result = ctxsim("traces", "stats", "--agent", "claude-code")
    assert result.exit_code == 0, result.output
    assert _projects(result) == ["alpha"]
    assert f"2026-07-01 to 2026-07-01 from {other / 'projects'} (agent" in _read_line(result)


def test_a_folder_given_is_read_and_the_home_is_not(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "given"
    session_file(folder / "s.jsonl", "alpha", "2026-01-01")
    result = ctxsim("traces", "stats", folder)
    assert result.exit_code == 0, result.output
    assert _read_line(result) == "read 1 session(s) in 1 project(s), 2026-01-01 to 2026-01-01"


# -- filters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["--since", "2026-06-01"], ["beta"]),
        (["--since", "2026-05-02"], ["alpha", "beta"]),  # the whole day counts
        (["--until", "2026-05-02"], ["alpha", "egret-workspace"]),
        (["--since", "20260503", "--until", "2026-06-10"], ["beta"]),  # ccusage's form too
        (["--project", "ALPHA"], ["alpha"]),  # names match in any case
        (["--project", "b*", "--project", "egret-*"], ["beta", "egret-workspace"]),
        (["--session", "bbbb2222"], ["beta"]),  # an id prefix
        (["--session", "fixture-20"], ["egret-workspace"]),
        (["--agent", "all", "--since", "2027-01-01"], []),
    ],
)
def test_each_filter_keeps_its_sessions(home: Path, args: list[str], kept: list[str]) -> None:
    result = ctxsim("traces", "stats", *args)
    assert result.exit_code == 0, result.output
    assert _projects(result) == kept
    assert f"{3 - len(kept)} other(s) left out)" in _read_line(result)


def test_run_with_a_filter_that_keeps_nothing_says_so(home: Path, tmp_path: Path) -> None:
    result = ctxsim("run", "--project", "nope", "--out", tmp_path / "o", "--no-report")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: no session in ~/.claude/projects, ~/.codex/sessions matches project nope"
    )


def test_bad_dates_are_refused(home: Path) -> None:
    assert ctxsim("traces", "stats", "--since", "May 2").exit_code == 2
    result = ctxsim("traces", "stats", "--since", "2026-06-02", "--until", "2026-06-01")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --until 2026-06-01 is before --since 2026-06-02"


def test_filters_and_names_by_hand() -> None:
    info = SessionInfo("abc-123", "abc-123", "Web", 1_780_000_000_000, "claude-code")
    assert info.start_text == "2026-05-28 20:26"
    assert Filters(projects=("w?b",)).keeps(info)
    assert not Filters(sessions=("abd",)).keeps(info)
    assert Filters(until=date(2026, 5, 28)).keeps(info)
    assert not Filters(until=date(2026, 5, 27)).keeps(info)
    undated = SessionInfo("x", "x", None, None, "swe-agent")
    assert Filters().keeps(undated) and not Filters(since=date(2020, 1, 1)).keeps(undated)
    assert not Filters(agent="codex").keeps(info)
    assert folder_project("-home-me-src-my-app", Path("/home/me")) == "src-my-app"
    assert folder_project("wakil", Path("/home/me")) == "wakil"
    assert parse_date("2026-05-02") == parse_date("20260502") == date(2026, 5, 2)
    with pytest.raises(ValueError, match="not a date"):
        parse_date("2026/05/02")


# -- damaged lines -------------------------------------------------------------------------


def test_damaged_lines_are_skipped_by_default_with_one_count(home: Path, tmp_path: Path) -> None:
    pointer = (
        "1 damaged line(s) skipped (1 invalid-json): `ctxsim traces validate` lists them;"
        " --strict stops"
    )
    for args in (
        ["traces", "stats"],
        ["traces", "import", "--out", tmp_path / "c"],
        ["run", "--out", tmp_path / "r", "--no-report", "--policy", "as-recorded"],
        ["fidelity"],
        ["traces", "stats", "--lenient"],  # the old flag: accepted, and the default
    ):
        result = ctxsim(*args)
        assert result.exit_code == 0, (args, result.output)
        assert sum(pointer in line for line in result.output.splitlines()) == 1, args
    as_json = ctxsim("traces", "stats", "--json")
    document = json.loads(as_json.stdout)  # stdout stays one JSON document
    assert document["skipped_lines"] == 1
    assert all("skipped" not in row for row in document["sessions"])
    assert pointer in as_json.stderr


def test_strict_stops_at_the_first_with_the_path_as_given(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beta = f"~/.claude/projects/-home-me-src-beta/{SID['beta']}.jsonl"
    result = ctxsim("traces", "stats", "--strict")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {beta}:8: ") and line.endswith("[invalid-json]")
    # a relative SRC is printed as the user typed it, not from its parent folder
    monkeypatch.chdir(home / ".claude")
    result = ctxsim("run", "projects", "--strict", "--out", tmp_path / "o", "--no-report")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: projects/-home-me-src-beta/{SID['beta']}.jsonl:8: ")
    named = ctxsim("traces", "stats", f"projects/-home-me-src-beta/{SID['beta']}.jsonl", "--strict")
    assert named.stderr.startswith(f"error: projects/-home-me-src-beta/{SID['beta']}.jsonl:8: ")


def test_validate_lists_by_default_and_fails_with_strict(home: Path) -> None:
    result = ctxsim("traces", "validate", "--agent", "claude-code")
    assert result.exit_code == 0, result.output
    beta = f"~/.claude/projects/-home-me-src-beta/{SID['beta']}.jsonl"
    assert f"{beta}:8: " in result.stdout
    assert result.stdout.splitlines()[-1] == "2 trace(s), 1 problem(s)"
    assert ctxsim("traces", "validate", "--agent", "claude-code", "--strict").exit_code == 1


def test_input_that_is_not_a_damaged_line_still_stops(home: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\x00\x01 not a trace")
    result = ctxsim("traces", "stats", garbage)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {garbage}:1: ") and line.endswith("[unknown-format]")


# -- what stats writes ---------------------------------------------------------------------


def test_stats_parquet_names_traces_without_paths_or_projects(home: Path, tmp_path: Path) -> None:
    """R20 (../shared/repro/reliability): the rows named each source by its relative path,
    which spells out the home and project folders."""
    out = tmp_path / "stats.parquet"
    assert ctxsim("traces", "stats", "--parquet", out).exit_code == 0
    frame = pl.read_parquet(out)
    cells = [str(v) for c in frame.select(pl.col(pl.String)).columns for v in frame[c]]
    for word in ("alpha", "beta", "home", "projects", "egret", ".jsonl", "/"):
        assert not any(word in cell for cell in cells), word
    assert frame["trace"].str.contains(r"^[0-9a-z_-]+-[0-9a-f]{12}$").all()
    assert frame["start"].dtype == pl.Datetime("ms", "UTC")
    assert sorted(frame["session"].to_list()) == sorted([*SID.values(), "fixture-2026"])
