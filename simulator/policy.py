"""What a context policy is to the replay engine, and the registry that finds them by name.

A `Policy` is a named, versioned set of parameters; for each replayed session it makes a
fresh `SessionPolicy` (all per-session state: breaker counters, persisted results, ...).
Before each recorded request k the engine calls `SessionPolicy.step(k, out)`; the policy
brings its view up to date and emits the calls it makes (`out.call(...)`): compaction
requests first, then the request itself. The engine prices each call against the
session's prompt cache as it is emitted.

Policies register by name with `@register`; packages (the built-in ones too) expose their
modules through the entry-point group `ctxsim.policies` (a module, or a package: every
module in it), so the core can build any policy by name without importing it.

The registry knows every name without importing a policy module: it reads each module's
source for the literal `name` of every class decorated with `@register` (a module where it
finds fewer names than registrations is imported to be listed). Building a policy imports
the one module that registers it; listing them all (`ctxsim policies list`) imports them
all. Issue 16: every command imported every policy module (0.05-0.06 s of CPU beyond the
Claude Code modules, 0.13 s with the engine modules they share), a sweep's main process
included, though a sweep names one or two (tests/simulator/app/test_startup.py).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import pkgutil
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import orjson

from simulator.history import History
from simulator.model import Session
from simulator.params import Declarations, ParamError, parse_all
from simulator.view import Breakpoint, View

if TYPE_CHECKING:
    from simulator.models import ModelFacts

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
    #: When it was sent and its response ended, where the recording timed the call itself
    #: (a logged compaction call, policies/as_recorded.py); None: the current request's.
    at_ms: tuple[int, int] | None = None


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

    def written(  # noqa: B027
        self, view: View, position: int, at_ms: int, ttl_ms: int, done_ms: int | None = None
    ) -> None:
        """Record that a request this session does not log, sent at `at_ms` (its response
        ended at `done_ms`, where known), wrote the prefix through `position` with `ttl_ms`:
        Claude Code's prompt suggestion after an end of turn (policies/as_recorded.py), a
        fork's parent's last call (`Session.fork`); it is not priced. The cache model
        decides from which of the two times the entry lives."""


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
#: Policy name -> the modules whose sources register it (read, not imported: `_read`);
#: more than one is the clash `register` refuses, raised when the name is first used.
_INDEX: dict[str, list[str]] | None = None
#: Modules whose source does not show every name they register: imported to be listed.
_UNREAD: list[str] = []
_all_loaded = False

#: A class decorated with `@register` and its body (the indented lines after it).
_REGISTERED = re.compile(
    r"^@register[ \t]*\n(?:@.*\n)*class [^\n]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", re.M
)
#: Every registration: a decorator, or a call (a module registering in a loop is imported).
_DECORATION = re.compile(r"^[ \t]*@register\b", re.M)
#: The class body's literal `name = "..."`.
_NAME = re.compile(r'^    name(?:[ \t]*:[^=\n]*)?[ \t]*=[ \t]*"([^"\\\n]+)"[ \t]*(?:#.*)?$', re.M)


def register(cls: P) -> P:
    """Class decorator: make a policy available by its name."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise PolicyError(f"two policies are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def _modules() -> list[tuple[str, str | None]]:
    """(module, its source file or None) of every module that may register policies: each
    entry point's module and, where that is a package, every module in it (so a new module
    dropped into a package is found with no other file touched). Found, not imported
    (finding a module imports only the packages above it)."""
    out: list[tuple[str, str | None]] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        spec = importlib.util.find_spec(ep.module)
        if spec is None:
            raise ModuleNotFoundError(f"entry point {ep.name!r}: no module {ep.module!r}")
        if not spec.submodule_search_locations:
            out.append((ep.module, spec.origin))
            continue
        found = pkgutil.iter_modules(list(spec.submodule_search_locations))
        for name in sorted(m.name for m in found):
            full = f"{ep.module}.{name}"
            sub = importlib.util.find_spec(full)
            out.append((full, sub.origin if sub and not sub.submodule_search_locations else None))
    return out


def _read() -> dict[str, list[str]]:
    """Policy name -> modules, from the modules' sources (`_REGISTERED`, `_NAME`)."""
    global _INDEX
    if _INDEX is None:
        index: dict[str, list[str]] = {}
        for module, origin in _modules():
            names: list[str] = []
            registrations = 1
            if origin is not None and origin.endswith(".py"):
                source = Path(origin).read_text(encoding="utf-8")
                registrations = len(_DECORATION.findall(source)) + source.count("register(")
                for body in _REGISTERED.findall(source):
                    names += _NAME.findall(body)[:1]
            if len(names) < registrations:
                _UNREAD.append(module)
            for name in names:
                index.setdefault(name, []).append(module)
        _INDEX = index
    return _INDEX


def _load_all() -> None:
    """Import every module that may register policies (`_modules`)."""
    global _all_loaded
    if _all_loaded:
        return
    _all_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.attr:
            ep.load()
    for module, _ in _modules():
        importlib.import_module(module)


def _find(name: str) -> type[Policy] | None:
    """The class registered as `name`, importing the module that registers it (every
    module, when no source names it)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        for module in _read().get(name, []):
            importlib.import_module(module)
        cls = _REGISTRY.get(name)
    if cls is None:
        _load_all()
        cls = _REGISTRY.get(name)
    return cls


def is_registered(cls: type[Policy]) -> bool:
    """Whether `cls` itself (not a subclass or a base sharing its name) is registered."""
    name = getattr(cls, "name", "")
    return bool(name) and _find(name) is cls


def names() -> list[str]:
    """Every registered name; imports only the modules whose sources do not show theirs."""
    index = _read()
    for module in _UNREAD:
        importlib.import_module(module)
    return sorted(set(index) | set(_REGISTRY))


def module_of(name: str) -> str:
    """The module that registers `name`, without importing it where its source says so
    (simulator/frames.py `code_digest` digests the packages they belong to)."""
    cls = _REGISTRY.get(name)
    if cls is not None:
        return cls.__module__
    modules = _read().get(name, [])
    return modules[0] if len(modules) == 1 else get(name).__module__


def get(name: str) -> type[Policy]:
    """The policy class registered under `name`; unknown names fail with a hint."""
    cls = _find(name)
    if cls is None:
        raise PolicyError(f"unknown policy {name!r}{_did_you_mean(name, names())}")
    return cls


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
