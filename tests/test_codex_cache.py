"""The OpenAI automatic-cache model's fitted rules (simulator/prompt_cache.py): the tail a
later prompt cannot read, the read offset, the families; and the recorded evidence for the
step and offset rules on every real rollout in ../shared/traces/codex."""

from __future__ import annotations

import itertools
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
        ("gpt-5.6-sol", OpenAIFamily(15 * MIN, 128, 1024, 768)),
        ("gpt-5.5", OpenAIFamily(60 * MIN, 0, 512, 384)),
        ("gpt-5.4", OpenAIFamily(60 * MIN, 0, 128, 0)),
        ("gpt-5-codex", OpenAIFamily(15 * MIN, 0, 128, 0)),
    ],
)
def test_families(model: str, family: OpenAIFamily) -> None:
    assert openai_family(model) == family
    cache = for_provider("openai", 4096, model)
    assert isinstance(cache, AutomaticCache)
    assert (cache.retention_ms, cache.tail_tokens, cache.step, cache.offset) == family
    assert cache.min_tokens == 1024


def test_gpt_5_5_reads_whole_chunks_and_retains_an_hour() -> None:
    cache = for_provider("openai", 1024, "gpt-5.5")
    cache.request(view((S, 2000)), [], 0)
    # 40 minutes idle: still cached, read to its chunk grid: 384 + 3 x 512 = 1,920.
    assert cache.request(view((S, 2000), (M0, 100)), [], 40 * MIN) == Usage(180, 1920, 0, 0)
    # That prompt added 100 tokens, under a chunk: the next read gains nothing.
    b = view((S, 2000), (M0, 100), (M1, 300))
    assert cache.request(b, [], 41 * MIN) == Usage(480, 1920, 0, 0)
    # 2,400 cached now: one more chunk, 2,432 > 2,400, is not whole; 61 minutes on: gone.
    assert cache.request(b, [], 42 * MIN) == Usage(480, 1920, 0, 0)
    assert cache.request(b, [], 103 * MIN) == Usage(2400, 0, 0, 0)


def test_gpt_5_6_reads_1024_chunks_short_of_a_128_token_tail() -> None:
    cache = for_provider("openai", 1024, "gpt-5.6-sol")
    cache.request(view((S, 4900)), [], 0)
    # 4,900 - 128 = 4,772 readable: 768 + 3 x 1,024 = 3,840 (4,864 would reach the tail).
    assert cache.request(view((S, 4900), (M0, 100)), [], MIN) == Usage(1160, 3840, 0, 0)
    # 5,000 - 128 = 4,872 of that prompt: 4,864.
    assert cache.request(view((S, 4900), (M0, 100), (M1, 10)), [], 2 * MIN) == Usage(
        146, 4864, 0, 0
    )


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
def test_recorded_reads_follow_the_chunk_grid_of_their_family() -> None:
    """gpt-5-codex, 5.3, 5.4: multiples of 128. gpt-5.5 and 5.6: their chunk grid, one
    offset per session (the family's, or, on gpt-5.5, 0: git-sync's review sessions), and
    every gain between two reads of a session a whole number of chunks."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is absent")
    files = sorted((SHARED / "codex").rglob("*.jsonl"))
    n = other_offset = 0
    for path in files:
        by_model: dict[str, list[int]] = {}
        for model, cached in _reads(path):
            if cached:
                by_model.setdefault(model, []).append(cached)
        for model, reads in by_model.items():
            n += len(reads)
            f = openai_family(model)
            residues = {(r - f.offset) % f.step for r in reads}
            if f.step == 128:
                assert residues == {0}, (model, residues)
                continue
            assert len(residues) == 1, (path.name, model, residues)
            if residues != {0}:
                assert "gpt-5.5" in model and residues == {f.step - f.offset}
                other_offset += len(reads)
            assert all((b - a) % f.step == 0 for a, b in itertools.pairwise(reads))
    assert n > 5000
    assert other_offset == 312
