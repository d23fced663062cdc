"""The OpenAI automatic-cache model's fitted rules (simulator/prompt_cache.py): the tail a
later prompt cannot read, the read offset, the families; and the recorded evidence for the
step and offset rules on every real rollout in ../shared/traces/codex."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path

import pytest

from simulator import policy as registry
from simulator.app.measure.codex_fit import causes
from simulator.model import Trace
from simulator.prompt_cache import (
    GPT_5_5_LAUNCH_MS,
    AutomaticCache,
    OpenAIFamily,
    Response,
    Usage,
    for_provider,
    openai_family,
)
from simulator.replay import replay
from simulator.view import View
from tests.support import SHARED
from traces import codex
from traces.errors import Problems
from traces.source import ImportUnit, SourceFile

MIN = 60_000
S, M0, M1 = 0x5001, 0x1000, 0x1001


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


def test_a_warm_read_sets_the_offset_of_the_chunk_grid() -> None:
    """The part of the prefix found cached at the start was a read, so it is on the
    session's grid: 1,536 = 3 x 512 moves the grid from 384 + k x 512 to k x 512."""
    cache = AutomaticCache(1024, 512, 10 * MIN, offset=384)
    warm = view((S, 1536))
    cache.warm_entry(warm.chains, 1536, 0, 10 * MIN)
    assert cache.offset == 0
    cache.request(view((S, 1536), (M0, 2000)), [], MIN)
    # 3,536 cached: 3,072 on the grid from 0 (3,456 on the one from 384).
    assert cache.request(view((S, 1536), (M0, 2000), (M1, 10)), [], 2 * MIN).cache_read == 3072


def test_a_prefix_kept_warm_from_elsewhere_outlives_the_retention() -> None:
    """A shared prefix seeded for longer than the retention (other sessions keep it warm)
    is still read after an idle gap past it; the session's own entries are not."""
    for ttl, after_gap in ((60 * MIN, 2048), (5 * MIN, 0)):
        cache = AutomaticCache(1024, 128, 10 * MIN)
        cache.warm_entry(view((S, 2048)).chains, 2048, 0, ttl)
        cache.request(view((S, 2048), (M0, 3000)), [], 0)
        later = view((S, 2048), (M0, 3000), (M1, 10))
        assert cache.request(later, [], 5 * MIN).cache_read == 4992  # within the retention
        assert cache.request(later, [], 30 * MIN).cache_read == after_gap


def test_a_warm_part_that_is_no_read_leaves_the_grid() -> None:
    cache = AutomaticCache(1024, 512, 10 * MIN, offset=384)
    cache.warm_entry(view((S, 1500)).chains, 1500, 0, 10 * MIN)  # not whole 128s
    assert cache.offset == 384
    cache.warm_entry(view((S, 900)).chains, 896, 0, 10 * MIN)  # under the minimum
    assert cache.offset == 384


def test_defaults_reproduce_plain_floor_to_step() -> None:
    cache = AutomaticCache()
    cache.request(view((S, 2000)), [], 0)
    assert cache.request(view((S, 2000), (M0, 10)), [], MIN) == Usage(90, 1920, 0, 0)


#: 2026-04-10 and 2026-05-01, 03:00 UTC: before and after GPT-5.5's launch.
APRIL, MAY = 1_775_790_000_000, 1_777_604_400_000


@pytest.mark.parametrize(
    ("model", "at", "family"),
    [
        ("gpt-5.6-sol", None, OpenAIFamily(15 * MIN, 128, 1024, 768)),
        ("gpt-5.5", None, OpenAIFamily(60 * MIN, 0, 512, 384)),
        ("gpt-5.4", MAY, OpenAIFamily(60 * MIN, 64, 512, 384)),
        ("gpt-5.4", None, OpenAIFamily(60 * MIN, 64, 512, 384)),
        ("gpt-5.4", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0, 48)),
        ("gpt-5-codex", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0, 48)),
        # the serving before 5.5's launch held responses, whatever the gpt-5 model
        ("gpt-5.1-codex-max", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0, 48)),
        ("gpt-5.2", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0, 48)),
        # after it, a model without a row of its own reads prompts only
        ("gpt-5-codex", MAY, OpenAIFamily(15 * MIN, 0, 128, 0)),
        ("gpt-5.2", MAY, OpenAIFamily(15 * MIN, 0, 128, 0)),
        ("gpt-5.3-codex-spark", MAY, OpenAIFamily(15 * MIN, 0, 128, 0)),
        # spark (other hardware) and models older than gpt-5 never held responses here
        ("gpt-5.3-codex-spark", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0)),
        ("o4-mini", APRIL, OpenAIFamily(15 * MIN, 0, 128, 0)),
    ],
)
def test_families(model: str, at: int | None, family: OpenAIFamily) -> None:
    assert openai_family(model, at) == family
    cache = for_provider("openai", 4096, model, at)
    assert isinstance(cache, AutomaticCache)
    assert (cache.retention_ms, cache.tail_tokens, cache.step, cache.offset) == family[:4]
    assert cache.response_tail == family.response_tail
    assert cache.holds_responses == (family.response_tail is not None)
    assert cache.min_tokens == 1024


