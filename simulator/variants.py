"""Policy variants without code, and where every default comes from.

A variant is a TOML file that extends a registered policy and overrides parameters:

    name = "cc-buffer-8k"          # optional; the file's stem otherwise
    extends = "claude-code@2.1.88"
    description = "Claude Code with an 8k autocompact buffer"

    [params]
    "autocompact.buffer_tokens" = 8000

`-P key=value` on the command line overrides the file. The variant's spec keeps the base
policy's name and version and every parameter, plus the variant's name, so rows stay
reproducible from the manifest alone.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator import policy as registry
from simulator.policy import Policy, PolicyError


@dataclass(frozen=True)
class Variant:
    name: str
    extends: str
    params: dict[str, Any]
    description: str
    source: str  # the file's name (never its path)


def load_variant(path: Path) -> Variant:
    """Read a variant file; errors name the file and what is wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path.name}: cannot read variant file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path.name}: not valid TOML: {exc}") from None
    extends = data.get("extends")
    if not isinstance(extends, str):
        raise PolicyError(f'{path.name}: a variant needs `extends = "<policy name>"`')
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise PolicyError(f"{path.name}: [params] must be a table")
    unknown = sorted(set(data) - {"name", "extends", "params", "description"})
    if unknown:
        raise PolicyError(f"{path.name}: unknown key {unknown[0]!r} in variant file")
    name = data.get("name", path.stem)
    return Variant(str(name), extends, dict(params), str(data.get("description", "")), path.name)


def build_variant(variant: Variant, overrides: dict[str, Any] | None = None) -> Policy:
    """The base policy with the variant's parameters, then the command line's. The file's
    own values are checked first, so a bad one is reported with the file's name."""
    try:
        registry.build(variant.extends, variant.params)
    except PolicyError as exc:
        raise PolicyError(f"{variant.source}: {exc}") from None
    params = {**variant.params, **(overrides or {})}
    built = registry.build(variant.extends, params)
    built.variant = variant.name
    return built


def build_named(name: str, params: dict[str, Any] | None = None) -> Policy:
    """A policy from what a user names: a registered policy, or a variant .toml file, with
    `params` on top (checked by their declarations)."""
    if name.endswith(".toml"):
        return build_variant(load_variant(Path(name)), params)
    return registry.build(name, params)


def default_sources(name: str) -> dict[str, tuple[Any, str]]:
    """Every parameter of a registered policy with its default and where that default
    comes from: the declaration's source (the fact it models, or "ours") when it is the
    value the parameter was first given, else the preset that changed it."""
    cls = registry.get(name)
    out: dict[str, tuple[Any, str]] = {}
    chain = [c for c in cls.__mro__ if issubclass(c, Policy) and "defaults" in c.__dict__]
    for key, value in cls.defaults.items():
        source = chain[0]
        for parent in chain[1:]:
            if key in parent.defaults and parent.defaults[key] == value:
                source = parent
            else:
                break
        first = [c for c in chain if key in c.defaults][-1]
        declared = cls.declared.get(key)
        if source is first and declared is not None:
            label = declared.source
        elif "name" in source.__dict__ and registry.is_registered(source):
            label = f"preset {source.name}"
        else:
            label = f"{source.__module__}.{source.__qualname__}"
        out[key] = (value, label)
    return out
