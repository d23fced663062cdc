"""Typed policy parameters: each policy declares its parameters once, and every value given
from the command line (-P), a TOML variant, a sweep grid or a tune range is parsed and
checked against that declaration when the policy is built.

A declaration (`Param`) gives the parameter's type, unit, allowed range, a one-line meaning
and the source of its default (the fact it models, with its citation, or "ours"). Values
stay in the policy's `defaults` dict (presets override them there); a declaration only says
what a value may be, so a preset never repeats the type and a declaration never repeats a
preset's value.

Why pydantic v2: it is already installed (genai-prices depends on it), its `TypeAdapter`
validates one value against an `Annotated` type with range constraints and gives errors
we can turn into one line, and strict mode stops the coercions that made `-P
snip.enabled=no` mean True (`bool("no")`) and `8000.5` mean 8000 (`int(8000.5)`).

Spellings accepted (unambiguous ones only):

* sizes (tokens, characters): 8000, "8000", "13_000", "8k", "1.5k", "1M"; a float only when
  it is whole (8000.0 is 8000; 8000.5 is refused, never truncated);
* minutes: 60, "60", "90m", "1h", "30s" (a whole number of minutes stays an int);
* booleans: true / false only (JSON, TOML, or the words "true" / "false");
* fractions: a number in the declared range (JSON / TOML number or its text);
* optional values: JSON `null` or the word "none" (TOML has no null).

A parsed default is the same Python value as the default itself (tests/simulator/test_params.py
checks every registered policy), so a spec's params_hash does not change.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError


class ParamError(ValueError):
    """A value a declared parameter does not accept; the message says what it accepts."""


_SIZE = re.compile(r"([-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+))\s*([kKmM]?)")
_SIZE_SCALE = {"": 1, "k": 1_000, "m": 1_000_000}
_MINUTES = re.compile(r"([-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+))\s*([smh]?)")
_MINUTE_SCALE = {"s": decimal.Decimal(1) / 60, "m": decimal.Decimal(1), "h": decimal.Decimal(60)}


def _whole_decimal(number: decimal.Decimal, value: Any) -> int:
    if number != number.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)


def _size(value: Any) -> Any:
    """8000, 8000.0, "8000", "13_000", "8k", "1.5k", "1M" -> an int; anything else is left
    for the strict int check to refuse (a bool, 8000.5, "abc")."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            return value
        number = decimal.Decimal(match.group(1).replace("_", ""))
        return _whole_decimal(number * _SIZE_SCALE[match.group(2).lower()], value)
    return value


def _minutes(value: Any) -> Any:
    """60, "60", "90m", "1h", "30s" -> minutes (an int when whole)."""
    if isinstance(value, str):
        match = _MINUTES.fullmatch(value.strip())
        if match is None:
            return value
        number = decimal.Decimal(match.group(1).replace("_", ""))
        minutes = number * _MINUTE_SCALE[match.group(2) or "m"]
        return int(minutes) if minutes == minutes.to_integral_value() else float(minutes)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _number_text(value: Any) -> Any:
    """ "0.5" -> 0.5 (a TOML string or a sweep value given as text)."""
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return value
    return value


def _boolean(value: Any) -> Any:
    """true / false, or the words "true" / "false"; "no", "yes", 0 and 1 are refused."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _none(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("none", "null"):
        return None
    return value


def _show(value: Any) -> str:
    """A value as the user would type it (JSON), for error lines."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