def test_gpt_5_4_moves_to_the_chunk_grid_at_gpt_5_5s_launch() -> None:
    assert openai_family("gpt-5.4", GPT_5_5_LAUNCH_MS - 1).step == 128
    assert openai_family("gpt-5.4", GPT_5_5_LAUNCH_MS).step == 512


def test_a_held_response_is_read_up_to_its_tail() -> None:
    cache = AutomaticCache(1024, 128, 10 * MIN, response_tail=50)
    assert cache.holds_responses
    prompt = view((S, 2000), (M0, 1000))  # items 0 and 1 (block ids 0, 1)
    cache.request(prompt, [], 0, response=Response(600, 2, 4))
    # The next prompt goes on with the response (blocks 2 and 3, 400 + 300 tokens) and a
    # tool result: 3,000 + 600 - 50 = 3,550 readable, floored to 3,456.
    nxt = view((S, 2000), (M0, 1000), (0x2, 400), (0x3, 300), (0x4, 900))
    assert cache.request(nxt, [], MIN) == Usage(4600 - 3456, 3456, 0, 0)


def test_a_response_is_read_no_further_than_its_blocks_in_the_view() -> None:
    cache = AutomaticCache(1024, 128, 10 * MIN, response_tail=0)
    cache.request(view((S, 3000)), [], 0, response=Response(1000, 1, 3))
    # Only block 1 (200 tokens) of the response (blocks 1 and 2) is sent again, then block
    # 5: 3,200 readable, floored to 3,200.
    nxt = View(0x5EED)
    for block, h, tokens in ((0, S, 3000), (1, 0x1, 200), (5, 0x9, 2000)):
        nxt.append(block, h, tokens)
    assert cache.request(nxt, [], MIN).cache_read == 3200


def test_a_response_is_not_read_when_the_view_does_not_go_on_with_it() -> None:
    cache = AutomaticCache(1024, 128, 10 * MIN, response_tail=0)
    cache.request(view((S, 3000)), [], 0, response=Response(1000, 1, 3))
    # Item 1 is block 1 of this view (the helper numbers items by position), but here a
    # different view whose next block is not the response's first: only the prompt.
    other = View(0x5EED)
    other.append(0, S, 3000)
    other.append(7, 0x7, 900)
    assert cache.request(other, [], MIN).cache_read == 2944


def test_a_cache_of_prompts_ignores_responses() -> None:
    cache = AutomaticCache(1024, 128, 10 * MIN)
    assert not cache.holds_responses
    cache.request(view((S, 3000)), [], 0, response=Response(1000, 1, 3))
    assert cache.request(view((S, 3000), (0x1, 900)), [], MIN).cache_read == 2944


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


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _reads(path: Path) -> list[tuple[str, int, int]]:
    """(model, time, cached_input_tokens) of every recorded request, stdlib only."""
    decoder = json.JSONDecoder()
    out: list[tuple[str, int, int]] = []
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
                    cached = info["last_token_usage"].get("cached_input_tokens", 0)
                    out.append((model, _ms(entry["timestamp"]), cached))
    return out


