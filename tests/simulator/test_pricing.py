"""Prices: hand-computed dollars, the Anthropic -> genai-prices conversion, tiers, speed path.

Rates used below, read from the genai-prices 0.2.3 bundled table (dollars per million tokens):
- claude-sonnet-4-5: input 3, cache read 0.30, cache write 5m 3.75, cache write 1h 6,
  output 15; above 200,000 total input tokens: 6, 0.60, 7.50, 12, 22.50 (on ALL tokens).
- claude-haiku-4-5: input 1, cache read 0.10, write 5m 1.25, write 1h 2, output 5.
- gpt-5-codex (priced as genai-prices' "gpt-5"): input 1.25, cached input 0.125, output 10,
  no cache-write price (writes are plain input).
- gemini-2.5-pro: input 1.25, cache read 0.125, output 10; above 200,000: 2.50, 0.25, 15.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pytest
from genai_prices import Usage, calc_price

from simulator.pricing import (
    COMPONENTS,
    LATEST,
    SYNTHETIC,
    Cost,
    PriceBook,
    UnknownModelError,
    UnsupportedPricingError,
    to_genai_usage,
)

SONNET = "claude-sonnet-4-5-20250929"


@pytest.fixture(scope="module")
def book() -> PriceBook:
    return PriceBook()


def ref_total(model: str, *counts: int) -> Decimal:
    """genai-prices' public calc_price on our explicit conversion, at the book's fixed instant."""
    total: Decimal = calc_price(
        to_genai_usage(*counts), model, genai_request_timestamp=LATEST
    ).total_price
    return total


def sonnet_calc(usage: Usage) -> Decimal:
    """genai-prices' total for a raw genai Usage on Sonnet 4.5."""
    total: Decimal = calc_price(usage, SONNET, genai_request_timestamp=LATEST).total_price
    return total


# -- hand-computed dollars ---------------------------------------------------------------


def test_sonnet_45_components_by_hand(book: PriceBook) -> None:
    cost = book.price(SONNET, 1_000, 2_000, 300, 400, 50)
    assert cost.uncached_input == pytest.approx(1_000 * 3 / 1e6)  # 0.003
    assert cost.cache_read == pytest.approx(2_000 * 0.30 / 1e6)  # 0.0006
    assert cost.cache_write_5m == pytest.approx(300 * 3.75 / 1e6)  # 0.001125
    assert cost.cache_write_1h == pytest.approx(400 * 6 / 1e6)  # 0.0024
    assert cost.output == pytest.approx(50 * 15 / 1e6)  # 0.00075
    assert cost.total == pytest.approx(0.007875, rel=1e-12)
    assert ref_total(SONNET, 1_000, 2_000, 300, 400, 50) == Decimal("0.007875")


def test_rates_read_from_table(book: PriceBook) -> None:
    rates = book.rates(SONNET)
    assert rates is not None
    assert (rates.model_id, rates.provider_id, rates.thresholds) == (
        "claude-sonnet-4-5",
        "anthropic",
        (200_000,),
    )
    base, long = rates.per_mtok
    assert base == tuple(Decimal(x) for x in ("3", "0.3", "3.75", "6", "15"))
    assert long == tuple(Decimal(x) for x in ("6", "0.6", "7.5", "12", "22.5"))


def test_haiku_45_by_hand(book: PriceBook) -> None:
    cost = book.price("claude-haiku-4-5-20251001", 10, 5_000, 0, 2_000, 100)
    # 10*1 + 5000*0.1 + 2000*2 + 100*5 = 10 + 500 + 4000 + 500 = 5010 $/MTok-units
    assert cost.total == pytest.approx(0.00501, rel=1e-12)


# -- the Anthropic -> genai-prices convention ----------------------------------------------


