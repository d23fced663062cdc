"""The Claude Code reader against every real transcript in ../shared/traces.

Expectations here are computed independently, straight from the raw JSON with the standard
library, not through the reader's code.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from simulator.model import Flag, Kind, Trace
from traces import claude_code
from traces.discover import discover
from traces.errors import Problems, TraceError
from traces.source import ImportUnit


def _claude_files(shared: Path) -> list[Path]:
    return sorted((shared / "claude-code").rglob("*.jsonl"))


@cache
def _units(root: str) -> list[ImportUnit]:
    return [u for u in discover([Path(root) / "claude-code"]) if u.format == "claude-code"]


@cache
def _read(root: str, label: str) -> Trace:
    unit = next(u for u in _units(root) if u.label == label)
    return claude_code.read(unit, [f.read() for f in unit.files], Problems(lenient=True))


def _raw_lines(path: Path) -> list[tuple[int, dict | None]]:
    out: list[tuple[int, dict | None]] = []
    with path.open("rb") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                out.append((i, json.loads(line)))
            except ValueError:
                out.append((i, None))
    return out


def test_every_shared_file_is_discovered(shared: Path) -> None:
    units = _units(str(shared))
    covered = {f.path for u in units for f in u.files}
    assert covered == set(_claude_files(shared))


def test_broken_lines_strict_and_lenient(shared: Path) -> None:
    """329 redaction-broken lines: strict names the first of each file, lenient counts all."""
    total_broken = 0
    for unit in _units(str(shared)):
        broken = {f.label: [i for i, obj in _raw_lines(f.path) if obj is None] for f in unit.files}
        n = sum(len(v) for v in broken.values())
        total_broken += n
        trace = _read(str(shared), unit.label)
        assert sum(trace.skipped.values()) >= n
        assert trace.skipped.get("invalid-json", 0) == n
        if n:
            with pytest.raises(TraceError) as err:
                claude_code.read(unit, [f.read() for f in unit.files], Problems(lenient=False))
            first_file = next(label for label, lines in broken.items() if lines)
            assert err.value.file == first_file
            assert err.value.line == broken[first_file][0]
            assert err.value.category == "invalid-json"
    assert total_broken == 329


def _independent_usage(path: Path) -> dict[str, int]:
    """Sum of recorded usage, one per message id, synthetic lines skipped."""
    seen: set[str] = set()
    totals = {"input": 0, "cache_read": 0, "cache_write": 0, "requests": 0}
    for _, obj in _raw_lines(path):
        if not obj or obj.get("type") != "assistant":
            continue
        msg = obj["message"]
        if msg.get("model") == "<synthetic>" or msg["id"] in seen or "usage" not in msg:
            continue
        seen.add(msg["id"])
        u = msg["usage"]
        totals["input"] += u.get("input_tokens", 0)
        totals["cache_read"] += u.get("cache_read_input_tokens", 0)
        totals["cache_write"] += u.get("cache_creation_input_tokens", 0)
        totals["requests"] += 1
    return totals


def test_recorded_usage_totals_match_raw_json(shared: Path) -> None:
    for unit in _units(str(shared)):
        trace = _read(str(shared), unit.label)
        expected = {"input": 0, "cache_read": 0, "cache_write": 0, "requests": 0}
        for f in unit.files:
            for key, v in _independent_usage(f.path).items():
                expected[key] += v
        r = [s.requests for s in trace.sessions]
        got = {
            "input": sum(int(x["input"].sum()) for x in r),
            "cache_read": sum(int(x["cache_read"].sum()) for x in r),
            "cache_write": sum(int((x["cache_write_5m"] + x["cache_write_1h"]).sum()) for x in r),
            "requests": sum(int(x["has_usage"].sum()) for x in r),
        }
        assert got == expected, unit.label


def test_anchored_counts_reproduce_recorded_context(shared: Path) -> None:
    """At every request whose recorded context grew, the anchored view equals it exactly."""
    inexact: dict[str, int] = {}
    for unit in _units(str(shared)):
        trace = _read(str(shared), unit.label)
        for s in trace.sessions:
            ctx = s.recorded_context()
            has = s.requests["has_usage"]
            tokens = s.blocks["tokens"]
            for k in range(1, s.n_requests):
                if not (has[k] and has[k - 1]) or ctx[k] <= ctx[k - 1]:
                    continue
                view = s.view_mask(k, as_recorded=True)
                if int(tokens[view].sum()) + s.prefix_tokens != ctx[k]:
                    inexact[s.id] = inexact.get(s.id, 0) + 1
    assert inexact == {}


def test_unlogged_shrinks_are_earlier_turns_thinking(shared: Path) -> None:
    """Twelve requests shrink with no logged compaction: all Sonnet 4.5, all at a new human
    turn, where the API stops counting earlier turns' thinking. The reader models that rule
    (thinking blocks are tombstoned there), which is what makes them exact."""
    shrinks = []
    for unit in _units(str(shared)):
        trace = _read(str(shared), unit.label)
        for s in trace.sessions:
            ctx = s.recorded_context()
            has = s.requests["has_usage"]
            compaction_requests = {e.request for e in s.events}
            for k in range(1, s.n_requests):
                if has[k] and has[k - 1] and ctx[k] < ctx[k - 1] and k not in compaction_requests:
                    b = s.blocks
                    stripped = (b["hidden_from"] == k) & (b["kind"] == Kind.THINKING)
                    new_human = (b["first_request"] == k) & ((b["flags"] & Flag.HUMAN) != 0)
                    model = s.models[s.requests["model"][k]]
                    shrinks.append((s.id, k, bool(stripped.any()), bool(new_human.any()), model))
    assert len(shrinks) == 12
    assert all(stripped and human for _, _, stripped, human, _ in shrinks), shrinks
    assert {model for *_, model in shrinks} == {"claude-sonnet-4-5-20250929"}


def test_recorded_compactions_are_events(shared: Path) -> None:
    expected: dict[str, int] = {}
    for path in _claude_files(shared):
        n = sum(
            1
            for _, obj in _raw_lines(path)
            if obj
            and (
                obj.get("subtype") == "compact_boundary"
                or (obj.get("isCompactSummary") and obj.get("parentUuid") is None)
            )
        )
        if n:
            expected[path.name] = n
    got: dict[str, int] = {}
    for unit in _units(str(shared)):
        trace = _read(str(shared), unit.label)
        n = sum(len(s.events) for s in trace.sessions)
        if n:
            got[unit.files[0].path.name] = n
    assert got == expected
    assert sum(expected.values()) == 9  # 2 boundaries (2.1.29) + 7 summaries (1.0.53)


def test_compaction_cuts_the_recorded_view_not_the_logical_history(shared: Path) -> None:
    label = "claude-code/promptgrimoire/ffc93f57-cbec-4226-ba46-303172c33946.jsonl"
    trace = _read(str(shared), label)
    s = trace.sessions[0]
    ev = s.events[0]
    assert (ev.trigger, ev.pre_tokens) == ("auto", 167325)
    before = s.view_mask(ev.request - 1, as_recorded=True)
    after = s.view_mask(ev.request, as_recorded=True)
    logical = s.view_mask(ev.request, as_recorded=False)
    assert s.blocks["kind"][ev.summary_block] == Kind.SUMMARY
    assert after[ev.summary_block] and not logical[ev.summary_block]
    assert (before & ~after).sum() > 100  # the recording dropped the old history...
    assert (before & logical).sum() >= (before & ~after).sum()  # ...the logical view keeps it
    ctx = s.recorded_context()
    assert ctx[ev.request] < ctx[ev.request - 1] / 2


def test_tool_pairs_are_linked(shared: Path) -> None:
    for unit in _units(str(shared)):
        trace = _read(str(shared), unit.label)
        for s in trace.sessions:
            b = s.blocks
            results = np.nonzero(b["kind"] == Kind.TOOL_RESULT)[0]
            linked = results[b["link"][results] >= 0]
            assert (b["kind"][b["link"][linked]] == Kind.TOOL_USE).all()
            assert (b["link"][b["link"][linked]] == linked).all()
            assert len(linked) >= len(results) - trace.skipped.get("orphan-tool-result", 0)


def test_reads_and_writes_carry_hashed_paths(shared: Path) -> None:
    label = "claude-code/promptgrimoire/ffc93f57-cbec-4226-ba46-303172c33946.jsonl"
    s = _read(str(shared), label).sessions[0]
    reads = (s.blocks["flags"] & Flag.PATH_READ) != 0
    assert reads.sum() > 10
    assert (s.blocks["path_hash"][reads] != 0).all()


def test_subagent_files_become_linked_sessions(shared: Path) -> None:
    units = _units(str(shared))
    with_agents = [u for u in units if "subagent" in u.roles]
    assert with_agents, "m-claude has agent-*.jsonl files beside their sessions"
    for unit in with_agents:
        trace = _read(str(shared), unit.label)
        subs = [s for s in trace.sessions if s.kind == "subagent"]
        assert subs and all(s.parent == 0 for s in subs)


def test_inline_sidechains_become_sessions(shared: Path) -> None:
    """1.0.x writes subagent lines inline with isSidechain: true."""
    found = 0
    for unit in _units(str(shared)):
        if "vsla" not in unit.label:
            continue
        raw = [obj for _, obj in _raw_lines(unit.files[0].path) if obj]
        side_requests = {
            o["message"]["id"]
            for o in raw
            if o.get("type") == "assistant"
            and o.get("isSidechain")
            and o["message"].get("model") != "<synthetic>"
        }
        trace = _read(str(shared), unit.label)
        got = sum(s.n_requests for s in trace.sessions if s.kind == "subagent")
        assert got == len(side_requests), unit.label
        found += got
    assert found > 0


def test_traces_stats_command_totals_match_raw_json(shared: Path) -> None:
    """`ctxsim traces stats --json`: per trace, input / cache read / cache write as counted
    independently from the raw JSON."""
    from click.testing import CliRunner

    from simulator.cli import main

    result = CliRunner().invoke(
        main, ["traces", "stats", str(shared / "claude-code"), "--json", "--lenient"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    got: dict[str, dict[str, int]] = {}
    for row in rows:
        name = Path(row["trace"]).name
        t = got.setdefault(name, {"input": 0, "cache_read": 0, "cache_write": 0})
        t["input"] += row["input"]
        t["cache_read"] += row["cache_read"]
        t["cache_write"] += row["cache_write_5m"] + row["cache_write_1h"]
    for unit in _units(str(shared)):
        expected = {"input": 0, "cache_read": 0, "cache_write": 0}
        for f in unit.files:
            counted = _independent_usage(f.path)
            for key in expected:
                expected[key] += counted[key]
        assert got[unit.files[0].path.name] == expected, unit.label


def test_every_event_points_at_its_summary_block(shared: Path) -> None:
    """Blocks inserted by the anchoring (unlogged growth) must not shift event indices."""
    checked = 0
    for unit in _units(str(shared)):
        for s in _read(str(shared), unit.label).sessions:
            for ev in s.events:
                if ev.summary_block >= 0:
                    assert s.blocks["kind"][ev.summary_block] == Kind.SUMMARY
                    assert s.blocks["first_request"][ev.summary_block] == ev.request
                    checked += 1
    assert checked == 9


def test_compaction_growth_is_split_into_summary_and_restored(shared: Path) -> None:
    """At a recorded compaction the summary is sized from its text; the rest of the
    recorded growth is what the client restored (an INJECTED artifact)."""
    label = "claude-code/promptgrimoire/ffc93f57-cbec-4226-ba46-303172c33946.jsonl"
    s = _read(str(shared), label).sessions[0]
    b = s.blocks
    for ev in s.events:
        restored = (
            (b["first_request"] == ev.request)
            & (b["kind"] == Kind.INJECTED)
            & ((b["flags"] & Flag.ARTIFACT) != 0)
        )
        summary = int(b["tokens"][ev.summary_block])
        assert restored.sum() == 1
        assert summary < 0.5 * int(b["tokens"][restored].sum()) + summary
        assert 0.9 < summary / int(b["tokens_raw"][ev.summary_block]) < 1.6
