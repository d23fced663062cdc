"""`ctxsim policies list|show` and variant files on the run command line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from simulator import policy as registry
from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
VARIANT = ROOT / "policies" / "variants" / "cc-buffer-8k.toml"
SAMPLES = ROOT / "traces" / "samples"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_list_names_every_registered_policy() -> None:
    code, out = _run("policies", "list")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == registry.names()
    assert len(listed) >= 19


def test_show_gives_defaults_and_their_source() -> None:
    code, out = _run("policies", "show", "claude-code@2.1.6")
    assert code == 0
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert lines["autocompact.reserve_cap_tokens"] == ["null", "claude-code@2.1.6"]
    assert lines["autocompact.buffer_tokens"][0] == "13000"
    code, out = _run("policies", "show", str(VARIANT))
    assert code == 0 and "extends claude-code@2.1.88" in out
    assert "variant cc-buffer-8k.toml" in out


def test_show_unknown_policy_exits_2_with_a_hint() -> None:
    code, out = _run("policies", "show", "claude-cod")
    assert code == 2 and "did you mean 'claude-code'" in out


def test_run_takes_a_variant_file_and_command_line_overrides(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, text = _run(
        "run",
        str(SAMPLES),
        "--policy",
        str(VARIANT),
        "-P",
        "autocompact.buffer_tokens=9000",
        "--out",
        str(out),
        "--no-report",
    )
    assert code == 0, text
    manifest = json.loads((out / "manifest.json").read_text())
    (spec,) = manifest["policies"]
    assert spec["name"] == "claude-code@2.1.88" and spec["variant"] == "cc-buffer-8k"
    assert spec["params"]["autocompact.buffer_tokens"] == 9000