def test_conversion_to_genai_usage() -> None:
    usage = to_genai_usage(1_000, 2_000, 300, 400, 50)
    assert usage == Usage(
        input_tokens=3_700,  # genai input INCLUDES cache reads and all cache writes
        cache_read_tokens=2_000,
        cache_write_tokens=700,  # 5m + 1h
        cache_write_5m_tokens=300,
        cache_write_1h_tokens=400,
        output_tokens=50,
    )


def test_genai_key_convention_is_what_the_docstring_says() -> None:
    """Pin the experiment behind the conversion, so a genai-prices change fails here."""
    assert sonnet_calc(to_genai_usage(1_000, 2_000, 300, 400, 50)) == Decimal("0.007875")
    # Anthropic's input_tokens passed as-is: cached parts exceed the (uncached) input
    with pytest.raises(ValueError, match="cannot exceed input_tokens"):
        sonnet_calc(Usage(input_tokens=1_000, cache_read_tokens=2_000))
    # the 1-hour part alone, without cache_write_tokens: refused
    with pytest.raises(ValueError, match="require explicit cache_write_tokens"):
        sonnet_calc(Usage(input_tokens=1_400, cache_write_1h_tokens=400))
    # cache_write_tokens holding only the 5-minute part: refused when the 1-hour part is
    # larger (400 > 300 here) ...
    with pytest.raises(ValueError, match="cannot exceed cache_write_tokens"):
        sonnet_calc(Usage(input_tokens=3_700, cache_write_tokens=300, cache_write_1h_tokens=400))
    # ... and otherwise silently wrong: with 500 5m + 400 1h, 400 of the 5-minute tokens are
    # billed as uncached input ($3) instead of 5-minute writes ($3.75)
    right = sonnet_calc(to_genai_usage(1_000, 2_000, 500, 400, 50))
    wrong = sonnet_calc(
        Usage(
            input_tokens=3_900,
            cache_read_tokens=2_000,
            cache_write_tokens=500,
            cache_write_1h_tokens=400,
            output_tokens=50,
        )
    )
    assert wrong == right - Decimal(400) * (Decimal("3.75") - Decimal("3")) / 1_000_000
    # cache_write_5m_tokens is not priced by any Anthropic model: giving it changes nothing
    without_5m = Usage(
        input_tokens=3_900,
        cache_read_tokens=2_000,
        cache_write_tokens=900,
        cache_write_1h_tokens=400,
        output_tokens=50,
    )
    assert sonnet_calc(without_5m) == right


# -- long-context tier -------------------------------------------------------------------


def test_long_context_tier_switches_on_total_input(book: PriceBook) -> None:
    # exactly 200,000 total input (20,000 uncached): still the base tier
    below = book.price(SONNET, 20_000, 150_000, 20_000, 10_000, 1_000)
    # 20,000*3 + 150,000*0.3 + 20,000*3.75 + 10,000*6 + 1,000*15 = 255,000 -> $0.255
    assert below.total == pytest.approx(0.255, rel=1e-12)
    # one more uncached token: 200,001 > 200,000, so EVERY token moves to the long tier,
    # though only 20,001 of them are uncached
    above = book.price(SONNET, 20_001, 150_000, 20_000, 10_000, 1_000)
    assert above.uncached_input == pytest.approx(20_001 * 6 / 1e6)
    assert above.cache_read == pytest.approx(150_000 * 0.6 / 1e6)
    assert above.cache_write_5m == pytest.approx(20_000 * 7.5 / 1e6)
    assert above.cache_write_1h == pytest.approx(10_000 * 12 / 1e6)
    assert above.output == pytest.approx(1_000 * 22.5 / 1e6)
    assert above.total == pytest.approx(0.502506, rel=1e-12)
    assert float(ref_total(SONNET, 20_000, 150_000, 20_000, 10_000, 1_000)) == pytest.approx(
        0.255, rel=1e-12
    )
    assert float(ref_total(SONNET, 20_001, 150_000, 20_000, 10_000, 1_000)) == pytest.approx(
        0.502506, rel=1e-12
    )


