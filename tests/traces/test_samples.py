"""The invented sample traces in traces/samples import strictly, with the expected shape.

Every number below is what traces/samples/make_samples.py wrote (its usage model is
described there and in traces/samples/README.md); `make_samples.py --facts` prints them.
"""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from click.testing import CliRunner

from simulator.app.cli import main
from simulator.model import NEVER, Flag, Kind, Session, Trace
from tests.support import SAMPLES
from traces.discover import discover
from traces.load import load_unit

CLAUDE = SAMPLES / "claude-code"
PROJECT = CLAUDE / "-work-demo"
MAIN_ID = "7c1f9e42-5b8d-4a3e-9f60-2d4b8a1c3e75"
V1_ID = "3e8a0b6d-1c47-4f92-8d15-6a9e2f4c7b08"
MAIN = PROJECT / f"{MAIN_ID}.jsonl"
AGENT = PROJECT / MAIN_ID / "subagents" / "agent-a1b2c3d.jsonl"
V1 = PROJECT / f"{V1_ID}.jsonl"
CODEX = (
    SAMPLES
    / "codex/2025/10/14/rollout-2025-10-14T09-12-03-0199e1a4-afb6-7b18-8cbf-e47451adbcdd.jsonl"
)
TRAJ = SAMPLES / "swe-agent" / "tinyledger-7.traj"

#: The 2.1.x main session's system prefix, written once with a 1-hour TTL.
PREFIX_1H = 16_418
GAP_REQUEST = 20  # first request after the 10.5-minute idle gap
COMPACT_REQUEST = 40  # first request after the auto compaction


def _label(path: Path, root: Path) -> str:
    return str(path.relative_to(root.parent))


def _totals(s: Session) -> dict[str, int]:
    r = s.requests
    names = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output_recorded")
    return {name: int(r[name].sum()) for name in names}


@pytest.fixture(scope="module")
def claude() -> dict[str, Trace]:
    """The two Claude Code traces, imported strictly (any problem raises)."""
    out = {}
    for unit in discover([CLAUDE]):
        loaded = load_unit(unit, lenient=False)
        assert loaded.problems == []
        out[unit.label] = loaded.trace
    return out


@pytest.fixture(scope="module")
def main_trace(claude: dict[str, Trace]) -> Trace:
    return claude[_label(MAIN, CLAUDE)]


@pytest.fixture(scope="module")
def v1_trace(claude: dict[str, Trace]) -> Trace:
    return claude[_label(V1, CLAUDE)]


