"""The mocked prompt caches (simulator/prompt_cache.py), one rule per test.

Every view is built by hand with View.append(block, hash, tokens) and every expected Usage
is written out as literal numbers, computed by hand in the comments. Usage is
(uncached, cache_read, cache_write_5m, cache_write_1h). Times are milliseconds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.prompt_cache import (
    FIVE_MINUTES,
    ONE_HOUR,
    AnthropicCache,
    AutomaticCache,
    Breakpoint,
    PromptCache,
    Usage,
    for_provider,
)
from simulator.view import View

SEC = 1_000
MIN = 60 * SEC
ROOT = 0x5EED


def view(*items: tuple[int, int]) -> View:
    """A view of (hash, tokens) items; the block id is the position."""
    v = View(ROOT)
    for i, (h, tokens) in enumerate(items):
        v.append(i, h, tokens)
    return v


def bp5(position: int) -> Breakpoint:
    return Breakpoint(position, FIVE_MINUTES)


def bp1h(position: int) -> Breakpoint:
    return Breakpoint(position, ONE_HOUR)


# Item hashes: SYS is the system prompt, TOOLS the tool definitions, M1.. messages.
TOOLS, SYS = 0x7001, 0x5001
M = [0x1000 + i for i in range(40)]


# --- TTL --------------------------------------------------------------------------------


def _written_at_zero(ttl: int) -> AnthropicCache:
    """A cache holding the 2,000-token system prompt, written at t=0 with `ttl`."""
    cache = AnthropicCache(min_tokens=1024)
    first = cache.request(view((SYS, 2000)), [Breakpoint(0, ttl)], 0)
    if ttl == ONE_HOUR:
        assert first == Usage(0, 0, 0, 2000)
    else:
        assert first == Usage(0, 0, 2000, 0)
    return cache


def test_five_minute_entry_hits_at_4_59() -> None:
    cache = _written_at_zero(FIVE_MINUTES)
    usage = cache.request(view((SYS, 2000)), [bp5(0)], 4 * MIN + 59 * SEC)
    assert usage == Usage(0, 2000, 0, 0)


def test_five_minute_entry_misses_at_5_01() -> None:
    cache = _written_at_zero(FIVE_MINUTES)
    usage = cache.request(view((SYS, 2000)), [bp5(0)], 5 * MIN + 1 * SEC)
    # Expired at 5:00: nothing is read, the 2,000 tokens are written again.
    assert usage == Usage(0, 0, 2000, 0)


def test_one_hour_entry_alive_at_59_minutes_and_gone_at_61() -> None:
    cache = _written_at_zero(ONE_HOUR)
    assert cache.request(view((SYS, 2000)), [bp1h(0)], 59 * MIN) == Usage(0, 2000, 0, 0)
    # The read at 59:00 refreshed it to 1:59:00; 2:00:01 is past that.
    late = cache.request(view((SYS, 2000)), [bp1h(0)], 2 * 60 * MIN + 1 * SEC)
    assert late == Usage(0, 0, 0, 2000)


def test_hit_refreshes_ttl() -> None:
    cache = _written_at_zero(FIVE_MINUTES)
    # +4:00 hits and moves the expiry to 9:00.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 4 * MIN) == Usage(0, 2000, 0, 0)
    # +8:00 is 8 minutes after the write but 4 after the refresh: still a hit (expiry 13:00).
    assert cache.request(view((SYS, 2000)), [bp5(0)], 8 * MIN) == Usage(0, 2000, 0, 0)
    # 13:01 is 5:01 after the last refresh: a miss, written again.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 13 * MIN + SEC) == Usage(0, 0, 2000, 0)


# --- Refresh point: the request's send time or its response's end -----------------------


def test_end_refresh_keeps_an_entry_alive_past_five_minutes_after_the_send() -> None:
    cache = AnthropicCache(min_tokens=1024, refresh_at_send=False)
    # Sent at 0, response complete at 0:21: the entry lives until 5:21.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 0, 21 * SEC) == Usage(0, 0, 2000, 0)
    # 5:00.037 after the send (starcar's miss) is still inside it: a hit.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 5 * MIN + 37) == Usage(0, 2000, 0, 0)


def test_send_refresh_expires_five_minutes_after_the_send_however_long_the_response() -> None:
    cache = AnthropicCache(min_tokens=1024, refresh_at_send=True)
    # Sent at 0, response complete at 0:21: the entry lives until 5:00 all the same.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 0, 21 * SEC) == Usage(0, 0, 2000, 0)
    assert cache.request(view((SYS, 2000)), [bp5(0)], 5 * MIN + 37) == Usage(0, 0, 2000, 0)


def test_send_refresh_hit_restarts_the_ttl_at_its_own_send() -> None:
    cache = AnthropicCache(min_tokens=1024, refresh_at_send=True)
    cache.request(view((SYS, 2000)), [bp5(0)], 0, 10 * SEC)
    # Read at 4:00 (response until 4:30): expiry 9:00, not 9:30.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 4 * MIN, 4 * MIN + 30 * SEC) == Usage(
        0, 2000, 0, 0
    )
    assert cache.request(view((SYS, 2000)), [bp5(0)], 9 * MIN) == Usage(0, 2000, 0, 0)
    # 9:00 refreshed it to 14:00; 14:00.001 is past.
    assert cache.request(view((SYS, 2000)), [bp5(0)], 14 * MIN + 1) == Usage(0, 0, 2000, 0)


def test_end_refresh_after_a_long_response_reads_right_after_it() -> None:
    """m-claude c71cc98f: a response of 313 s, then a request at once reads its cache."""
    for at_send, expected in ((False, Usage(0, 2000, 0, 0)), (True, Usage(0, 0, 2000, 0))):
        cache = AnthropicCache(min_tokens=1024, refresh_at_send=at_send)
        cache.request(view((SYS, 2000)), [bp5(0)], 0, 313 * SEC)
        assert cache.request(view((SYS, 2000)), [bp5(0)], 313 * SEC + 47) == expected


def test_one_hour_send_refresh() -> None:
    cache = AnthropicCache(min_tokens=1024, refresh_at_send=True)
    cache.request(view((SYS, 2000)), [bp1h(0)], 0, 2 * MIN)
    assert cache.request(view((SYS, 2000)), [bp1h(0)], 60 * MIN) == Usage(0, 2000, 0, 0)
    # The read sent at 1:00:00 moved the expiry to 2:00:00: 2:00:01 misses.
    assert cache.request(view((SYS, 2000)), [bp1h(0)], 120 * MIN + SEC) == Usage(0, 0, 0, 2000)


@pytest.mark.parametrize(
    ("model", "at_send"),
    [
        ("claude-opus-4-20250514", False),
        ("claude-sonnet-4-20250514", False),
        ("claude-sonnet-4-5-20250929", False),
        ("claude-opus-4-5-20251101", False),
        ("claude-haiku-4-5-20251001", False),
        ("claude-3-7-sonnet-20250219", False),
        ("claude-opus-4-7", True),
        ("claude-opus-4-8", True),
        ("claude-opus-4-6[1m]", True),
        ("claude-fable-5", True),
        ("claude-sonnet-5", True),
        ("claude-opus-5", True),
        ("", True),
    ],
)
def test_for_provider_sets_the_refresh_point_per_model(model: str, at_send: bool) -> None:
    cache = for_provider("anthropic", 1024, model)
    assert isinstance(cache, AnthropicCache)
    assert cache.refresh_at_send is at_send


# --- Lookback ---------------------------------------------------------------------------


def _cache_with_entry_at_1() -> AnthropicCache:
    """System 2,000 (position 0) and one 100-token message (position 1), both written."""
    cache = AnthropicCache(min_tokens=1024, lookback=20)
    usage = cache.request(view((SYS, 2000), (M[0], 100)), [bp5(0), bp5(1)], 0)
    assert usage == Usage(0, 0, 2100, 0)  # 2,000 at the system marker, +100 at position 1
    return cache


def _grown(n_new: int) -> View:
    """The view of _cache_with_entry_at_1 plus `n_new` messages of 100 tokens."""
    return view((SYS, 2000), (M[0], 100), *[(M[i], 100) for i in range(1, n_new + 1)])


def test_lookback_20_items_hits() -> None:
    cache = _cache_with_entry_at_1()
    v = _grown(20)  # last position 21 = entry position 1 + 20
    assert len(v) == 22 and v.total == 4100  # 2,000 + 21 x 100
    usage = cache.request(v, [bp5(0), bp5(21)], MIN)
    # Lookback from 21 reaches position 1 (2,100 tokens cached); 4,100 - 2,100 = 2,000 written.
    assert usage == Usage(0, 2100, 2000, 0)


def test_lookback_21_items_misses_falls_back_to_system() -> None:
    cache = _cache_with_entry_at_1()
    v = _grown(21)  # last position 22: looks back to position 2, one short of the entry
    assert len(v) == 23 and v.total == 4200
    usage = cache.request(v, [bp5(0), bp5(22)], MIN)
    # Only the system breakpoint (position 0, 2,000 tokens) is read; 4,200 - 2,000 written.
    assert usage == Usage(0, 2000, 2200, 0)


def test_lookback_21_items_without_earlier_breakpoint_reads_nothing() -> None:
    cache = _cache_with_entry_at_1()
    usage = cache.request(_grown(21), [bp5(22)], MIN)
    assert usage == Usage(0, 0, 4200, 0)


# --- Minimum cacheable length -----------------------------------------------------------


def test_prefix_below_minimum_is_not_written() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 1000), (M[0], 23))  # cum 1,000 and 1,023: both below 1,024
    assert cache.request(v, [bp5(0), bp5(1)], 0) == Usage(1023, 0, 0, 0)
    assert cache.request(v, [bp5(0), bp5(1)], SEC) == Usage(1023, 0, 0, 0)
    assert cache.entries == {}


def test_prefix_at_minimum_is_written_and_read() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 1000), (M[0], 24))  # cum 1,000 (too short) and 1,024 (exactly the minimum)
    assert cache.request(v, [bp5(0), bp5(1)], 0) == Usage(0, 0, 1024, 0)
    assert cache.request(v, [bp5(0), bp5(1)], SEC) == Usage(0, 1024, 0, 0)
    # The 1,000-token system prefix was never written: changing message 1 reads nothing.
    changed = view((SYS, 1000), (M[1], 24))
    assert cache.request(changed, [bp5(0), bp5(1)], 2 * SEC) == Usage(0, 0, 1024, 0)


# --- Breakpoints: TTL buckets, limit, ordering -----------------------------------------


def test_write_split_per_breakpoint_ttl() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 2000), (M[0], 500), (M[1], 700))
    # Through the 1h system marker: 2,000 at 1h; the rest to the 5m marker: 500 + 700 = 1,200.
    assert cache.request(v, [bp1h(0), bp5(2)], 0) == Usage(0, 0, 1200, 2000)
    # 10 minutes later the 5m entry has expired, the 1h one has not.
    v2 = view((SYS, 2000), (M[0], 500), (M[1], 700), (M[2], 300))
    usage = cache.request(v2, [bp1h(0), bp5(3)], 10 * MIN)
    # Read 2,000 (system); write 3,500 - 2,000 = 1,500 at 5m.
    assert usage == Usage(0, 2000, 1500, 0)


def test_more_than_four_breakpoints_rejected() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view(*[(M[i], 1100) for i in range(5)])
    with pytest.raises(ValueError):
        cache.request(v, [bp5(i) for i in range(5)], 0)


def test_five_minute_breakpoint_before_one_hour_rejected() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 2000), (M[0], 500))
    with pytest.raises(ValueError):
        cache.request(v, [bp5(0), bp1h(1)], 0)


# --- Invalidation by level --------------------------------------------------------------


def _three_levels() -> tuple[AnthropicCache, list[Breakpoint]]:
    """tools 1,500 (pos 0), system 1,000 (pos 1), messages 800 + 700 (pos 2, 3); a marker
    at the end of each level."""
    cache = AnthropicCache(min_tokens=1024)
    bps = [bp5(0), bp5(1), bp5(3)]
    v = view((TOOLS, 1500), (SYS, 1000), (M[0], 800), (M[1], 700))
    # Writes 1,500 (tools) + 1,000 (system) + 1,500 (messages) = 4,000.
    assert cache.request(v, bps, 0) == Usage(0, 0, 4000, 0)
    return cache, bps


def test_tools_change_invalidates_everything() -> None:
    cache, bps = _three_levels()
    v = view((TOOLS + 1, 1500), (SYS, 1000), (M[0], 800), (M[1], 700))
    assert cache.request(v, bps, MIN) == Usage(0, 0, 4000, 0)


def test_system_change_keeps_tools_only() -> None:
    cache, bps = _three_levels()
    v = view((TOOLS, 1500), (SYS + 1, 1000), (M[0], 800), (M[1], 700))
    # Read the tools (1,500); write 4,000 - 1,500 = 2,500.
    assert cache.request(v, bps, MIN) == Usage(0, 1500, 2500, 0)


def test_middle_message_change_keeps_prefix_before_it() -> None:
    cache = AnthropicCache(min_tokens=1024)
    base = [(TOOLS, 1500), (SYS, 1000), (M[0], 800)]
    # Request 1 marks message 0 (position 2): 3,300 written.
    assert cache.request(view(*base), [bp5(1), bp5(2)], 0) == Usage(0, 0, 3300, 0)
    # Request 2 adds messages 1 (700) and 2 (600): reads 3,300, writes 4,600 - 3,300 = 1,300.
    v2 = view(*base, (M[1], 700), (M[2], 600))
    assert cache.request(v2, [bp5(1), bp5(4)], MIN) == Usage(0, 3300, 1300, 0)
    # Request 3 rewrites message 1 (position 3): the entry at position 2 still matches.
    v3 = view(*base, (M[1] + 100, 700), (M[2], 600))
    assert cache.request(v3, [bp5(1), bp5(4)], 2 * MIN) == Usage(0, 3300, 1300, 0)


# --- cache_edits ------------------------------------------------------------------------


def test_edit_out_keeps_prefix_and_drops_tokens() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 2000), (M[0], 3000), (M[1], 500))
    # 2,000 (system) + 3,500 (to position 2) written.
    assert cache.request(v, [bp5(0), bp5(2)], 0) == Usage(0, 0, 5500, 0)
    nxt = v.copy()
    nxt.append(3, M[2], 400)
    chains_before = list(nxt.chains)
    nxt.edit_out(1)  # delete the 3,000-token tool result by reference
    assert nxt.chains == chains_before
    assert nxt.cum == [2000, 2000, 2500, 2900]
    # Position 2 still matches: read 2,000 + 0 + 500 = 2,500 (not 5,500); write the new 400.
    usage = cache.request(nxt, [bp5(0), bp5(3)], MIN)
    assert usage == Usage(0, 2500, 400, 0)
    assert usage.total == nxt.total == 2900


# --- Automatic (OpenAI-style) cache -----------------------------------------------------


def test_automatic_below_1024_not_read() -> None:
    cache = AutomaticCache(min_tokens=1024, step=128)
    assert cache.request(view((SYS, 1000)), [], 0) == Usage(1000, 0, 0, 0)
    # Common prefix 1,000 < 1,024: nothing read.
    assert cache.request(view((SYS, 1000), (M[0], 500)), [], SEC) == Usage(1500, 0, 0, 0)


def test_automatic_1024_read_whole() -> None:
    cache = AutomaticCache(min_tokens=1024, step=128)
    cache.request(view((SYS, 1024)), [], 0)
    # 1,024 = 8 x 128: read exactly; 500 uncached.
    assert cache.request(view((SYS, 1024), (M[0], 500)), [], SEC) == Usage(500, 1024, 0, 0)


def test_automatic_128_token_steps() -> None:
    cache = AutomaticCache(min_tokens=1024, step=128)
    first = view((SYS, 1000), (M[0], 500), (M[1], 400))
    # No write fee: the first request is all uncached, writes 0.
    assert cache.request(first, [], 0) == Usage(1900, 0, 0, 0)
    second = view((SYS, 1000), (M[0], 500), (M[2], 400))
    # Common prefix 1,500 -> 1,500 - 1,500 % 128 = 1,500 - 92 = 1,408 read; 1,900 - 1,408 = 492.
    assert cache.request(second, [], SEC) == Usage(492, 1408, 0, 0)


def test_automatic_retention_expiry() -> None:
    hit = AutomaticCache(min_tokens=1024, step=128, retention_ms=5 * MIN)
    hit.request(view((SYS, 2048)), [], 0)
    assert hit.request(view((SYS, 2048)), [], 5 * MIN) == Usage(0, 2048, 0, 0)
    miss = AutomaticCache(min_tokens=1024, step=128, retention_ms=5 * MIN)
    miss.request(view((SYS, 2048)), [], 0)
    assert miss.request(view((SYS, 2048)), [], 5 * MIN + SEC) == Usage(2048, 0, 0, 0)


def test_automatic_never_charges_writes_even_with_breakpoints() -> None:
    cache = AutomaticCache()
    v = view((SYS, 3000), (M[0], 2000))
    assert cache.request(v, [bp1h(0), bp5(1)], 0) == Usage(5000, 0, 0, 0)
    # 5,000 - 5,000 % 128 = 5,000 - 8 = 4,992 (39 x 128) read, 8 uncached.
    assert cache.request(v, [bp1h(0), bp5(1)], SEC) == Usage(8, 4992, 0, 0)


def test_automatic_hit_refreshes_shorter_prefixes() -> None:
    cache = AutomaticCache(min_tokens=1024, step=128, retention_ms=10 * MIN)
    a, b = (SYS, 1024), (M[0], 1024)
    cache.request(view(a, b), [], 0)
    assert cache.request(view(a, b, (M[1], 1024)), [], 8 * MIN) == Usage(1024, 2048, 0, 0)
    assert cache.request(view(a, (M[2], 1024)), [], 16 * MIN) == Usage(1024, 1024, 0, 0)


def test_automatic_expired_deep_prefix_falls_back_to_live_shorter() -> None:
    cache = AutomaticCache(min_tokens=1024, step=128, retention_ms=10 * MIN)
    a, b = (SYS, 1024), (M[0], 1024)
    cache.request(view(a, b), [], 0)
    assert cache.request(view(a, (M[1], 1024)), [], 8 * MIN) == Usage(1024, 1024, 0, 0)
    assert cache.request(view(a, b, (M[2], 1024)), [], 15 * MIN) == Usage(2048, 1024, 0, 0)


# --- for_provider -----------------------------------------------------------------------


def test_for_provider() -> None:
    anthropic = for_provider("anthropic", 4096)
    assert isinstance(anthropic, AnthropicCache) and anthropic.min_tokens == 4096
    openai = for_provider("openai", 4096)  # OpenAI's minimum is always 1,024
    assert isinstance(openai, AutomaticCache)
    assert (openai.min_tokens, openai.step) == (1024, 128)
    google = for_provider("google", 2048)
    assert isinstance(google, AutomaticCache)
    assert (google.min_tokens, google.step) == (2048, 1)
    with pytest.raises(ValueError, match="no cache model"):
        for_provider("mistral", 1024)


# --- Usage sums to the view -------------------------------------------------------------


def test_usage_sums_to_view_total_literal() -> None:
    cache = AnthropicCache(min_tokens=1024)
    v = view((SYS, 2000), (M[0], 500), (M[1], 30))
    # Only position 1 is marked: 2,500 written, the trailing 30 tokens uncached.
    usage = cache.request(v, [bp5(1)], 0)
    assert usage == Usage(30, 0, 2500, 0)
    assert usage.total == v.total == 2530


Step = tuple[list[tuple[int, int]], list[Breakpoint], int]


@st.composite
def _requests(draw: st.DrawFn) -> list[Step]:
    """A session of views that grow, get rewritten at a random point, or shrink."""
    items: list[tuple[int, int]] = []
    now = 0
    fresh = iter(range(1, 10**6))
    out: list[Step] = []
    for _ in range(draw(st.integers(1, 8))):
        keep = draw(st.integers(0, len(items)))
        items = items[:keep]
        for _ in range(draw(st.integers(0 if items else 1, 25))):
            items.append((next(fresh), draw(st.integers(0, 1500))))
        n_bp = draw(st.integers(0, 4))
        positions = sorted(draw(st.lists(st.integers(0, len(items) - 1), max_size=n_bp)))
        # Valid markers only: longer TTLs first, as the API requires.
        ttls = sorted(
            (draw(st.sampled_from([FIVE_MINUTES, ONE_HOUR])) for _ in positions), reverse=True
        )
        bps = [Breakpoint(p, t) for p, t in zip(positions, ttls, strict=True)]
        now += draw(st.integers(0, 2 * ONE_HOUR))
        out.append((list(items), bps, now))
    return out


@pytest.mark.parametrize("make", [AnthropicCache, AutomaticCache], ids=["anthropic", "auto"])
@settings(max_examples=100, deadline=None)
@given(session=_requests())
def test_usage_sums_to_view_total(make: type[PromptCache], session: list[Step]) -> None:
    cache = make()
    for items, bps, now in session:
        v = view(*items)
        usage = cache.request(v, bps, now)
        assert usage.total == v.total
        assert min(usage.uncached, usage.cache_read, usage.cache_write_5m) >= 0
        assert usage.cache_write_1h >= 0
        assert usage.cache_read <= v.total