def test_gemini_tier(book: PriceBook) -> None:
    below = book.price("gemini-2.5-pro", 200_000, 0, 0, 0, 1_000)
    above = book.price("gemini-2.5-pro", 200_001, 0, 0, 0, 1_000)
    assert below.total == pytest.approx((200_000 * 1.25 + 1_000 * 10) / 1e6)
    assert above.total == pytest.approx((200_001 * 2.5 + 1_000 * 15) / 1e6)


# -- OpenAI ------------------------------------------------------------------------------


def test_gpt5_codex_has_no_write_fee(book: PriceBook) -> None:
    rates = book.rates("gpt-5-codex")
    assert rates is not None
    assert (rates.provider_id, rates.model_id, rates.thresholds) == ("openai", "gpt-5", ())
    cost = book.price("gpt-5-codex", 1_000, 2_000, 300, 0, 50)
    assert cost.uncached_input == pytest.approx(1_000 * 1.25 / 1e6)  # 0.00125
    assert cost.cache_read == pytest.approx(2_000 * 0.125 / 1e6)  # 0.00025
    assert cost.cache_write_5m == pytest.approx(300 * 1.25 / 1e6)  # billed as plain input
    assert cost.output == pytest.approx(50 * 10 / 1e6)  # 0.0005
    assert cost.total == pytest.approx(0.002375, rel=1e-12)
    assert ref_total("gpt-5-codex", 1_000, 2_000, 300, 0, 50) == Decimal("0.002375")


# -- the fast path equals calc_price -----------------------------------------------------

MODELS = [
    SONNET,
    "claude-sonnet-4-20250514",
    "claude-opus-4-5-20251101",
    "claude-opus-4-20250514",
    "claude-haiku-4-5-20251001",
    "claude-haiku-5-5",  # tier at 100,000
    "gpt-5-codex",
    "gemini-2.5-pro",
]


def random_usages(rng: np.random.Generator, n: int) -> list[tuple[int, int, int, int, int]]:
    out = []
    for _ in range(n):
        scale = int(rng.choice([100, 10_000, 120_000]))
        out.append(
            (
                int(rng.integers(0, scale)),
                int(rng.integers(0, 3 * scale)),
                int(rng.integers(0, scale)) * int(rng.integers(0, 2)),
                int(rng.integers(0, scale)) * int(rng.integers(0, 2)),
                int(rng.integers(0, 30_000)),
            )
        )
    # around every tier start seen in MODELS
    for start in (100_000, 200_000):
        for total in (start - 1, start, start + 1):
            out.append((total - 60_000, 50_000, 6_000, 4_000, 777))
    out.append((0, 0, 0, 0, 0))
    return out


@pytest.mark.parametrize("model", MODELS)
def test_fast_path_matches_calc_price(book: PriceBook, model: str) -> None:
    rng = np.random.default_rng(20250929)
    for counts in random_usages(rng, 300):
        ours = book.price(model, *counts)
        parts = sum(getattr(ours, c) for c in COMPONENTS)
        assert ours.total == parts
        ref = float(ref_total(model, *counts))
        assert abs(ours.total - ref) <= 1e-9 * max(ref, 1e-300), (model, counts)


def test_vectorised_equals_scalar(book: PriceBook) -> None:
    rng = np.random.default_rng(7)
    model_ids = [SONNET, SYNTHETIC, "gpt-5-codex", "claude-haiku-5-5"]
    n = 5_000
    idx = rng.integers(0, len(model_ids), n).astype(np.int32)
    cols = [
        rng.integers(0, hi, n).astype(np.int64) for hi in (80_000, 250_000, 40_000, 40_000, 9_000)
    ]
    synthetic = idx == 1
    for c in cols:
        c[synthetic] = 0
    got = book.price_columns(model_ids, idx, *cols)
    assert set(got) == {*COMPONENTS, "total"}
    for i in range(n):
        cost = book.price(model_ids[idx[i]], *(int(c[i]) for c in cols))
        for name in COMPONENTS:
            assert got[name][i] == getattr(cost, name)
        assert got["total"][i] == cost.total
    assert (got["total"][synthetic] == 0).all()
    assert (got["total"][~synthetic] > 0).any()


