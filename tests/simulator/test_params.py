"""Typed policy parameters (simulator/params.py): every default declared and unchanged by
parsing, and every malformed value refused in one line (exit 2) from -P, a TOML variant, a
sweep grid and a tune range."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from simulator import policy as registry
from simulator.app.cli import main
from simulator.params import ParamError, choice, flag, fraction, limits, minutes, tokens
from simulator.policy import PolicyError
from tests.support import FIXTURES, SAMPLES

GOLDEN = FIXTURES / "params_hashes.json"
POLICY = "claude-code@2.1.88"

# -- declarations ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", registry.names())
def test_every_default_key_has_a_declaration_and_every_declaration_a_key(name: str) -> None:
    cls = registry.get(name)
    missing = sorted(set(cls.defaults) - set(cls.declared))
    assert not missing, f"{name}: no declaration for {missing} (add it beside the defaults)"
    stale = sorted(set(cls.declared) - set(cls.defaults))
    assert not stale, f"{name}: declarations without a default: {stale}"
    for key, declared in cls.declared.items():
        assert declared.meaning and declared.source and declared.type, (name, key)


@pytest.mark.parametrize("name", registry.names())
def test_every_default_parses_to_the_same_python_value(name: str) -> None:
    """So a spec's params_hash is the same as before parameters were typed."""
    cls = registry.get(name)
    for key, value in cls.defaults.items():
        parsed = cls.declared[key].parse(value)
        assert type(parsed) is type(value), (name, key)
        assert orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            value, option=orjson.OPT_SORT_KEYS
        ), (name, key)
        assert cls.declared[key].parse(parsed) == parsed  # idempotent: from_spec rebuilds


def _hashes() -> dict[str, str]:
    return {name: registry.build(name).spec().param_hash for name in registry.names()}


def test_default_params_hashes_are_pinned() -> None:
    """The golden file holds every registered policy's default params_hash (taken before
    parameters were typed). A change that is meant to change a policy's defaults regenerates
    it: `CTXSIM_UPDATE_GOLDEN=1 pytest tests/simulator/test_params.py -k pinned`."""
    hashes = _hashes()
    if os.environ.get("CTXSIM_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(GOLDEN.read_text())
    changed = {n: (pinned.get(n), h) for n, h in hashes.items() if pinned.get(n) != h}
    assert not changed, f"default params_hash changed (pinned, now): {changed}"


def test_a_typed_value_gives_the_hash_of_the_plain_one() -> None:
    plain = registry.build(POLICY, {"autocompact.buffer_tokens": 8000}).spec()
    for spelled in ("8k", "8000", "8_000", 8000.0):
        assert registry.build(POLICY, {"autocompact.buffer_tokens": spelled}).spec() == plain
    assert registry.build(POLICY, {"snip.enabled": "false"}).params["snip.enabled"] is False


# -- spellings ------------------------------------------------------------------------------

SIZE = tokens("m", "s")


@given(st.integers(min_value=0, max_value=10**9))
def test_sizes_are_read_as_typed(n: int) -> None:
    assert SIZE.parse(n) == SIZE.parse(str(n)) == SIZE.parse(f"{n:_}") == n
    assert SIZE.parse(float(n)) == n and type(SIZE.parse(float(n))) is int
    if n % 1000 == 0:
        assert SIZE.parse(f"{n // 1000}k") == n


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=9))
def test_a_fractional_size_is_refused_never_truncated(n: int, tenths: int) -> None:
    with pytest.raises(ParamError):
        SIZE.parse(n + tenths / 10)


def test_spellings_of_each_kind() -> None:
    assert SIZE.parse("1.5k") == 1500 and SIZE.parse("1M") == 1_000_000
    for bad in ("abc", "-5", -5, True, "8000.5", "8kb", None, [8000]):
        with pytest.raises(ParamError):
            SIZE.parse(bad)
    gap = minutes("m", "s")
    assert (gap.parse("1h"), gap.parse("90m"), gap.parse("60"), gap.parse(60)) == (60, 90, 60, 60)
    assert gap.parse("30s") == 0.5
    switch = flag("m", "s")
    assert switch.parse("true") is True and switch.parse(False) is False
    for bad in ("no", "yes", "off", 0, 1, "0"):
        with pytest.raises(ParamError, match="expected true or false"):
            switch.parse(bad)
    share = fraction("m", "s", open_low=True, optional=True)
    assert share.parse(1) == 1.0 and type(share.parse(1)) is float
    assert share.parse("none") is None and share.parse("0.25") == 0.25
    for bad in (0, 1.5, -0.1, True, "half"):
        with pytest.raises(ParamError, match=r"in \(0, 1\]"):
            share.parse(bad)
    ttl = choice(("5m", "1h", "recorded"), "m", "s")
    with pytest.raises(ParamError, match="one of 5m, 1h, recorded"):
        ttl.parse("2h")
    table = limits("m", "s")
    assert table.parse({"Bash": "30k", "Read": None}) == {"Bash": 30_000, "Read": None}
    for bad in (5, {"Bash": -1}, {"Bash": 1.5}, ["Bash"]):
        with pytest.raises(ParamError, match="a table of tool name"):
            table.parse(bad)


# -- malformed values through every way in ----------------------------------------------------

