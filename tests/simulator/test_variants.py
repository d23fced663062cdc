"""Variants without code (TOML files extending a policy) and the source of every default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator import policy as registry
from simulator.policy import PolicyError
from simulator.variants import build_variant, default_sources, load_variant
from tests.support import ROOT

EXAMPLE = ROOT / "policies" / "variants" / "cc-buffer-8k.toml"


def test_a_variant_extends_a_policy_and_the_command_line_overrides_it() -> None:
    variant = load_variant(EXAMPLE)
    assert (variant.name, variant.extends) == ("cc-buffer-8k", "claude-code@2.1.88")
    built = build_variant(variant)
    assert built.params["autocompact.buffer_tokens"] == 8000
    assert built.params["autocompact.reserve_cap_tokens"] == 20_000  # inherited
    spec = built.spec()
    assert (spec.name, spec.variant, spec.label) == (
        "claude-code@2.1.88",
        "cc-buffer-8k",
        "cc-buffer-8k",
    )
    assert spec.as_dict()["variant"] == "cc-buffer-8k"
    again = build_variant(variant, {"autocompact.buffer_tokens": 5000})
    assert again.params["autocompact.buffer_tokens"] == 5000
    assert registry.from_spec(spec).spec() == spec


def test_bad_variant_files_name_the_file(tmp_path: Path) -> None:
    cases = {
        "no-extends.toml": "[params]\nx = 1\n",
        "bad.toml": "extends = \n",
        "stray.toml": 'extends = "none"\ncolour = "red"\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(PolicyError, match=name):
            load_variant(path)
    unknown = tmp_path / "typo.toml"
    unknown.write_text('extends = "claude-code"\n[params]\n"autocompact.bufer_tokens" = 1\n')
    with pytest.raises(PolicyError, match=re.escape("did you mean 'autocompact.buffer_tokens'")):
        build_variant(load_variant(unknown))


def test_unknown_policy_names_get_a_hint() -> None:
    with pytest.raises(PolicyError, match=re.escape("did you mean 'claude-code'")):
        registry.build("claude-cod")


def test_default_sources_name_the_preset_that_set_them() -> None:
    sources = default_sources("claude-code@2.1.6")
    assert sources["autocompact.reserve_cap_tokens"] == (None, "preset claude-code@2.1.6")
    assert sources["cache.ttl"] == ("5m", "preset claude-code@2.1.6")
    value, source = sources["autocompact.buffer_tokens"]
    declared = registry.get("claude-code").declared["autocompact.buffer_tokens"]
    assert value == 13_000 and source == declared.source  # the fact, not the class
    assert default_sources("claude-code@2.1.88")["autocompact.reserve_cap_tokens"][0] == 20_000
    assert default_sources("swe-agent")["keep_observations"] == (5, "preset swe-agent")
    assert default_sources("masking")["keep_observations"][1].startswith("SWE-agent paper runs")


def test_a_bad_value_in_a_variant_file_names_the_file_key_and_value(tmp_path: Path) -> None:
    path = tmp_path / "bad-value.toml"
    path.write_text('extends = "claude-code"\n[params]\n"snip.enabled" = "false"\n')
    assert build_variant(load_variant(path)).params["snip.enabled"] is False  # the word
    path.write_text('extends = "claude-code"\n[params]\n"snip.enabled" = "no"\n')
    with pytest.raises(
        PolicyError, match=re.escape("bad-value.toml: policy 'claude-code': snip.enabled=\"no\"")
    ):
        build_variant(load_variant(path))
    # A bad command-line value over a good file is not blamed on the file.
    with pytest.raises(PolicyError) as info:
        build_variant(load_variant(EXAMPLE), {"autocompact.buffer_tokens": "abc"})
    assert not str(info.value).startswith("cc-buffer-8k.toml")