def test_vectorised_empty(book: PriceBook) -> None:
    empty = np.zeros(0, dtype=np.int64)
    got = book.price_columns([SONNET], empty.astype(np.int32), *(empty,) * 5)
    assert all(len(v) == 0 for v in got.values())


# -- errors, synthetic, determinism ------------------------------------------------------


def test_unknown_model_hints(book: PriceBook) -> None:
    with pytest.raises(UnknownModelError, match="did you mean 'claude-sonnet-4-5'") as info:
        book.price("claude-sonet-4-5", 1, 0, 0, 0, 1)
    assert info.value.model == "claude-sonet-4-5"
    assert isinstance(info.value, LookupError)
    again = pickle.loads(pickle.dumps(info.value))  # crosses process-pool boundaries
    assert (again.model, str(again)) == (info.value.model, str(info.value))
    with pytest.raises(UnknownModelError, match=r"gpt-4\.5-turbo"):
        book.price_columns(["gpt-4.5-turbo"], np.zeros(1, np.int32), *(np.ones(1, np.int64),) * 5)


def test_synthetic_is_never_priced(book: PriceBook) -> None:
    assert book.rates(SYNTHETIC) is None
    assert book.price(SYNTHETIC, 0, 0, 0, 0, 0) == Cost()
    with pytest.raises(ValueError, match="no usage"):
        book.price(SYNTHETIC, 10, 0, 0, 0, 0)


def test_per_request_fee_is_refused() -> None:
    # Perplexity's sonar charges a per-request fee: not one of our five components
    with pytest.raises(UnsupportedPricingError, match="sonar"):
        PriceBook("perplexity").price("sonar", 100, 0, 0, 0, 10)


def test_negative_counts_refused(book: PriceBook) -> None:
    with pytest.raises(ValueError, match="negative"):
        book.price(SONNET, -1, 0, 0, 0, 0)


def test_provider_override() -> None:
    openai = PriceBook("openai")
    assert openai.price("gpt-5-codex", 1_000_000, 0, 0, 0, 0).total == pytest.approx(1.25)
    with pytest.raises(UnknownModelError):
        openai.price(SONNET, 1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="unknown genai-prices provider"):
        PriceBook("no-such-provider")


def test_as_of_is_fixed_and_honoured() -> None:
    # Sonnet 4.6 lost its long-context tier on 2026-03-13: the date changes the price,
    # and a book prices every request at its one fixed instant
    early = PriceBook(as_of=datetime(2026, 1, 1, 12, tzinfo=UTC))
    late = PriceBook()
    assert early.price("claude-sonnet-4-6", 300_000, 0, 0, 0, 0).total == pytest.approx(1.8)
    assert late.price("claude-sonnet-4-6", 300_000, 0, 0, 0, 0).total == pytest.approx(0.9)
    assert "as of 9999-12-31" in late.version
    with pytest.raises(ValueError, match="timezone-aware"):
        PriceBook(as_of=datetime(2026, 1, 1))


def test_never_reads_an_auto_updated_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    import genai_prices.data_snapshot as snap

    def refuse() -> None:
        raise AssertionError("PriceBook must use the bundled table only")

    monkeypatch.setattr(snap, "get_snapshot", refuse)
    assert PriceBook().price(SONNET, 1_000, 2_000, 300, 400, 50).total == pytest.approx(0.007875)


def test_cost_addition() -> None:
    a = Cost(1.0, 2.0, 3.0, 4.0, 5.0)
    b = Cost(0.5, 0.25, 0.0, 1.0, 2.0)
    assert a + b == Cost(1.5, 2.25, 3.0, 5.0, 7.0)
    assert sum([a, b]) == a + b
    assert (a + b).total == pytest.approx(18.75)
    assert a.as_dict()["total"] == 15.0
