"""Model facts from genai-prices' data (simulator/models.py) and the window a recorded
session ran with."""

from __future__ import annotations

import pytest
from genai_prices.data import providers

from simulator.model import Kind, Role, Session
from simulator.models import DEFAULT, facts, session_facts
from traces.builder import Hasher, RecordedUsage, SessionBuilder


def _genai_window(model_id: str) -> int | None:
    anthropic = next(p for p in providers if p.id == "anthropic")
    return next(m.context_window for m in anthropic.models if m.id == model_id)


@pytest.mark.parametrize(
    "model", ["claude-opus-4-8", "claude-opus-5", "claude-opus-5-5", "claude-sonnet-5"]
)
def test_a_1m_model_has_the_window_genai_prices_gives(model: str) -> None:
    assert _genai_window(model) == 1_000_000
    assert facts(model).window == 1_000_000
    assert facts(model).provider == "anthropic"


@pytest.mark.parametrize(
    ("model", "window", "long_window", "max_output", "min_cache"),
    [
        # Opus 4.6: 1M in genai-prices, 200,000 unless the client opts in ([1m]).
        ("claude-opus-4-6", 200_000, 1_000_000, 128_000, 4096),
        ("claude-opus-4-6[1m]", 1_000_000, 0, 128_000, 4096),
        ("claude-opus-4-5-20251101", 200_000, 0, 64_000, 4096),
        ("claude-sonnet-4-5-20250929", 200_000, 0, 64_000, 1024),
        ("claude-sonnet-4-20250514", 200_000, 0, 64_000, 1024),
        ("claude-opus-4-20250514", 200_000, 0, 32_000, 1024),
        # gpt-5: 400,000 with the output; 272,000 of input. gpt-5.4: 1.05M, 272k default.
        ("gpt-5-codex", 272_000, 0, 128_000, 1024),
        ("gpt-5.4", 272_000, 922_000, 128_000, 1024),
        ("gemini-2.5-flash", 1_048_576, 0, 65_536, 1024),
    ],
)
def test_facts(model: str, window: int, long_window: int, max_output: int, min_cache: int) -> None:
    f = facts(model)
    assert (f.window, f.long_window, f.max_output, f.min_cache_tokens) == (
        window,
        long_window,
        max_output,
        min_cache,
    )


def test_an_unknown_model_is_the_default() -> None:
    assert facts("no-such-model") == DEFAULT
    assert facts("<synthetic>") == DEFAULT


def _session(model: str, inputs: list[int]) -> Session:
    b = SessionBuilder(Hasher(b"models"), id="s", kind="main", client="claude-code 2.1.232")
    b.prefix_tokens = 1_000
    for k, tokens in enumerate(inputs):
        b.add_block(
            msg=k, kind=Kind.TEXT, role=Role.USER, text="x" * 40, ts=k, first_request=k, tokens=10
        )
        b.add_request(ts=k, model=model, usage=RecordedUsage(tokens, 0, 0, 0, 10))
    return b.finish()


@pytest.mark.parametrize(
    ("model", "inputs", "window"),
    [
        ("claude-opus-4-6", [50_000, 199_999], 200_000),
        # the provider accepted 200,001 tokens: the 1M window was on.
        ("claude-opus-4-6", [50_000, 200_001], 1_000_000),
        ("claude-opus-4-6[1m]", [50_000], 1_000_000),
        ("claude-opus-5", [50_000], 1_000_000),
        # no longer window to infer: the standard one, whatever the usage says.
        ("claude-sonnet-4-5-20250929", [50_000, 250_000], 200_000),
    ],
)
def test_session_facts_infer_the_window_from_the_recording(
    model: str, inputs: list[int], window: int
) -> None:
    assert session_facts(_session(model, inputs)).window == window
