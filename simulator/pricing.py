"""Dollars per API request, from the `genai-prices` price table.

Prices are never written by hand here: every rate comes from the table bundled with the
installed `genai-prices` wheel, and the tests check our fast path against its `calc_price`.

Usage convention (established by experiment against genai-prices 0.2.3, pinned by
tests/simulator/test_pricing.py so an upgrade that changes it fails loudly):

- genai-prices' ``input_tokens`` is the WHOLE prompt: uncached + cache read + all cache
  writes. Anthropic's ``input_tokens`` (our ``input`` column) is only the uncached part, so
  ``input_tokens = input + cache_read + cache_write_5m + cache_write_1h``. Giving it less than
  its cached parts raises ("cache_read_tokens (2000) cannot exceed input_tokens (1000)").
- ``cache_write_tokens`` is ALL cache writes, 5-minute AND 1-hour. ``cache_write_1h_tokens`` is
  the 1-hour part, a subset of it: genai-prices bills ``cache_write_tokens -
  cache_write_1h_tokens`` at ``cache_write_mtok`` (Anthropic's 5-minute rate, 1.25x input) and
  ``cache_write_1h_tokens`` at ``cache_write_1h_mtok`` (2x input). Reporting the 1-hour tokens
  only in ``cache_write_1h_tokens`` raises "Missing usage for cache_write_tokens". Reporting
  ``cache_write_tokens`` as the 5-minute part alone raises when the 1-hour part is larger
  ("cache_write_1h_tokens (400) cannot exceed cache_write_tokens (300)") and otherwise is
  silently wrong: as many 5-minute tokens as there are 1-hour tokens get billed as uncached
  input (genai-prices subtracts the 1-hour tokens from the 5-minute leaf).
- ``cache_write_5m_tokens`` exists (a subset of ``cache_write_tokens`` too), but no model in the
  bundled table prices ``cache_write_5m_mtok``: it is accepted and, for every current model,
  ignored. It also raises when given without ``cache_write_tokens``. We pass it anyway (equal
  to the 5-minute count) so that a future table pricing it explicitly still gets it right.
- A component a model does not price falls back to its nearest priced ancestor unit: cache
  writes on OpenAI and Gemini models (no write fee) are billed as plain input, and a 1-hour
  write on a model without a 1-hour rate is billed at its plain cache-write rate.
- Tiered prices (``TieredPrices``, e.g. Sonnet 4.5 above 200,000 tokens) pick the rate by the
  request's total input (genai ``input_tokens``, cached tokens included), strictly greater
  than the tier start, and apply it to ALL tokens of every tiered unit of that request,
  output included. Exactly 200,000 input tokens is still the base tier.

Determinism: prices depend on the request date in genai-prices (conditional prices, e.g.
Sonnet 4.6 dropped its long-context tier on 2026-03-13; DeepSeek off-peak hours). A PriceBook
never reads the wall clock: it prices every request as of one fixed instant, ``as_of``
(default ``LATEST``: the newest prices the installed table knows, at noon UTC). It never
touches the network either: genai-prices can auto-update its table from GitHub in a
background thread (``UpdatePrices``); we never start it, and we do not even read through
``get_snapshot()`` (which would return an auto-updated table if other code in the process
started one): the PriceBook builds its own snapshot from the data bundled in the wheel.

genai-prices is imported at the first price looked up, not with this module: its data and
types take 0.19 s of CPU to import alone (0.07 s beyond the pydantic the policies'
parameters import anyway), which a sweep's main process paid though it prices nothing
(issue 16; tests/simulator/app/test_startup.py). A PriceBook made without `provider_id`
builds its snapshot at its first lookup; the rates and dollars are the same. A sweep's fork
server imports the table once for all its workers (simulator/app/sweep.py `_preload`).
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import version as _package_version
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from genai_prices import Usage
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelInfo, ModelPrice, Provider, TieredPrices

F64 = npt.NDArray[np.float64]

#: The model Claude Code writes on client-made error lines; it has no usage and no price.
SYNTHETIC = "<synthetic>"

#: Default pricing instant: far enough ahead that every dated price change in the installed
#: table is in force (the newest prices it knows), at noon UTC (outside off-peak windows).
LATEST = datetime(9999, 12, 31, 12, 0, tzinfo=UTC)

#: Cost components, in the order of the request columns.
COMPONENTS: tuple[str, ...] = (
    "uncached_input",
    "cache_read",
    "cache_write_5m",
    "cache_write_1h",
    "output",
)

# For each component, the genai-prices price keys that can bill it, most specific first
# (the leaf-resolution order of genai-prices' unit tree, see the module docstring).
_PRICE_CHAIN: dict[str, tuple[str, ...]] = {
    "uncached_input": ("input_mtok",),
    "cache_read": ("cache_read_mtok", "input_mtok"),
    "cache_write_5m": ("cache_write_5m_mtok", "cache_write_mtok", "input_mtok"),
    "cache_write_1h": ("cache_write_1h_mtok", "cache_write_mtok", "input_mtok"),
    "output": ("output_mtok",),
}

_PER_TOKEN = Decimal(1_000_000)  # genai-prices token prices are per million tokens
_REL_TOLERANCE = 1e-9


class UnknownModelError(LookupError):
    """A model string the price table cannot price (with close names as a hint)."""

    def __init__(self, model: str, suggestions: Sequence[str] = (), provider_id: str | None = None):
        self.model = model
        self.suggestions = tuple(suggestions)
        self.provider_id = provider_id
        where = f" for provider {provider_id!r}" if provider_id else ""
        message = f"no price for model {model!r}{where} in genai-prices {_genai_version()}"
        if self.suggestions:
            message += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        # sweeps run in worker processes: the error must cross a pickle intact
        return (UnknownModelError, (self.model, self.suggestions, self.provider_id))


class UnsupportedPricingError(ValueError):
    """The model's price has a part our five components cannot express (e.g. a per-request
    fee): refusing is better than silently disagreeing with genai-prices' total."""