def _generator() -> ModuleType:
    path = SAMPLES / "make_samples.py"
    spec = importlib.util.spec_from_file_location("ctxsim_make_samples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


# -- the files -----------------------------------------------------------------------------


def test_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    facts = _generator().generate(tmp_path)
    written = sorted(facts["bytes"])
    for name in written:
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name
    committed = sorted(
        str(p.relative_to(SAMPLES))
        for p in SAMPLES.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert committed == sorted([*written, "README.md", "make_samples.py"])


def test_generator_facts_match_the_readme_numbers(tmp_path: Path) -> None:
    facts = _generator().generate(tmp_path)
    assert facts["main"]["requests"] == 53
    assert facts["main"]["lines"] == 80  # assistant lines: one per content block
    assert facts["main"]["compactions"][0]["request"] == COMPACT_REQUEST
    assert facts["main"]["compactions"][0]["pre_tokens"] == 168_745
    assert 3_300 < facts["main"]["duration_s"] < 3_600  # about an hour of trace time


def test_discover_groups_the_samples() -> None:
    units = discover([SAMPLES])
    assert [(u.label, u.format) for u in units] == [
        (_label(V1, SAMPLES), "claude-code"),
        (_label(MAIN, SAMPLES), "claude-code"),
        (_label(CODEX, SAMPLES), "codex"),
        (_label(TRAJ, SAMPLES), "swe-agent"),
    ]
    main_unit = units[1]
    assert [f.path for f in main_unit.files] == [MAIN, AGENT]
    assert main_unit.roles == ["subagent"]
    assert [f.path for f in units[0].files] == [V1]


# -- the 2.1.x session and its subagent ----------------------------------------------------


def test_main_trace_sessions(main_trace: Trace) -> None:
    assert main_trace.format == "claude-code"
    assert main_trace.skipped == {} and main_trace.skipped_at == []
    main_s, agent = main_trace.sessions
    assert (main_s.id, main_s.kind, main_s.parent) == (MAIN_ID, "main", -1)
    assert main_s.client == "claude-code 2.1.34"
    assert main_s.models == ["claude-opus-4-5-20251101"]
    assert main_s.n_requests == 53
    assert sorted(main_s.tools) == ["Bash", "Edit", "Grep", "Read", "Task", "Write"]
    # the subagent file is linked to its parent session
    assert (agent.id, agent.kind, agent.parent) == ("agent-a1b2c3d", "subagent", 0)
    assert agent.models == ["claude-haiku-4-5-20251001"]
    assert agent.n_requests == 4
    assert sorted(agent.tools) == ["Grep", "Read"]
    assert agent.events == []


def test_main_trace_stats(main_trace: Trace) -> None:
    stats = main_trace.stats
    assert stats["lines_synthetic"] == 1  # the <synthetic> API-error line
    assert stats["outputs_from_tokenizer"] == 0  # the last line of each call has the output
    assert stats["unexplained_shrinks"] == 0
    assert stats["injected_blocks"] == 1  # the files restored at the compaction, unlogged


def test_main_recorded_usage_totals(main_trace: Trace) -> None:
    main_s, agent = main_trace.sessions
    assert _totals(main_s) == {
        "input": 395,
        "cache_read": 3_340_624,
        "cache_write_5m": 227_130,
        "cache_write_1h": PREFIX_1H,
        "output_recorded": 7_542,
    }
    assert _totals(agent) == {
        "input": 27,
        "cache_read": 27_081,
        "cache_write_5m": 12_958,
        "cache_write_1h": 0,
        "output_recorded": 194,
    }


def test_main_cache_follows_the_5_minute_model(main_trace: Trace) -> None:
    s = main_trace.sessions[0]
    r = s.requests
    ctx = s.recorded_context()
    gaps = np.diff(r["ts"]) / 1000
    assert gaps[GAP_REQUEST - 1] > 600  # the idle gap: more than 10 minutes
    assert np.delete(gaps, GAP_REQUEST - 1).max() < 300  # every other call within 5 min
    # 1-hour writes: the system prefix, once, at the first request
    assert r["cache_write_1h"].tolist() == [PREFIX_1H] + [0] * 52
    assert r["cache_read"][0] == 0
    for k in range(1, s.n_requests):
        if k in (GAP_REQUEST, COMPACT_REQUEST):
            # expired (gap) or a new message prefix (compaction): only the prefix is read
            assert r["cache_read"][k] == PREFIX_1H
            assert r["cache_write_5m"][k] > 25_000
        else:
            # within 5 minutes: read what the previous call cached
            assert r["cache_read"][k] == ctx[k - 1] - r["input"][k - 1], k
    assert int(r["cache_write_5m"][GAP_REQUEST]) == 43_376
    assert ctx.max() < 167_000  # no recorded request crossed the compaction threshold


def test_main_compaction_event(main_trace: Trace) -> None:
    s = main_trace.sessions[0]
    assert len(s.events) == 1
    event = s.events[0]
    assert (event.request, event.trigger, event.pre_tokens) == (COMPACT_REQUEST, "auto", 168_745)
    b = s.blocks
    assert b["kind"][event.summary_block] == Kind.SUMMARY
    assert b["flags"][event.summary_block] & Flag.ARTIFACT
    # what the recording sent after the compaction: the summary, then the restored files,
    # which the transcript does not log: an INJECTED artifact sized from the usage
    recorded = s.view_mask(COMPACT_REQUEST, as_recorded=True)
    restored = event.summary_block + 1
    assert np.flatnonzero(recorded).tolist() == [event.summary_block, restored]
    assert b["kind"][restored] == Kind.INJECTED and b["flags"][restored] & Flag.ARTIFACT
    assert sorted(set(b["compacted_at"].tolist())) == [COMPACT_REQUEST, NEVER]
    # the logical history keeps everything before the boundary
    assert s.view_mask(COMPACT_REQUEST).sum() == event.summary_block


def test_anchored_counts_reproduce_recorded_context(claude: dict[str, Trace]) -> None:
    for trace in claude.values():
        for s in trace.sessions:
            ctx = s.recorded_context()
            for k in range(s.n_requests):
                view = s.view_mask(k, as_recorded=True)
                assert s.prefix_tokens + int(s.blocks["tokens"][view].sum()) == ctx[k]


def test_main_blocks(main_trace: Trace) -> None:
    s = main_trace.sessions[0]
    b = s.blocks
    kinds = np.bincount(b["kind"], minlength=len(Kind)).tolist()
    assert kinds[Kind.THINKING] == 20
    assert kinds[Kind.TOOL_USE] == kinds[Kind.TOOL_RESULT] == 46
    assert kinds[Kind.SUMMARY] == 1
    human = (b["flags"] & Flag.HUMAN) != 0
    assert int(human.sum()) == 9  # seven turns, a queued message and "try again"
    # every tool_result pairs with its tool_use, both ways
    results = np.flatnonzero(b["kind"] == Kind.TOOL_RESULT)
    assert (b["link"][results] >= 0).all()
    assert (b["kind"][b["link"][results]] == Kind.TOOL_USE).all()
    assert (b["link"][b["link"][results]] == results).all()
    # file paths, on the tool_use and its tool_result: Read reads, Edit and Write write
    has_tool = b["tool"] >= 0
    tool = np.array(s.tools)[b["tool"][has_tool]]
    flags = b["flags"][has_tool]
    assert (((flags & Flag.PATH_READ) != 0) == (tool == "Read")).all()
    assert (((flags & Flag.PATH_WRITE) != 0) == np.isin(tool, ["Edit", "Write"])).all()
    assert (tool == "Read").sum() == 2 * 18
    assert np.isin(tool, ["Edit", "Write"]).sum() == 2 * 11


def test_subagent_has_no_human_blocks(main_trace: Trace) -> None:
    agent = main_trace.sessions[1]
    assert not ((agent.blocks["flags"] & Flag.HUMAN) != 0).any()


# -- the 1.0.x session ---------------------------------------------------------------------


def test_v1_session_with_inline_sidechain(v1_trace: Trace) -> None:
    assert v1_trace.skipped == {}
    main_s, side = v1_trace.sessions
    assert (main_s.id, main_s.kind, main_s.parent) == (V1_ID, "main", -1)
    assert main_s.client == "claude-code 1.0.53"
    assert (side.id, side.kind, side.parent) == (f"{V1_ID}/sidechain-0", "subagent", 0)
    assert (main_s.n_requests, side.n_requests) == (13, 2)
    assert side.tools == ["Grep"]
    assert _totals(main_s) == {
        "input": 90,
        "cache_read": 202_785,
        "cache_write_5m": 35_744,
        "cache_write_1h": 0,
        "output_recorded": 365,
    }
    assert _totals(side) == {
        "input": 15,
        "cache_read": 11_222,
        "cache_write_5m": 11_326,
        "cache_write_1h": 0,
        "output_recorded": 53,
    }


def test_v1_compaction_is_the_summary_line(v1_trace: Trace) -> None:
    s = v1_trace.sessions[0]
    assert len(s.events) == 1
    event = s.events[0]
    assert (event.request, event.trigger, event.pre_tokens) == (10, "unknown", -1)
    assert s.blocks["kind"][event.summary_block] == Kind.SUMMARY
    # after a /compact the system prefix is still warm: read it, write the summary
    assert s.requests["cache_read"][10] == 13_947
    assert s.requests["cache_write_5m"][10] == 181


def test_gzip_copy_reads_the_same(tmp_path: Path, v1_trace: Trace) -> None:
    gz = tmp_path / f"{V1.name}.gz"
    gz.write_bytes(gzip.compress(V1.read_bytes(), mtime=0))
    (unit,) = discover([gz])
    assert unit.format == "claude-code" and unit.label == gz.name
    assert load_unit(unit).trace.equals(v1_trace)


# -- Codex and SWE-agent -------------------------------------------------------------------


def test_codex_sample() -> None:
    pytest.importorskip("traces.codex")
    (unit,) = discover([SAMPLES / "codex"])
    assert unit.format == "codex"
    trace = load_unit(unit).trace
    assert trace.skipped == {}
    (s,) = trace.sessions
    assert s.n_requests == 7
    assert s.tools == ["shell"]
    assert s.models == ["gpt-5-codex"]
    # Codex counts cached tokens inside input_tokens: 28,735 sent, 23,296 of them cached
    assert _totals(s) == {
        "input": 28_735 - 23_296,
        "cache_read": 23_296,
        "cache_write_5m": 0,
        "cache_write_1h": 0,
        "output_recorded": 1_298,
    }


def test_swe_agent_sample() -> None:
    pytest.importorskip("traces.swe_agent")
    (unit,) = discover([SAMPLES / "swe-agent"])
    assert unit.format == "swe-agent"
    trace = load_unit(unit).trace
    assert trace.skipped == {}
    (s,) = trace.sessions
    assert s.n_requests == 5
    assert s.models == ["gpt-4o-2024-08-06"]
    # `python` is a shell command's first word: `bash` in outputs (traces/load.py)
    assert s.tools == ["search_dir", "open", "edit", "bash", "submit"]
    assert not s.requests["has_usage"].any()
    assert trace.stats["model_tokens_sent"] == 3_839
    assert trace.stats["model_api_calls"] == 5


# -- through the command line --------------------------------------------------------------


def test_cli_validate_samples(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["traces", "validate", str(SAMPLES)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "4 trace(s), 0 problem(s)"


def test_cli_import_samples(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "compiled"
    out.mkdir()
    args = ["traces", "import", str(SAMPLES), "--out", str(out), "--no-cache"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 4


def test_cli_import_creates_the_output_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CTXSIM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out" / "compiled"
    args = ["traces", "import", str(V1), "--out", str(out), "--no-cache"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.ctxt"))) == 1
