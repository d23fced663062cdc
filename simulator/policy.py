"""What a context policy is to the replay engine, and the registry that finds them by name.

A `Policy` is a named, versioned set of parameters; for each replayed session it makes a
fresh `SessionPolicy` (all per-session state: breaker counters, persisted results, ...).
Before each recorded request k the engine calls `SessionPolicy.step(k, out)`; the policy
brings its view up to date and emits the calls it makes (`out.call(...)`): compaction
requests first, then the request itself. The engine prices each call against the
session's prompt cache as it is emitted.

Policies register by name with `@register`; packages (the built-in ones too) expose their
modules through the entry-point group `ctxsim.policies`, which the registry loads on
first use, so the core can build any policy by name without importing it.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar

import orjson

from simulator.history import History
from simulator.model import Session
from simulator.models import ModelFacts
from simulator.params import Declarations, ParamError, parse_all
from simulator.view import Breakpoint, View

ENTRY_POINT_GROUP = "ctxsim.policies"


class PolicyError(ValueError):
    """An unknown policy or parameter, or a parameter of the wrong type."""


@dataclass(frozen=True)
class PolicySpec:
    """Everything needed to rebuild a policy: name, version and every parameter."""

    name: str
    version: str
    params: tuple[tuple[str, Any], ...]
    #: The name a variant file gave this configuration ("" for the policy itself).
    variant: str = ""

    @property
    def label(self) -> str:
        """What rows call it: the variant's name, else the policy's."""
        return self.variant or self.name

    def as_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "version": self.version, "params": dict(self.params)}
        if self.variant:
            out["variant"] = self.variant
        return out

    @property
    def param_hash(self) -> str:
        """Short stable hash of the spec: rows carry it so any row can be reproduced."""
        data = orjson.dumps(self.as_dict(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(data).hexdigest()[:12]


@dataclass
class Call:
    """One API call a policy makes: the view it sends and how the cache is marked."""

    kind: str  # "request" (the recorded request) or "compaction" (a policy's own call)
    stage: str  # which part of the policy made it ("" for the request itself)
    breakpoints: list[Breakpoint]
    output_tokens: int
    #: Flags for the row: e.g. {"overflow": True, "breaker_trip": True}.
    flags: dict[str, bool] = field(default_factory=dict)
    #: Whether the provider's prompt cache is used for this call at all.
    cached: bool = True


@dataclass(frozen=True)
class Edit:
    """A change a policy made to what it sends without an LLM call of its own (clearing,
    masking, truncation, eviction, snip, a collapse commit): on the record, so a policy that
    rewrites its context again and again shows it even with no compaction call."""

    stage: str  # which part of the policy made it
    #: "clear" (cache_edits: still sent, not counted), "mask", "remove", "replace" or
    #: "persist" (a result sent as a preview from the start)
    kind: str
    tokens_removed: int  # what the view holds less (never negative: a rewrite that grows is 0)
    breaks_prefix: bool  # it changed an item the last request already sent


class Emitter(ABC):
    """Receives a policy's calls for the current request (implemented by the engine)."""

    def edit(self, edit: Edit) -> None:  # noqa: B027 (a hook: engines that count edits)
        """Record an edit made before the next call (the engine puts it on that call)."""

    @abstractmethod
    def call(self, view: View, call: Call) -> None: ...

    @abstractmethod
    def warm(self, view: View, position: int, ttl_ms: int) -> None:
        """Mark the prefix through `position` as already cached (by other sessions)."""

    def written(self, view: View, position: int, at_ms: int, ttl_ms: int) -> None:  # noqa: B027
        """Record that a request of the client's own that the trace does not log, sent at
        `at_ms`, wrote the prefix through `position` with `ttl_ms` (Claude Code's prompt
        suggestion after an end of turn: policies/as_recorded.py); it is not priced."""


@dataclass
class SessionContext:
    """What a policy may know about the session it replays."""

    session: Session
    history: History
    facts: ModelFacts
    rng: random.Random
    #: Per request: timestamp (ms), model id, recorded TTL (ms) of its cache writes.
    ts: list[int]
    models: list[str]
    recorded_ttl: list[int]
    #: Per request: output tokens of the recorded response.
    output: list[int]
    #: Hash identifying the system + tools prefix (per model: caches are per model).
    root: int
    #: Per request: when its response was complete (ms); defaults to `ts`.
    ts_end: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ts_end:
            self.ts_end = list(self.ts)


@dataclass(frozen=True)
class Limits:
    """The limits a policy works to in one session, in tokens, as it states them: where it
    compacts (None: it does not compact on size) and where it stops sending (None: the
    model's window). Rows carry them and charts draw them, so a line on a chart is the rule
    the policy applied (its version's window, the user's settings), not a formula
    re-derived from its parameters."""

    threshold: int | None = None
    blocking: int | None = None


class SessionPolicy(ABC):
    @abstractmethod
    def step(self, k: int, out: Emitter) -> None:
        """Emit the calls made for recorded request k (and update the policy's view)."""

    def limits(self) -> Limits | None:
        """The limits in force before the next step; None where the policy states none."""
        return None


class Policy(ABC):
    """A named, versioned, parametrised context policy."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    #: Parameter names and defaults (dotted names for nested stages, e.g. "autocompact.buffer").
    defaults: ClassVar[dict[str, Any]] = {}
    #: Each parameter's type, unit, range, meaning and source (simulator/params.py); every
    #: key of `defaults` has one (tests/simulator/test_params.py checks every registered policy).
    declared: ClassVar[Declarations] = {}

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            hint = _did_you_mean(unknown[0], list(self.defaults))
            if not hint:
                hint = f" (its parameters: ctxsim policies show {self.name})"
            raise PolicyError(f"policy {self.name!r} has no parameter {unknown[0]!r}{hint}")
        try:
            typed = parse_all(self.declared, params)
        except ParamError as exc:
            raise PolicyError(f"policy {self.name!r}: {exc}") from None
        self.params = {**self.defaults, **typed}
        self.variant = ""

    def spec(self) -> PolicySpec:
        return PolicySpec(self.name, self.version, tuple(sorted(self.params.items())), self.variant)

    @abstractmethod
    def session(self, ctx: SessionContext) -> SessionPolicy:
        """A fresh per-session state for one replay."""


P = TypeVar("P", bound=type[Policy])
_REGISTRY: dict[str, type[Policy]] = {}
_loaded = False


def register(cls: P) -> P:
    """Class decorator: make a policy available by its name."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise PolicyError(f"two policies are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def is_registered(cls: type[Policy]) -> bool:
    """Whether `cls` itself (not a subclass or a base sharing its name) is registered."""
    _load_entry_points()
    return _REGISTRY.get(getattr(cls, "name", "")) is cls


def names() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str) -> type[Policy]:
    """The policy class registered under `name`; unknown names fail with a hint."""
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}{_did_you_mean(name, names())}") from None


def build(name: str, params: dict[str, Any] | None = None) -> Policy:
    return get(name)(**(params or {}))


def from_spec(spec: PolicySpec) -> Policy:
    built = build(spec.name, dict(spec.params))
    built.variant = spec.variant
    return built


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Factory = Callable[..., Policy]