@dataclass(frozen=True)
class Cost:
    """Dollars of one request (or a sum of requests), split by what the tokens were."""

    uncached_input: float = 0.0
    cache_read: float = 0.0
    cache_write_5m: float = 0.0
    cache_write_1h: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.uncached_input
            + self.cache_read
            + self.cache_write_5m
            + self.cache_write_1h
            + self.output
        )

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            self.uncached_input + other.uncached_input,
            self.cache_read + other.cache_read,
            self.cache_write_5m + other.cache_write_5m,
            self.cache_write_1h + other.cache_write_1h,
            self.output + other.output,
        )

    def __radd__(self, other: object) -> Cost:
        # sum(costs) starts from the int 0
        if other == 0:
            return self
        return NotImplemented

    def as_dict(self) -> dict[str, float]:
        """Components plus total, keyed by name (for rows and JSON)."""
        out = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        out["total"] = float(self.total)
        return out


@dataclass(frozen=True)
class ModelRates:
    """One model's resolved rates, cached so that pricing is plain float arithmetic.

    Band ``b`` applies when the request's total input exceeds ``thresholds[b-1]`` (and not
    ``thresholds[b]``); ``per_token[b]`` holds dollars per token for each of COMPONENTS.
    """

    model: str  # the string asked for
    model_id: str  # genai-prices' model id
    provider_id: str
    thresholds: tuple[int, ...]
    per_token: tuple[tuple[float, float, float, float, float], ...]
    #: Per-million-token rates as Decimals from the table, same shape as per_token.
    per_mtok: tuple[tuple[Decimal, Decimal, Decimal, Decimal, Decimal], ...]

    def band(self, total_input: int) -> int:
        """Tier band of a request whose whole prompt (cached included) is total_input."""
        return bisect.bisect_left(self.thresholds, total_input)


def to_genai_usage(
    input: int, cache_read: int, cache_write_5m: int, cache_write_1h: int, output: int
) -> Usage:
    """Anthropic-style counts (input excludes cached tokens) as a genai-prices Usage."""
    from genai_prices import Usage

    return Usage(
        input_tokens=input + cache_read + cache_write_5m + cache_write_1h,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write_5m + cache_write_1h,
        cache_write_5m_tokens=cache_write_5m,
        cache_write_1h_tokens=cache_write_1h,
        output_tokens=output,
    )


