"""Facts about models that replay needs: provider, context window, output limit, and the
shortest prompt prefix the provider will cache.

Prices are not here: they come from genai-prices (simulator/pricing.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFacts:
    provider: str  # "anthropic", "openai" or "google"
    window: int  # context window, tokens
    max_output: int  # largest output the model may be asked for
    min_cache_tokens: int  # shortest cacheable prefix


# First match wins. Anthropic minimums per its prompt-caching documentation (4,096 for Opus
# 4.5/4.6 and Haiku 4.5; 2,048 for Haiku 3/3.5; 1,024 for Sonnet and Opus 4/4.1).
_TABLE: list[tuple[str, ModelFacts]] = [
    (r"claude-opus-4-[5-9]|claude-opus-[5-9]", ModelFacts("anthropic", 200_000, 64_000, 4096)),
    (r"claude-haiku-4-[5-9]|claude-haiku-[5-9]", ModelFacts("anthropic", 200_000, 64_000, 4096)),
    (r"claude-(3-5-)?haiku|claude-3-haiku", ModelFacts("anthropic", 200_000, 8_192, 2048)),
    (r"claude-opus-4", ModelFacts("anthropic", 200_000, 32_000, 1024)),
    (r"claude-sonnet-4|claude-3-7-sonnet", ModelFacts("anthropic", 200_000, 64_000, 1024)),
    (r"claude", ModelFacts("anthropic", 200_000, 8_192, 1024)),
    (r"gemini-.*pro", ModelFacts("google", 1_048_576, 65_536, 2048)),
    (r"gemini", ModelFacts("google", 1_048_576, 65_536, 1024)),
    (r"gpt-5|codex", ModelFacts("openai", 272_000, 128_000, 1024)),
    (r"gpt-4\.1", ModelFacts("openai", 1_047_576, 32_768, 1024)),
    (r"gpt-4o|gpt-4", ModelFacts("openai", 128_000, 16_384, 1024)),
    (r"^o\d", ModelFacts("openai", 200_000, 100_000, 1024)),
]
_COMPILED = [(re.compile(p), f) for p, f in _TABLE]
#: What an unknown model is taken to be (a 200k Anthropic-style model).
DEFAULT = ModelFacts("anthropic", 200_000, 32_000, 1024)


def facts(model: str) -> ModelFacts:
    for pattern, f in _COMPILED:
        if pattern.search(model):
            return f
    return DEFAULT