@dataclass(frozen=True)
class Param:
    """One declared parameter: what its values are, in what unit and range, what it means
    and where its default comes from."""

    type: str  # shown in `policies show`: int, float, bool, str, list[str], ...
    unit: str  # tokens, chars, minutes, fraction, count, ... ("" when none)
    meaning: str
    source: str  # the fact the default models and its citation, or "ours"
    accepts: str  # what the error line says is accepted
    #: Whether values are whole numbers (a tune range over it must be integral).
    whole: bool = False
    optional: bool = False
    #: The pydantic validator of the values (required; a keyword for readability).
    adapter: TypeAdapter[Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.adapter is None:
            raise TypeError(f"parameter declaration without a validator: {self.meaning!r}")

    def parse(self, value: Any) -> Any:
        """The typed value, or ParamError saying what is accepted."""
        assert self.adapter is not None  # __post_init__
        try:
            return self.adapter.validate_python(value)
        except (ValidationError, ValueError, decimal.InvalidOperation):
            raise ParamError(f"{_show(value)} is not accepted: expected {self.accepts}") from None


def _bound(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _range(low: float | None, high: float | None, open_low: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if open_low else '['}{_bound(low)}, {_bound(high)}]"
    if low is not None:
        return f"{'>' if open_low else '>='} {_bound(low)}"
    return f"<= {_bound(high)}" if high is not None else ""


def _strict(base: Any, bounds: dict[str, float]) -> Any:
    """`base` in strict mode with its bounds (a tuple of types: their union)."""
    if isinstance(base, tuple):
        first, *rest = (_strict(b, bounds) for b in base)
        union = first
        for other in rest:
            union = union | other
        return union
    return Annotated[base, Field(strict=True, **bounds)]  # type: ignore[call-overload]


def _param(
    base: Any,
    before: Callable[[Any], Any] | None,
    *,
    type_name: str,
    unit: str,
    meaning: str,
    source: str,
    what: str,
    examples: str = "",
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    optional: bool = False,
    whole: bool = False,
) -> Param:
    bounds: dict[str, float] = {}
    if low is not None:
        bounds["gt" if open_low else "ge"] = low
    if high is not None:
        bounds["le"] = high
    inner: Any = _strict(base, bounds)
    if before is not None:
        inner = Annotated[inner, BeforeValidator(before)]
    accepts = " ".join(part for part in (what, _range(low, high, open_low)) if part)
    if examples:
        accepts += f" (e.g. {examples})"
    if optional:
        inner = Annotated[inner | None, BeforeValidator(_none)]
        accepts += ", or null / none"
        type_name += " | None"
    return Param(
        type_name, unit, meaning, source, accepts, whole, optional, adapter=TypeAdapter(inner)
    )


def _whole(
    meaning: str,
    source: str,
    *,
    unit: str,
    what: str,
    examples: str,
    low: int,
    high: int | None,
    optional: bool,
) -> Param:
    """A whole number of `unit` in any of the size spellings ("8000", "13_000", "8k")."""
    return _param(
        int,
        _size,
        type_name="int",
        unit=unit,
        meaning=meaning,
        source=source,
        what=what,
        examples=examples,
        low=low,
        high=high,
        optional=optional,
        whole=True,
    )


def tokens(
    meaning: str,
    source: str,
    *,
    low: int = 0,
    high: int | None = None,
    optional: bool = False,
    unit: str = "tokens",
) -> Param:
    """A size in tokens: a whole number, typed as 8000, "13_000", "8k" or "1M"."""
    what = f"a whole number of {unit}"
    return _whole(
        meaning,
        source,
        unit=unit,
        what=what,
        examples="8000, 8k, 13_000",
        low=low,
        high=high,
        optional=optional,
    )


def chars(meaning: str, source: str, *, low: int = 0, optional: bool = False) -> Param:
    """A size in characters (the same spellings as tokens)."""
    return tokens(meaning, source, low=low, optional=optional, unit="chars")


def count(
    meaning: str,
    source: str,
    *,
    low: int = 0,
    high: int | None = None,
    unit: str = "count",
    optional: bool = False,
) -> Param:
    """A whole count of things (groups, files, retries, ...)."""
    what = f"a whole number of {unit}" if unit != "count" else "a whole number"
    return _whole(
        meaning,
        source,
        unit=unit,
        what=what,
        examples="",
        low=low,
        high=high,
        optional=optional,
    )


def minutes(meaning: str, source: str, *, low: float = 0) -> Param:
    """A duration in minutes: 60, "90m", "1h", "30s"."""
    return _param(
        (int, float),
        _minutes,
        type_name="float",
        unit="minutes",
        meaning=meaning,
        source=source,
        what="a duration in minutes",
        examples="60, 90m, 1h, 30s",
        low=low,
    )


def fraction(
    meaning: str,
    source: str,
    *,
    low: float = 0.0,
    high: float = 1.0,
    open_low: bool = False,
    optional: bool = False,
    unit: str = "fraction",
) -> Param:
    """A share (of a window, a budget, ...): a number in [low, high]."""
    return _param(
        float,
        _number_text,
        type_name="float",
        unit=unit,
        meaning=meaning,
        source=source,
        what="a number",
        low=low,
        high=high,
        open_low=open_low,
        optional=optional,
    )


def flag(meaning: str, source: str, *, optional: bool = False) -> Param:
    """A switch: true or false, nothing else (optional: null too, e.g. "as recorded")."""
    return _param(
        bool,
        _boolean,
        type_name="bool",
        unit="",
        meaning=meaning,
        source=source,
        what="true or false",
        optional=optional,
    )


def text(meaning: str, source: str, *, unit: str = "", optional: bool = False) -> Param:
    """Free text (a regular expression, a model name): any string."""
    return _param(
        str,
        None,
        type_name="str",
        unit=unit,
        meaning=meaning,
        source=source,
        what="a string",
        optional=optional,
    )


def choice(
    values: tuple[str, ...], meaning: str, source: str, *, unit: str = "", optional: bool = False
) -> Param:
    """One of a few words."""
    allowed = list(values)

    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(value)
        return value

    return _param(
        str,
        check,
        type_name="str (" + " | ".join(values) + ")",
        unit=unit,
        meaning=meaning,
        source=source,
        what="one of " + ", ".join(values),
        optional=optional,
    )


def names(meaning: str, source: str) -> Param:
    """A list of names (tools): a JSON / TOML array of strings."""
    return _param(
        list[str],
        None,
        type_name="list[str]",
        unit="tool names",
        meaning=meaning,
        source=source,
        what="a list of names",
        examples='["Read", "Bash"]',
    )


_LIMIT = Annotated[
    Annotated[int, Field(strict=True, ge=0)] | None,
    BeforeValidator(lambda v: _none(_size(v))),
]


def limits(
    meaning: str,
    source: str,
    *,
    unit: str = "chars",
    of: str = "tool name",
    example: str = '{"Bash": 30000, "Read": null}',
) -> Param:
    """A table of name (a tool, a model pattern) -> size, or null: no limit."""
    return Param(
        "dict[str, int | None]",
        unit,
        meaning,
        source,
        f"a table of {of} to {unit} or null (e.g. {example})",
        adapter=TypeAdapter(Annotated[dict[str, _LIMIT], Field(strict=True)]),
    )


Declarations = Mapping[str, Param]


def parse_all(declared: Declarations, params: Mapping[str, Any]) -> dict[str, Any]:
    """Every value of `params` parsed by its declaration (an undeclared key's value is
    kept as given); the first bad value raises ParamError naming its key."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        decl = declared.get(key)
        if decl is None:
            out[key] = value
            continue
        try:
            out[key] = decl.parse(value)
        except ParamError as exc:
            raise ParamError(f"{key}={exc}") from None
    return out
