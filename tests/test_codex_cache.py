"""The OpenAI automatic-cache model's fitted rules (simulator/prompt_cache.py): the tail a
later prompt cannot read, the read offset, the families; and the recorded evidence for the
step and offset rules on every real rollout in ../shared/traces/codex."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.prompt_cache import (
    AutomaticCache,
    OpenAIFamily,
    Usage,
    for_provider,
    openai_family,
)
from simulator.view import View

MIN = 60_000
S, M0, M1 = 0x5001, 0x1000, 0x1001
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def view(*items: tuple[int, int]) -> View:
    v = View(0x5EED)
    for i, (h, tokens) in enumerate(items):
        v.append(i, h, tokens)
    return v


def test_tail_of_a_prompt_is_not_read_until_a_longer_prompt_covers_it() -> None:
    cache = AutomaticCache(1024, 128, 10 * MIN, tail_tokens=300)
    assert cache.request(view((S, 2000), (M0, 1000)), [], 0) == Usage(3000, 0, 0, 0)
    # The first prompt is cached but for its last 300 tokens: 2,700, floored to 2,688.
    b = view((S, 2000), (M0, 1000), (M1, 500))
    assert cache.request(b, [], MIN) == Usage(812, 2688, 0, 0)
    # The second prompt held all of the first (its own tail is M1's end): read whole now,
    # 3,000 floored to 2,944; and this shorter prompt's tail does not undo that.
    assert cache.request(view((S, 2000), (M0, 1000)), [], 2 * MIN) == Usage(56, 2944, 0, 0)
    assert cache.request(view((S, 2000), (M0, 1000)), [], 3 * MIN) == Usage(56, 2944, 0, 0)


def test_reads_come_in_steps_from_an_offset() -> None:
    cache = AutomaticCache(1024, 512, 10 * MIN, offset=256)
    cache.request(view((S, 3000)), [], 0)
    # 3,000 cached: 256 + 5 x 512 = 2,816 read.
    assert cache.request(view((S, 3000), (M0, 10)), [], MIN) == Usage(194, 2816, 0, 0)


def test_defaults_reproduce_plain_floor_to_step() -> None:
    cache = AutomaticCache()
    cache.request(view((S, 2000)), [], 0)
    assert cache.request(view((S, 2000), (M0, 10)), [], MIN) == Usage(90, 1920, 0, 0)


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("gpt-5.6-sol", OpenAIFamily(15 * MIN, 512, 512, 256)),
        ("gpt-5.5", OpenAIFamily(45 * MIN, 256, 128, 0)),
        ("gpt-5.4", OpenAIFamily(10 * MIN, 0, 128, 0)),
        ("gpt-5-codex", OpenAIFamily(15 * MIN, 0, 128, 0)),
    ],
)
def test_families(model: str, family: OpenAIFamily) -> None:
    assert openai_family(model) == family
    cache = for_provider("openai", 4096, model)
    assert isinstance(cache, AutomaticCache)
    assert (cache.retention_ms, cache.tail_tokens, cache.step, cache.offset) == family
    assert cache.min_tokens == 1024


def test_gpt_5_5_retention_and_tail() -> None:
    cache = for_provider("openai", 1024, "gpt-5.5")
    cache.request(view((S, 2000)), [], 0)
    # 40 minutes idle: still cached, but for the 256-token tail: 1,744 floored to 1,664.
    assert cache.request(view((S, 2000), (M0, 100)), [], 40 * MIN) == Usage(436, 1664, 0, 0)
    # 46 minutes after that use: gone.
    assert cache.request(view((S, 2000), (M0, 100)), [], 86 * MIN) == Usage(2100, 0, 0, 0)


def test_no_model_keeps_the_generic_openai_cache() -> None:
    cache = for_provider("openai", 1024)
    assert isinstance(cache, AutomaticCache)
    assert (cache.retention_ms, cache.tail_tokens, cache.step, cache.offset) == (
        10 * MIN,
        0,
        128,
        0,
    )


def _reads(path: Path) -> list[tuple[str, int]]:
    """(model, cached_input_tokens) of every recorded request, stdlib only."""
    decoder = json.JSONDecoder()
    out: list[tuple[str, int]] = []
    model, previous = "", None
    for raw in path.read_text(encoding="utf-8").splitlines():
        i, raw = 0, raw.strip()
        while i < len(raw):
            entry, i = decoder.raw_decode(raw, i)
            payload = entry["payload"]
            if entry["type"] == "turn_context":
                model = payload.get("model") or model
            if entry["type"] == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                if info and info["total_token_usage"] != previous:
                    previous = info["total_token_usage"]
                    out.append((model, info["last_token_usage"].get("cached_input_tokens", 0)))
    return out


@pytest.mark.shared
def test_recorded_reads_follow_the_step_and_offset_of_their_family() -> None:
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is absent")
    reads = [r for p in sorted((SHARED / "codex").rglob("*.jsonl")) for r in _reads(p)]
    assert len(reads) > 5000
    for model, cached in reads:
        f = openai_family(model)
        assert cached == 0 or (cached - f.offset) % f.step == 0, (model, cached)
