"""SessionBuilder: token anchoring, output fallback and hashing, on hand-computed cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.model import NEVER, Flag, Kind, Role
from traces.builder import Hasher, RecordedUsage, SessionBuilder, _distribute


def _usage(context: int, output: int = 10) -> RecordedUsage:
    return RecordedUsage(
        input=context, cache_read=0, cache_write_5m=0, cache_write_1h=0, output=output
    )


def _builder() -> SessionBuilder:
    return SessionBuilder(Hasher(b"k"), id="s", kind="main")


def _block(b: SessionBuilder, k: int, kind: Kind, tokens: int, origin: int = -1) -> int:
    role = Role.ASSISTANT if origin >= 0 else Role.USER
    return b.add_block(
        msg=k,
        kind=kind,
        role=role,
        text=f"{kind}-{k}-{tokens}",
        ts=k,
        first_request=k,
        tokens=tokens,
        origin=origin,
    )


def test_distribute_is_proportional_with_largest_remainder() -> None:
    assert _distribute(10, np.array([1, 1, 1])).tolist() == [4, 3, 3]
    assert _distribute(300, np.array([50, 150])).tolist() == [75, 225]
    assert _distribute(5, np.array([0, 0])).tolist() == [3, 2]
    assert _distribute(0, np.array([7])).tolist() == [0]


@given(st.integers(0, 10**7), st.lists(st.integers(0, 10**5), min_size=1, max_size=50))
@settings(max_examples=200, deadline=None)
def test_distribute_sums_exactly_and_never_negative(total: int, weights: list[int]) -> None:
    out = _distribute(total, np.array(weights, dtype=np.int64))
    assert int(out.sum()) == total
    assert (out >= 0).all()


def test_anchoring_prefix_growth_and_injection() -> None:
    b = _builder()
    _block(b, 0, Kind.TEXT, 100)
    b.add_request(ts=0, model="m", usage=_usage(1000))
    _block(b, 1, Kind.TEXT, 50, origin=0)
    _block(b, 1, Kind.TOOL_RESULT, 150)
    b.add_request(ts=1, model="m", usage=_usage(1300))
    b.add_request(ts=2, model="m", usage=_usage(1500))  # grew with nothing logged
    s = b.finish()
    assert s.prefix_tokens == 900
    assert s.blocks["tokens"].tolist() == [100, 75, 225, 200]
    assert s.blocks["kind"][3] == Kind.INJECTED and s.blocks["first_request"][3] == 2
    for k, expected in enumerate([1000, 1300, 1500]):
        view = s.view_mask(k, as_recorded=True)
        assert int(s.blocks["tokens"][view].sum()) + s.prefix_tokens == expected


def test_a_leaving_block_takes_its_shortfall_from_partners() -> None:
    """Thinking dropped at a new turn carried too little: tokens move onto it from the text
    of the same response, so every request still reproduces its recorded size."""
    b = _builder()
    _block(b, 0, Kind.TEXT, 100)
    b.add_request(ts=0, model="m", usage=_usage(1000))
    thinking = _block(b, 1, Kind.THINKING, 10, origin=0)
    _block(b, 1, Kind.TEXT, 90, origin=0)
    b.add_request(ts=1, model="m", usage=_usage(1400))
    b.hide(thinking, 2)
    _block(b, 2, Kind.TEXT, 50)
    b.add_request(ts=2, model="m", usage=_usage(1350))
    s = b.finish()
    assert s.blocks["tokens"].tolist() == [100, 100, 300, 50]
    for k, expected in enumerate([1000, 1400, 1350]):
        view = s.view_mask(k, as_recorded=True)
        assert int(s.blocks["tokens"][view].sum()) + s.prefix_tokens == expected


def test_implausible_output_falls_back_to_the_tokenizer() -> None:
    b = _builder()
    _block(b, 0, Kind.TEXT, 10)
    b.add_request(ts=0, model="m", usage=_usage(100, output=4))
    b.add_request(ts=1, model="m", usage=_usage(300, output=80))
    _block(b, 1, Kind.TEXT, 100, origin=0)
    _block(b, 2, Kind.TEXT, 100, origin=1)
    s = b.finish()
    assert s.requests["output_recorded"].tolist() == [4, 80]
    assert s.requests["output"].tolist() == [100, 80]


def test_view_masks_follow_tombstones_and_compaction() -> None:
    b = _builder()
    a = _block(b, 0, Kind.TEXT, 10)
    c = _block(b, 1, Kind.TEXT, 10)
    summary = b.add_block(
        msg=2,
        kind=Kind.SUMMARY,
        role=Role.USER,
        text="s",
        ts=2,
        first_request=2,
        flags=Flag.ARTIFACT,
        tokens=5,
    )
    b.compact_away(a, 2)
    b.compact_away(c, 2)
    b.hide(c, 3)
    for k in range(4):
        b.add_request(ts=k, model="m", usage=None)
    s = b.finish()
    assert s.blocks["compacted_at"][a] == 2 and s.blocks["hidden_from"][a] == NEVER
    assert s.view_mask(2).tolist() == [True, True, False]
    assert s.view_mask(2, as_recorded=True).tolist() == [False, False, True]
    assert s.view_mask(3).tolist() == [True, False, False]
    assert summary == 2


def test_keyed_hashes_differ_by_key_and_are_stable() -> None:
    assert Hasher(b"a").hash("x") == Hasher(b"a").hash("x")
    assert Hasher(b"a").hash("x") != Hasher(b"b").hash("x")
    assert Hasher(b"a").hash("ab", "c") != Hasher(b"a").hash("a", "bc")