#: (kind, key, -P / grid text, TOML literal, tune --param values, what the line must say)
CASES = [
    ("no", "snip.enabled", "no", '"no"', "no,true", 'snip.enabled="no"', "true or false"),
    ("abc", "autocompact.buffer_tokens", "abc", '"abc"', "abc,8000", '="abc"', "whole number"),
    ("2h", "cache.ttl", "2h", '"2h"', "5m,2h", 'cache.ttl="2h"', "one of 5m, 1h, recorded"),
    ("tool_limits=5", "budget.tool_limits", "5", "5", "5,6", "budget.tool_limits=5", "a table"),
    ("-5", "autocompact.buffer_tokens", "-5", "-5", "-5:10", "=-5", ">= 0"),
    ("8000.5", "autocompact.buffer_tokens", "8000.5", "8000.5", "8000.5:9000", "=8000.5", "whole"),
    (
        "fraction 1.5",
        "autocompact.threshold_fraction",
        "1.5",
        "1.5",
        "0.5:1.5",
        "autocompact.threshold_fraction=1.5",
        "in (0, 1]",
    ),
    (
        "unknown key",
        "autocompact.bufer_tokens",
        "8000",
        "8000",
        "1:5",
        "no parameter 'autocompact.bufer_tokens'",
        "did you mean 'autocompact.buffer_tokens'",
    ),
]
BAD = CASES


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _one_error_line(code: int, out: str, *fragments: str) -> None:
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert "Traceback" not in out
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_value_on_the_command_line_is_one_line(case: tuple, tmp_path: Path) -> None:
    _, key, text, _, _, names_it, accepted = case
    code, out = _run(
        "run", str(SAMPLES), "--policy", POLICY, "-P", f"{key}={text}", "--out", str(tmp_path)
    )
    _one_error_line(code, out, names_it, accepted)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_value_in_a_variant_file_is_one_line_naming_the_file(
    case: tuple, tmp_path: Path
) -> None:
    _, key, _, literal, _, names_it, accepted = case
    variant = tmp_path / "bad.toml"
    variant.write_text(f'extends = "{POLICY}"\n[params]\n"{key}" = {literal}\n')
    out_dir = tmp_path / "out"
    code, out = _run("run", str(SAMPLES), "--policy", str(variant), "--out", str(out_dir))
    _one_error_line(code, out, "bad.toml", names_it, accepted)
    code, out = _run("policies", "show", str(variant))
    _one_error_line(code, out, names_it)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_value_in_a_sweep_grid_is_one_line(case: tuple, tmp_path: Path) -> None:
    _, key, text, _, _, names_it, accepted = case
    out_dir = tmp_path / "sweep"
    code, out = _run(
        "sweep", str(SAMPLES), "--policy", POLICY, "-G", f"{key}={text}", "--out", str(out_dir)
    )
    _one_error_line(code, out, names_it, accepted)


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="optuna not installed")
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_value_in_a_tune_range_is_one_line(case: tuple, tmp_path: Path) -> None:
    _, key, _, _, values, names_it, accepted = case
    out_dir = tmp_path / "tune"
    code, out = _run(
        "tune",
        str(SAMPLES),
        "--policy",
        POLICY,
        "--param",
        f"{key}={values}",
        "--trials",
        "1",
        "--out",
        str(out_dir),
    )
    _one_error_line(code, out, names_it, accepted)


def test_a_float_tune_range_over_a_whole_number_parameter_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    code, out = _run(
        "tune",
        str(SAMPLES),
        "--policy",
        POLICY,
        "--param",
        "autocompact.buffer_tokens=8000.0:9000.0",
        "--trials",
        "1",
        "--out",
        str(tmp_path / "tune"),
    )
    _one_error_line(code, out, "autocompact.buffer_tokens", "whole numbers")


def test_the_words_people_type_reach_the_spec(tmp_path: Path) -> None:
    """`8k`, `13_000`, `1h` and `false` from -P, the same from a sweep range."""
    code, out = _run(
        "run",
        str(SAMPLES),
        "--policy",
        POLICY,
        "-P",
        "autocompact.buffer_tokens=8k",
        "-P",
        "budget.max_result_chars=13_000",
        "-P",
        "microcompact.time_based.gap_minutes=1h",
        "-P",
        "snip.enabled=false",
        "--out",
        str(tmp_path / "run"),
        "--no-report",
    )
    assert code == 0, out
    (spec,) = json.loads((tmp_path / "run" / "manifest.json").read_text())["policies"]
    params = spec["params"]
    assert params["autocompact.buffer_tokens"] == 8000
    assert params["budget.max_result_chars"] == 13_000
    assert params["microcompact.time_based.gap_minutes"] == 60
    assert params["snip.enabled"] is False
    from simulator.app.sweep import SweepConfig, build_cells, parse_grid

    cells = build_cells(
        SweepConfig(policies=(POLICY,), grid=(parse_grid("autocompact.buffer_tokens=8k:10k:1k"),))
    )
    assert [c.values for c in cells] == [
        (("autocompact.buffer_tokens", n),) for n in (8000, 9000, 10_000)
    ]


def test_an_unknown_key_without_a_close_match_points_at_policies_show() -> None:
    with pytest.raises(PolicyError, match=r"no parameter 'zzz' \(its parameters: ctxsim policies"):
        registry.build("none", {"zzz": 1})


def test_a_sweep_records_the_parsed_shipped_value_of_a_variant(tmp_path: Path) -> None:
    from simulator.app.sweep import SweepConfig, build_cells, parse_grid

    variant = tmp_path / "eight.toml"
    variant.write_text(f'extends = "{POLICY}"\n[params]\n"autocompact.buffer_tokens" = "8k"\n')
    config = SweepConfig(
        policies=(str(variant),), grid=(parse_grid("autocompact.buffer_tokens=5000,9000"),)
    )
    cells = build_cells(config)
    assert [c.defaults for c in cells] == [(("autocompact.buffer_tokens", 8000),)] * 2
    assert (
        cells[0].spec.params
        == registry.build(POLICY, {"autocompact.buffer_tokens": 5000}).spec().params
    )
