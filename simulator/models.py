"""Facts about models that replay needs: provider, context window, output limit, and the
shortest prompt prefix the provider will cache; and the window a recorded session ran with.

Provider and context window come from genai-prices' data, installed with the package
(`genai_prices.data`, each model's `context_window`: 1,000,000 for claude-opus-4-6, 4-7,
4-8, 5, 5-5, sonnet-4-6, sonnet-5, 5-5, fable-5; 200,000 for the 4.5 and older Claude
models; 400,000 for gpt-5). genai-prices has no output limit and no cache minimum, so
those two stay a table of what the providers document, and so do two input limits that
genai-prices' `context_window` does not express:

* a window that needs an opt-in: Claude Opus 4.6 and Sonnet 4.x run on 200,000 tokens
  unless the client asks for the 1M window (Claude Code's `[1m]` model suffix, the
  `context-1m` beta); OpenAI's gpt-5.4-5.6 run on 272,000 unless configured for 1M;
* OpenAI's `context_window` counts the output: gpt-5's 400,000 are 272,000 of input and
  128,000 of output, and a request is refused above the input limit.

Prices are not here: they come from genai-prices (simulator/pricing.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cache

from simulator.model import Session

#: The 1M window's size, and the standard one's, for the inference of `session_facts`.
LONG_WINDOW = 1_000_000
STANDARD_WINDOW = 200_000
#: Claude Code's model-name suffix for the 1M window ("claude-opus-4-6[1m]").
ONE_M_SUFFIX = "[1m]"


@dataclass(frozen=True)
class ModelFacts:
    provider: str  # "anthropic", "openai" or "google"
    window: int  # context window a request gets, tokens
    max_output: int  # largest output the model may be asked for
    min_cache_tokens: int  # shortest cacheable prefix
    #: The longest window the provider offers the model (its opt-in 1M window), 0: `window`.
    long_window: int = 0

    @property
    def largest_window(self) -> int:
        return max(self.window, self.long_window)


@dataclass(frozen=True)
class _Documented:
    """What genai-prices does not say, as each provider documents it."""

    provider: str
    max_output: int
    min_cache_tokens: int
    #: Input limit below genai-prices' `context_window` (opt-in window, output counted), or
    #: the window itself when genai-prices has none for the model.
    input_limit: int


# First match wins. Anthropic cache minimums per its prompt-caching documentation (4,096 for
# Opus 4.5 and newer and Haiku 4.5; 2,048 for Haiku 3/3.5; 1,024 for Sonnet and Opus
# 4/4.1; Sonnet 5 and Fable 5 keep the 1,024 of the generic Claude row they matched
# before: no documented minimum yet). Input limits: 200,000 for the Claude models whose
# 1M window is opt-in (Opus 4.6, Sonnet 4.x); 272,000 for gpt-5 (400,000 less 128,000 of
# output) and for gpt-5.4-5.6 (1M opt-in).
_TABLE: list[tuple[str, _Documented]] = [
    (r"claude-opus-4-6", _Documented("anthropic", 128_000, 4096, STANDARD_WINDOW)),
    (r"claude-opus-4-[5-9]|claude-opus-[5-9]", _Documented("anthropic", 64_000, 4096, 0)),
    (r"claude-sonnet-[5-9]", _Documented("anthropic", 64_000, 1024, 0)),
    (r"claude-(fable|mythos)-", _Documented("anthropic", 64_000, 1024, 0)),
    (r"claude-haiku-4-[5-9]|claude-haiku-[5-9]", _Documented("anthropic", 64_000, 4096, 0)),
    (r"claude-(3-5-)?haiku|claude-3-haiku", _Documented("anthropic", 8_192, 2048, 0)),
    (r"claude-opus-4", _Documented("anthropic", 32_000, 1024, 0)),
    (r"claude-sonnet-4|claude-3-7-sonnet", _Documented("anthropic", 64_000, 1024, STANDARD_WINDOW)),
    (r"claude", _Documented("anthropic", 8_192, 1024, 0)),
    (r"gemini-.*pro", _Documented("google", 65_536, 2048, 0)),
    (r"gemini", _Documented("google", 65_536, 1024, 0)),
    (r"gpt-5|codex", _Documented("openai", 128_000, 1024, 272_000)),
    (r"gpt-4\.1", _Documented("openai", 32_768, 1024, 0)),
    (r"gpt-4o|gpt-4", _Documented("openai", 16_384, 1024, 0)),
    (r"^o\d", _Documented("openai", 100_000, 1024, 0)),
]
_COMPILED = [(re.compile(p), f) for p, f in _TABLE]
#: What an unknown model is taken to be (a 200k Anthropic-style model).
DEFAULT = ModelFacts("anthropic", 200_000, 32_000, 1024)
#: Windows of models genai-prices knows but gives no `context_window` for.
_FALLBACK_WINDOW = {"anthropic": 200_000, "openai": 128_000, "google": 1_048_576}
_LOOKED_UP = ("anthropic", "openai", "google")


def _genai(model: str) -> tuple[str, int | None] | None:
    """(provider id, context_window) of the first genai-prices model matching `model`.

    genai-prices is imported here, at the first lookup, not with the module: its data and
    types take 0.19 s of CPU to import alone, 0.07 s beyond the pydantic a sweep's main
    process imports anyway for the policies' parameters; that process looks no model up
    (issue 16; tests/simulator/app/test_startup.py)."""
    from genai_prices.data import providers

    for provider in providers:
        if provider.id not in _LOOKED_UP:
            continue
        for info in provider.models:
            if info.is_match(model):
                return provider.id, info.context_window
    return None


@cache
def facts(model: str) -> ModelFacts:
    """The facts of a model name (a `[1m]` suffix selects the 1M window)."""
    one_m = model.endswith(ONE_M_SUFFIX)
    name = model[: -len(ONE_M_SUFFIX)] if one_m else model
    documented = next((f for pattern, f in _COMPILED if pattern.search(name)), None)
    found = _genai(name)
    if documented is None and found is None:
        return DEFAULT
    provider = found[0] if found else documented.provider  # type: ignore[union-attr]
    max_output = documented.max_output if documented else DEFAULT.max_output
    min_cache = documented.min_cache_tokens if documented else DEFAULT.min_cache_tokens
    limit = documented.input_limit if documented else 0
    context = found[1] if found and found[1] else (limit or _FALLBACK_WINDOW.get(provider, 0))
    window = min(context, limit) if limit else context
    # The opt-in window is an input window: OpenAI's context counts the output (gpt-5's
    # 400,000 - 128,000 is its 272,000 input limit, not a longer window).
    longest = context - max_output if provider == "openai" else context
    long_window = longest if longest > window else 0
    if one_m and long_window:
        window, long_window = long_window, 0
    return ModelFacts(provider, window, max_output, min_cache, long_window)


def ran_long_window(session: Session, f: ModelFacts) -> bool:
    """Whether the recording says the session had the model's longer window: a `[1m]`
    model name, or a recorded context above the standard window (the provider accepted
    it, so the window was on; ../shared/traces/claude-code/starcar reaches 619k on Opus
    4.8, entirecontext 223k on Opus 4.6)."""
    if not f.long_window:
        return False
    if any(m.endswith(ONE_M_SUFFIX) for m in session.models):
        return True
    return session.n_requests > 0 and int(session.recorded_context().max()) > f.window


def session_facts(session: Session, model: str | None = None) -> ModelFacts:
    """The facts of the model a session (first) ran, with the window it actually ran
    with: the longer window when the recording says so (`ran_long_window`), else the
    model's standard one."""
    if model is None:
        model = session.models[int(session.requests["model"][0])] if session.n_requests else ""
    f = facts(model)
    if ran_long_window(session, f):
        return replace(f, window=f.long_window, long_window=0)
    return f