class PriceBook:
    """Prices requests by model, deterministically and offline (see the module docstring).

    ``provider_id`` forces one genai-prices provider (e.g. "anthropic", "openai", "google");
    by default the provider is inferred from the model name. ``as_of`` is the single instant
    every request is priced at.
    """

    def __init__(self, provider_id: str | None = None, *, as_of: datetime = LATEST) -> None:
        if as_of.tzinfo is None:
            raise ValueError("as_of must be timezone-aware (prices switch at UTC dates)")
        self.provider_id = provider_id
        self.as_of = as_of
        self._table: DataSnapshot | None = None
        if provider_id is not None:
            try:
                self._snapshot.find_provider(None, provider_id, None)
            except LookupError as exc:
                raise ValueError(f"unknown genai-prices provider {provider_id!r}") from exc
        self._rates: dict[str, ModelRates | None] = {SYNTHETIC: None}

    @property
    def _snapshot(self) -> DataSnapshot:
        """Our own snapshot of the bundled table, built at its first use: never the
        auto-updated one, never the clock (its timestamp only matters for auto-updated
        snapshots; we pin it anyway)."""
        if self._table is None:
            from genai_prices.data_snapshot import DataSnapshot

            self._table = DataSnapshot(
                providers=_bundled_providers(), from_auto_update=False, timestamp=self.as_of
            )
        return self._table

    @property
    def version(self) -> str:
        """What to record in a run manifest so the dollars can be reproduced."""
        return f"genai-prices {_genai_version()} as of {self.as_of.isoformat()}"

    # -- model lookup -------------------------------------------------------------------

    def rates(self, model: str) -> ModelRates | None:
        """The cached rates of `model`; None for `<synthetic>`, which is never priced."""
        try:
            return self._rates[model]
        except KeyError:
            pass
        rates = self._load(model)
        self._rates[model] = rates
        return rates

    def _find(self, model: str) -> tuple[Provider, ModelInfo]:
        try:
            return self._snapshot.find_provider_model(model, None, self.provider_id, None)
        except LookupError:
            raise UnknownModelError(model, self._suggest(model), self.provider_id) from None

    def _load(self, model: str) -> ModelRates:
        provider, info = self._find(model)
        from genai_prices.types import TieredPrices

        price = info.get_prices(self.as_of)
        chosen = [_first_price(price, _PRICE_CHAIN[c]) for c in COMPONENTS]
        if chosen[0] is None or chosen[4] is None:
            raise UnsupportedPricingError(
                f"{model!r} ({info.id}) has no input or output token price"
            )
        thresholds = sorted(
            {t.start for p in chosen if isinstance(p, TieredPrices) for t in p.tiers}
        )
        per_mtok: list[tuple[Decimal, Decimal, Decimal, Decimal, Decimal]] = []
        for band in range(len(thresholds) + 1):
            representative = 0 if band == 0 else thresholds[band - 1] + 1
            a, b, c, d, e = (_applicable(p, representative) for p in chosen)
            per_mtok.append((a, b, c, d, e))
        per_token = tuple(
            (
                float(a / _PER_TOKEN),
                float(b / _PER_TOKEN),
                float(c / _PER_TOKEN),
                float(d / _PER_TOKEN),
                float(e / _PER_TOKEN),
            )
            for a, b, c, d, e in per_mtok
        )
        rates = ModelRates(
            model=model,
            model_id=info.id,
            provider_id=provider.id,
            thresholds=tuple(thresholds),
            per_token=per_token,
            per_mtok=tuple(per_mtok),
        )
        self._self_check(rates)
        return rates

    def _self_check(self, rates: ModelRates) -> None:
        """Price one probe request per tier band both ways; refuse the model if they differ.

        This catches price parts outside our five components (per-request fees, ...) once per
        model instead of letting totals drift from genai-prices.
        """
        bounds = [0, *rates.thresholds]
        for band, low in enumerate(bounds):
            total = rates.thresholds[0] if band == 0 and rates.thresholds else low + 7_919
            total = max(total, 100)
            cr, w5, w1 = total * 2 // 5, total // 10, total * 3 // 20
            counts = (total - cr - w5 - w1, cr, w5, w1, 3_331)
            ours = _cost(rates.per_token[rates.band(total)], *counts).total
            ref = float(self._reference(rates.model, *counts))
            if abs(ours - ref) > _REL_TOLERANCE * max(abs(ref), 1e-12):
                raise UnsupportedPricingError(
                    f"{rates.model!r} ({rates.model_id}): genai-prices charges {ref!r} for "
                    f"{counts} but the five-component split gives {ours!r}; its price has a "
                    "part ctxsim does not model"
                )

    def _suggest(self, model: str) -> list[str]:
        names = sorted(
            {m.id for p in self._candidate_providers() for m in p.models},
        )
        query = model.lower()
        close = difflib.get_close_matches(query, names, n=3, cutoff=0.6)
        if not close:
            close = [n for n in names if query and query in n][:3]
        return close

    def _candidate_providers(self) -> list[Provider]:
        bundled = _bundled_providers()
        if self.provider_id is None:
            return list(bundled)
        provider = self._snapshot.find_provider(None, self.provider_id, None)
        extra = [p for p in bundled if p.id in (provider.fallback_model_providers or [])]
        return [provider, *extra]

    # -- pricing ------------------------------------------------------------------------

    def price(
        self,
        model: str,
        input: int,
        cache_read: int,
        cache_write_5m: int,
        cache_write_1h: int,
        output: int,
    ) -> Cost:
        """Dollars of one request from Anthropic-style counts (input excludes cached tokens)."""
        try:
            rates = self._rates[model]
        except KeyError:
            rates = self.rates(model)
        counts = (
            int(input),
            int(cache_read),
            int(cache_write_5m),
            int(cache_write_1h),
            int(output),
        )
        if min(counts) < 0:
            raise ValueError(f"negative token count in {counts}")
        if rates is None:
            if any(counts):
                raise ValueError(f"{SYNTHETIC} requests have no usage, got {counts}")
            return Cost()
        total_input = counts[0] + counts[1] + counts[2] + counts[3]
        band = bisect.bisect_left(rates.thresholds, total_input) if rates.thresholds else 0
        return _cost(rates.per_token[band], *counts)

    def reference(
        self,
        model: str,
        input: int,
        cache_read: int,
        cache_write_5m: int,
        cache_write_1h: int,
        output: int,
    ) -> Decimal:
        """genai-prices' own total for the request (slow; for checks, not for sweeps)."""
        if model == SYNTHETIC:
            return Decimal(0)
        self._find(model)  # the same UnknownModelError as price()
        return self._reference(model, input, cache_read, cache_write_5m, cache_write_1h, output)

    def _reference(self, model: str, *counts: int) -> Decimal:
        usage = to_genai_usage(*counts)
        calc = self._snapshot.calc(usage, model, self.provider_id, None, self.as_of)
        total: Decimal = calc.total_price
        return total

    def price_columns(
        self,
        model_ids: Sequence[str],
        model_index: npt.NDArray[Any],
        input: npt.NDArray[Any],
        cache_read: npt.NDArray[Any],
        cw5m: npt.NDArray[Any],
        cw1h: npt.NDArray[Any],
        output: npt.NDArray[Any],
    ) -> dict[str, F64]:
        """Per-request dollars per component (and "total") for whole request columns.

        ``model_index[i]`` indexes ``model_ids`` (a Session's ``models``). Only models that
        actually occur are looked up. Results equal ``price()`` bit for bit.
        """
        idx = np.asarray(model_index)
        counts = [np.asarray(a) for a in (input, cache_read, cw5m, cw1h, output)]
        n = len(idx)
        if any(len(a) != n for a in counts):
            raise ValueError("price_columns: columns of unequal length")
        if any(a.size and int(a.min()) < 0 for a in counts):
            raise ValueError("price_columns: negative token count")
        as_float = [a.astype(np.float64) for a in counts]
        out = {c: np.zeros(n, dtype=np.float64) for c in COMPONENTS}
        total_input = counts[0].astype(np.int64) + counts[1] + counts[2] + counts[3]
        for m in np.unique(idx):
            if not 0 <= m < len(model_ids):
                raise IndexError(f"model index {m} outside model_ids (length {len(model_ids)})")
            rows = np.flatnonzero(idx == m)
            rates = self.rates(model_ids[m])
            if rates is None:
                if any(a[rows].any() for a in counts):
                    raise ValueError(f"{SYNTHETIC} requests have no usage")
                continue
            table = np.asarray(rates.per_token, dtype=np.float64)  # (bands, components)
            band = np.searchsorted(np.asarray(rates.thresholds, dtype=np.int64), total_input[rows])
            per = table[band]
            for j, c in enumerate(COMPONENTS):
                out[c][rows] = as_float[j][rows] * per[:, j]
        out["total"] = (
            out["uncached_input"]
            + out["cache_read"]
            + out["cache_write_5m"]
            + out["cache_write_1h"]
            + out["output"]
        )
        return out


def _cost(per_token: tuple[float, float, float, float, float], *counts: int) -> Cost:
    a, b, c, d, e = counts
    return Cost(
        a * per_token[0],
        b * per_token[1],
        c * per_token[2],
        d * per_token[3],
        e * per_token[4],
    )


def _first_price(price: ModelPrice, keys: tuple[str, ...]) -> Decimal | TieredPrices | None:
    from genai_prices.types import TieredPrices

    for key in keys:
        value = getattr(price, key, None)
        if value is not None:
            assert isinstance(value, Decimal | TieredPrices)
            return value
    return None


def _applicable(price: Decimal | TieredPrices | None, total_input: int) -> Decimal:
    """The per-MTok rate in force for a request of total_input (genai-prices' cliff rule)."""
    if price is None:
        return Decimal(0)
    if isinstance(price, Decimal):
        return price
    rate = price.base
    for tier in reversed(price.tiers):
        if total_input > tier.start:
            return tier.price
    return rate


def _bundled_providers() -> list[Provider]:
    """The price table bundled in the installed genai-prices wheel (imported on first use)."""
    from genai_prices.data import providers

    return providers


def _genai_version() -> str:
    return _package_version("genai-prices")
