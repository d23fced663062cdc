"""`ctxsim run`: its three files, their determinism, session aggregates and option parsing.

The hand-computed session is the tiny trace (tests/support/tiny.py; derived in
tests/simulator/app/test_fidelity.py) replayed under `as-recorded`: requests (uncached,
read, write 5m, write 1h, output) = (0, 0, 6000, 0, 200), (0, 6000, 1000, 0, 300),
(0, 7000, 800, 0, 100), one minute apart. Rates (genai-prices 0.2.3,
$/MTok): read 0.30, write 5m 3.75, output 15.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import click
import polars as pl
import pytest
from click.testing import CliRunner, Result

from policies.as_recorded import AsRecorded
from simulator import policy as registry
from simulator.app import cli
from simulator.app.cli import main, parse_param
from tests.support import SAMPLES
from tests.support.tiny import SONNET, T0, tiny_trace
from traces import compiled

START = datetime.fromtimestamp(T0 / 1000, UTC)  # sessions.parquet `start` of the first request
FILES = {"requests.parquet", "sessions.parquet", "edits.parquet", "manifest.json"}
#: What `ctxsim run` draws from those files (tests/reports/test_report_html.py tests them).
REPORT = {"report.html", "charts"}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    compiled.write(tiny_trace(), folder / "tiny.ctxt")
    return folder


def ctxsim(*args: str | Path) -> Result:
    """Run the CLI; `run` without --policy replays as-recorded here (the hand-computed
    numbers are as-recorded's); the default policy has its own test."""
    argv = [str(a) for a in args]
    if argv[:1] == ["run"] and "--policy" not in argv:
        argv += ["--policy", "as-recorded"]
    return CliRunner().invoke(main, argv)


def test_run_defaults_to_the_claude_code_policy(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(tiny), "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["name"] for p in manifest["policies"]] == ["claude-code"]


def test_run_writes_its_tables_and_a_manifest(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ctxsim("run", tiny, "--out", out, "--seed", "7")
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == FILES | REPORT
    manifest = json.loads((out / "manifest.json").read_text())
    spec = registry.build("as-recorded").spec()
    assert manifest["policies"] == [{**spec.as_dict(), "params_hash": spec.param_hash}]
    assert manifest["traces"] == [
        {
            "name": "tiny",
            "format": "claude-code",
            "source_digest": "732d6d61696e" + "0" * 52,  # "s-main" in hex
            "sessions": 1,
            "requests": 3,
            "skipped": {},
        }
    ]
    # damaged lines are skipped by default (issue 15); --strict is recorded as not lenient
    assert (manifest["seed"], manifest["cache"], manifest["lenient"]) == (7, "auto", True)
    assert manifest["rows"] == {"requests": 3, "sessions": 1, "edits": 0}
    assert manifest["prices"].startswith("genai-prices ")
    assert manifest["ctxsim_version"]
    text = (out / "manifest.json").read_text()
    assert str(tmp_path) not in text
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"

    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["policy"].to_list() == ["as-recorded"] * 3
    assert requests["params_hash"].to_list() == [spec.param_hash] * 3
    assert requests["cache_read"].to_list() == [0, 6_000, 7_000]
    assert "as-recorded" in result.output and "62.5%" in result.output


def test_a_second_run_gives_identical_bytes(tmp_path: Path) -> None:
    """Also when the second run reads the traces compiled by `traces import`: a trace's
    name is its compiled name, so source and compiled file give the same rows."""
    first, second, imported = tmp_path / "a", tmp_path / "b", tmp_path / "compiled"
    assert ctxsim("run", SAMPLES, "--out", first).exit_code == 0
    assert ctxsim("traces", "import", SAMPLES, "--out", imported).exit_code == 0
    assert ctxsim("run", imported, "--out", second).exit_code == 0
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_sessions_row_equals_hand_computed_aggregate(tiny: Path, tmp_path: Path) -> None:
    assert ctxsim("run", tiny, "--out", tmp_path / "o").exit_code == 0
    sessions = pl.read_parquet(tmp_path / "o" / "sessions.parquet")
    assert sessions.height == 1
    row = sessions.row(0, named=True)
    cost = {
        "cost_uncached_input": 0.0,
        "cost_cache_read": 13_000 * 0.30e-6,
        "cost_cache_write_5m": 7_800 * 3.75e-6,
        "cost_cache_write_1h": 0.0,
        "cost_output": 600 * 15e-6,
    }
    cost["cost_total"] = sum(cost.values())
    # as-recorded sends what was sent: the recording's dollars are the same
    cost["recorded_cost"] = cost["cost_total"]
    expected: dict[str, Any] = {
        "trace": "tiny",
        "session_index": 0,
        "session": "s-main",
        "policy": "as-recorded",
        "params_hash": registry.build("as-recorded").spec().param_hash,
        "models": SONNET,
        "requests": 3,
        "calls": 3,
        "compactions": 0,
        "overflows": 0,
        "breaker_trips": 0,
        "edits": 0,
        "edit_tokens": 0,
        "input_tokens": 6_000 + 7_000 + 7_800,
        "uncached_input": 0,
        "cache_read": 13_000,
        "cache_write_5m": 7_800,
        "cache_write_1h": 0,
        "output": 600,
        "context_max": 7_800,
        "cache_hit_ratio": 13_000 / 20_800,
        "start": START,
        "duration_s": 120.0,
        "unpriced_calls": 0,
        # loss proxies (no block of the tiny trace is the human's; no compaction)
        "human_verbatim_share": None,
        "summary_share": 0.0,
        "stale_file_refs": 0,
        "post_compaction_requests": 0,
        "resent_tokens": 0,
    }
    assert {k: row[k] for k in expected} == expected
    assert {k: row[k] for k in cost} == pytest.approx(cost)
    assert set(row) == set(expected) | set(cost)


def test_unknown_policy_fails_with_a_hint_and_writes_nothing(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ctxsim("run", tiny, "--policy", "as-recordd", "--out", out)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: unknown policy 'as-recordd' (did you mean 'as-recorded'?)"
    ]
    assert not out.exists()


def test_unknown_parameter_fails_with_a_hint(tiny: Path, tmp_path: Path) -> None:
    result = ctxsim("run", tiny, "-P", "warm_strat=false", "--out", tmp_path / "o")
    assert result.exit_code == 2
    assert "no parameter 'warm_strat' (did you mean 'warm_start'?)" in result.output
    result = ctxsim("run", tiny, "-P", "warm_start", "--out", tmp_path / "o")
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.output


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("buffer=8000", (None, "buffer", 8000)),
        ("ratio=0.5", (None, "ratio", 0.5)),
        ("on=true", (None, "on", True)),
        ("off=null", (None, "off", None)),
        ("mode=fast", (None, "mode", "fast")),
        ('mode="8000"', (None, "mode", "8000")),
        ("keep=[1, 2]", (None, "keep", [1, 2])),
        ("autocompact.buffer=13000", (None, "autocompact.buffer", 13000)),
        ("as-recorded:warm_start=false", ("as-recorded", "warm_start", False)),
        ("empty=", (None, "empty", "")),
        ("eq=a=b", (None, "eq", "a=b")),
    ],
)
def test_parse_param(text: str, parsed: tuple[str | None, str, Any]) -> None:
    assert parse_param(text) == parsed


@pytest.mark.parametrize("text", ["novalue", "=1", ":k=1", "p:=1"])
def test_parse_param_rejects(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_param(text)


class _Copy(AsRecorded):
    """A second policy for the tests, with a parameter as-recorded lacks."""

    name = "as-recorded-copy"
    defaults: ClassVar[dict[str, object]] = {**AsRecorded.defaults, "knob": 1}


def test_params_go_to_the_policies_that_have_them(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry._REGISTRY, _Copy.name, _Copy)
    out = tmp_path / "o"
    args = ["run", tiny, "--policy", "as-recorded", "--policy", _Copy.name, "--out", out]
    result = ctxsim(*args, "-P", "knob=5", "-P", "warm_start=false")
    assert result.exit_code == 0, result.output
    policies = json.loads((out / "manifest.json").read_text())["policies"]
    assert [p["name"] for p in policies] == ["as-recorded", _Copy.name]
    assert policies[0]["params"]["warm_start"] is False and "knob" not in policies[0]["params"]
    assert policies[1]["params"]["warm_start"] is False and policies[1]["params"]["knob"] == 5

    result = ctxsim(*args, "-P", f"{_Copy.name}:warm_start=false")
    assert result.exit_code == 0, result.output
    policies = json.loads((out / "manifest.json").read_text())["policies"]
    assert policies[0]["params"]["warm_start"] is True
    assert policies[1]["params"]["warm_start"] is False
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == 6
    assert requests["policy"].to_list()[:2] == ["as-recorded", _Copy.name]  # sorted by request

    result = ctxsim(*args, "-P", "nob=5")
    assert result.exit_code == 2
    assert (
        result.output
        == f"error: policy '{_Copy.name}' has no parameter 'nob' (did you mean 'knob'?)\n"
    )
    result = ctxsim(*args, "-P", "other:knob=5")
    assert result.exit_code == 2 and "'other' is not selected" in result.output


def test_cache_option_and_empty_input(tiny: Path, tmp_path: Path) -> None:
    result = ctxsim("run", tiny, "--cache", "openai", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["cache"] == "openai"
    requests = pl.read_parquet(tmp_path / "o" / "requests.parquet")
    assert requests["cache_write_5m"].sum() == 0  # automatic caching has no writes

    empty = tmp_path / "empty"
    empty.mkdir()
    result = ctxsim("run", empty, "--out", tmp_path / "o2")
    assert result.exit_code == 2 and "no trace found" in result.output


def _strings(obj: Any, out: set[str]) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.add(str(key))
            _strings(value, out)
    elif isinstance(obj, list):
        for value in obj:
            _strings(value, out)
    elif isinstance(obj, str):
        out.add(obj)


def test_outputs_hold_no_message_text(tmp_path: Path) -> None:
    """Every string written is an id, a name, a hash or a version: never content."""
    out = tmp_path / "o"
    assert ctxsim("run", SAMPLES, "--out", out).exit_code == 0
    assert ctxsim("fidelity", SAMPLES, "--out", out).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    traces = {t["name"] for t in manifest["traces"]}
    allowed = traces | {"as-recorded", "request", "compaction", ""}
    requests = pl.read_parquet(out / "requests.parquet")
    allowed |= set(requests["session"].unique()) | set(requests["model"].unique())
    allowed |= set(requests["params_hash"].unique())
    # the edits table names stages and kinds of edits, from the policies' own vocabulary
    allowed |= {"microcompact", "snip", "collapse", "budget", "mask", "clear_tool_uses"}
    allowed |= {"truncate", "prune", "window", "clear", "remove", "replace", "persist"}
    for name in ("requests", "sessions", "edits", "fidelity", "fidelity_sessions"):
        frame = pl.read_parquet(out / f"{name}.parquet")
        for column in frame.select(pl.col(pl.String)).columns:
            values = set(frame[column].drop_nulls().unique())
            if column == "models":
                values = {m for v in values for m in v.split(",")}
            assert values <= allowed, (name, column, values - allowed)
    strings: set[str] = set()
    _strings(manifest, strings)
    digests = {t["source_digest"] for t in manifest["traces"]} | set(manifest["files"].values())
    vocabulary = {"claude-code", "codex", "swe-agent", "auto", manifest["ctxsim_version"]}
    vocabulary |= {manifest["prices"], *(p["version"] for p in manifest["policies"])}
    vocabulary |= {manifest["prices_date"]}  # an ISO date
    vocabulary |= {manifest[k] for k in ("cache_rules", "model_facts", "replay_code")}  # digests
    leftover = strings - allowed - digests - vocabulary
    assert all(s.isidentifier() or s.endswith(".parquet") for s in leftover), leftover


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wherever a command is when Ctrl-C lands (here: loading its traces), the exit is
    130 with one line, not click's "Aborted!" and 1, and nothing is written."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_loaded", interrupted)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(tiny), "--out", str(out), "--no-report"])
    assert result.exit_code == 130
    assert result.output.strip() == "interrupted"
    assert not out.exists()