@pytest.mark.shared
def test_recorded_reads_follow_the_chunk_grid_of_their_family() -> None:
    """gpt-5-codex, 5.3, and 5.4 before GPT-5.5's launch: multiples of 128. gpt-5.5, 5.4
    from then on, and 5.6: their chunk grid, one offset per session (the family's, or, on
    gpt-5.5, 0: git-sync's review sessions), and every gain between two reads of a session
    a whole number of chunks."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is absent")
    files = sorted((SHARED / "codex").rglob("*.jsonl"))
    n = other_offset = 0
    for path in files:
        by_model: dict[str, list[int]] = {}
        since: dict[str, int] = {}
        for model, at, cached in _reads(path):
            since.setdefault(model, at)
            if cached:
                by_model.setdefault(model, []).append(cached)
        for model, reads in by_model.items():
            n += len(reads)
            f = openai_family(model, since[model])
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


def _rollout(
    day: str, cached: tuple[int, int, int] = (0, 19968, 19968), sid: str = "s", words: int = 0
) -> list[bytes]:
    """One gpt-5.4 turn of three requests on `day`: two function calls (400 reasoning
    tokens, 500 of output each) with their outputs, then an answer; `cached`: their
    recorded reads; `words`: the user message's length (else the whole first context is
    the unlogged prefix)."""

    def line(second: int, kind: str, payload: dict[str, object]) -> bytes:
        stamp = f"{day}T03:00:{second:02d}.000Z"
        return json.dumps({"timestamp": stamp, "type": kind, "payload": payload}).encode()

    content = [{"type": "input_text", "text": "word " * words}] if words else []
    out = [
        line(0, "session_meta", {"id": sid, "cli_version": "0.118.0"}),
        line(0, "turn_context", {"model": "gpt-5.4"}),
        line(1, "response_item", {"type": "message", "role": "user", "content": content}),
    ]
    total = 0
    for k, (context, output) in enumerate([(20000, 500), (20800, 500), (21600, 50)]):
        t = 10 + 10 * k
        out.append(line(t, "response_item", {"type": "reasoning", "summary": []}))
        if k < 2:
            call = {"type": "function_call", "name": "exec_command", "arguments": "{}"}
            out.append(line(t + 1, "response_item", {**call, "call_id": f"c{k}"}))
        else:
            reply = {"type": "message", "role": "assistant", "content": []}
            out.append(line(t + 1, "response_item", reply))
        total += context + output
        last = {
            "input_tokens": context,
            "cached_input_tokens": cached[k],
            "output_tokens": output,
            "reasoning_output_tokens": 400 if k < 2 else 0,
        }
        info = {"total_token_usage": {"total_tokens": total}, "last_token_usage": last}
        out.append(line(t + 2, "event_msg", {"type": "token_count", "info": info}))
        if k < 2:
            result = {"type": "function_call_output", "call_id": f"c{k}", "output": "x " * 150}
            out.append(line(t + 3, "response_item", result))
    return out


@pytest.mark.parametrize(
    ("day", "reads"),
    [
        # Before GPT-5.5: the previous prompt and its response but the last 48 tokens, in
        # 128s: 20,000 + 500 - 48 = 20,452 -> 20,352; 20,800 + 452 = 21,252 -> 21,248.
        ("2026-04-10", [0, 20352, 21248]),
        # After: prompts only, less a 64-token tail, on the 512 grid from 384: 19,936 ->
        # 19,840; 20,736 -> 20,352.
        ("2026-05-01", [0, 19840, 20352]),
    ],
)
def test_the_replay_gives_the_cache_each_response(day: str, reads: list[int]) -> None:
    """The engine passes each request's output and its blocks to a cache that holds
    responses (simulator/replay.py), and picks the family by the session's date."""
    unit = ImportUnit("codex", [SourceFile(Path("r.jsonl"), "r.jsonl")])
    trace: Trace = codex.read(unit, [b"\n".join(_rollout(day)) + b"\n"], Problems())
    frame = replay([("r", trace)], registry.build("as-recorded"))
    assert frame["context_tokens"].to_list() == [20000, 20800, 21600]
    assert frame["cache_read"].to_list() == reads


def test_unmatched_requests_are_classed_by_what_the_recording_read(tmp_path: Path) -> None:
    """Request 1 reads what the model says (20,352: matched); request 2 reads 20,352 too,
    the state request 0's prompt and response left (the model: 21,248, request 1's), so
    it is the one unmatched request, an older prompt's state; the first is matched."""
    (tmp_path / "r.jsonl").write_bytes(b"\n".join(_rollout("2026-04-10", (0, 20352, 20352))))
    assert causes(tmp_path) == {"over: an older prompt's state": {"gpt-5 before 5.5's launch": 1}}


def test_a_read_of_a_start_another_session_read_is_classed_as_such(tmp_path: Path) -> None:
    """Request 2 reads 9,984 where the model reads 21,248: more than the prefix (about
    5,000 tokens: the user message holds the rest), no earlier prompt's state. Alone it is
    a partial read of no known cause; beside a session whose early requests read 9,984 too
    (the same rollout under another id), it read a start another session found cached:
    each session's request 2 is such a read of the other's."""
    reads = (0, 20352, 9984)
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(_rollout("2026-04-10", reads, "a", 15000)))
    assert causes(tmp_path) == {"over: partial, other": {"gpt-5 before 5.5's launch": 1}}
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(_rollout("2026-04-10", reads, "b", 15000)))
    assert causes(tmp_path) == {
        "over: a start another session read": {"gpt-5 before 5.5's launch": 2}
    }
