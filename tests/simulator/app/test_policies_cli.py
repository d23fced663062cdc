"""`ctxsim policies list|show` and variant files on the run command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator import policy as registry
from simulator.app.cli import main
from tests.support import ROOT, SAMPLES

VARIANT = ROOT / "policies" / "variants" / "cc-buffer-8k.toml"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_list_names_every_registered_policy() -> None:
    code, out = _run("policies", "list")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()[2:]]  # after the header and rule
    assert listed == registry.names()
    assert len(listed) >= 19


def _table(out: str) -> dict[str, dict[str, str]]:
    """`policies show`'s table by row name and column, cut at the header's column starts
    (printed to a pipe: no width limit, one line per row); the notes under it, whose first
    cell is words, not a parameter's name, end it."""
    header, rule, *rows = out.splitlines()[1:]
    assert set(rule) == {"─"}
    names = header.split()
    starts = [0, *(header.index(f" {n} ") + 1 for n in names[1:-1])]
    starts.append(header.index(" source") + 1)
    table = {}
    for row in rows:
        if " " in row[: starts[1]].strip():
            break
        cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], len(row)], strict=True)]
        table[cells[0]] = dict(zip(names, cells, strict=True))
    return table


def test_show_gives_a_table_of_type_unit_default_meaning_and_source() -> None:
    code, out = _run("policies", "show", "claude-code@2.1.6")
    assert code == 0
    assert out.splitlines()[0] == "claude-code@2.1.6 2.1.6"
    table = _table(out)
    cap = table["autocompact.reserve_cap_tokens"]
    assert (cap["type"], cap["unit"], cap["default"]) == ("int | None", "tokens", "null")
    assert cap["source"] == "preset claude-code@2.1.6"
    assert cap["meaning"].startswith("reserve = min(max output, this cap)")
    buffer = table["autocompact.buffer_tokens"]
    assert (buffer["type"], buffer["default"]) == ("int", "13000")
    assert "DESIGN.md 4" in buffer["source"]  # the fact it models, not a class name
    assert table["snip.enabled"]["type"] == "bool"
    assert table["cache.ttl"]["default"] == '"5m"'
    assert len(table) == len(registry.get("claude-code@2.1.6").defaults)
    code, out = _run("policies", "show", str(VARIANT))
    assert code == 0 and "extends claude-code@2.1.88" in out
    row = _table(out)["autocompact.buffer_tokens"]
    assert (row["default"], row["source"]) == ("8000", "variant cc-buffer-8k.toml")


def test_show_names_a_source_for_every_parameter_of_every_policy() -> None:
    for name in registry.names():
        code, out = _run("policies", "show", name)
        assert code == 0, name
        table = _table(out)
        assert set(table) == set(registry.get(name).defaults), name
        for key, row in table.items():
            assert row["meaning"] and row["source"] and row["type"] != "?", (name, key)
            assert "ClaudeCode" not in row["source"] and "policies." not in row["source"]


@pytest.mark.parametrize(
    ("name", "presets"),
    [
        ("codex", "codex@0.46, codex@0.47, codex@0.118, codex@0.140, codex@latest"),
        ("claude-code", "claude-code@1.0, claude-code@2.1.6, claude-code@2.1.88,"),
    ],
)
def test_show_says_a_matched_policy_takes_each_sessions_preset(name: str, presets: str) -> None:
    code, out = _run("policies", "show", name)
    assert code == 0
    text = " ".join(out.split())
    assert (
        f"each session is replayed under the preset of the version it was recorded with ({presets}"
        in text
    )
    assert "a parameter given (-P) applies over the session's preset" in text
    code, out = _run("policies", "show", "codex@0.140")
    assert "each session is replayed" not in out  # a preset is what it says


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
