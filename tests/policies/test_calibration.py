"""The compaction-summary calibration: its API on hand-computed inputs, its constants against
the committed data, and the committed data against a fresh measurement of the real traces."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.calibration import summary as cal
from simulator.app.measure import calibration_measure

DATA = Path(cal.__file__).with_name("compactions.json")


def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text())
    return loaded


# -- the API ----------------------------------------------------------------------------


def test_without_rng_the_summary_is_the_fitted_median() -> None:
    assert round(math.exp(cal.SUMMARY_LOG_MU)) == cal.SUMMARY_MEDIAN
    assert cal.summary_tokens(167_000) == cal.SUMMARY_MEDIAN == 2_915


def test_summary_is_clipped_to_the_context_and_the_cap() -> None:
    assert cal.summary_tokens(1_000) == 1_000  # never longer than what it summarises
    assert cal.summary_tokens(0) == 0
    assert cal.summary_tokens(200_000, cap=2_000) == 2_000
    assert cal.summary_tokens(200_000, random.Random(3), cap=0) == 0
    with pytest.raises(ValueError):
        cal.summary_tokens(-1)
    with pytest.raises(ValueError):
        cal.summary_tokens(10, cap=-5)


def test_seeded_draw_is_the_lognormal_of_the_callers_rng() -> None:
    z = random.Random(11).normalvariate(0.0, 1.0)
    expected = round(math.exp(cal.SUMMARY_LOG_MU + cal.SUMMARY_LOG_SIGMA * z))
    assert cal.summary_tokens(500_000, random.Random(11)) == expected
    assert cal.summary_tokens(500_000, random.Random(11)) == cal.summary_tokens(
        500_000, random.Random(11)
    )


def test_draws_follow_the_fitted_distribution() -> None:
    rng = random.Random(2024)
    draws = [cal.summary_tokens(10**6, rng) for _ in range(4_000)]
    assert abs(statistics.median(draws) / cal.SUMMARY_MEDIAN - 1) < 0.02
    logs = [math.log(d) for d in draws]
    assert abs(statistics.stdev(logs) / cal.SUMMARY_LOG_SIGMA - 1) < 0.06
    restored = [cal.restored_tokens(rng) for _ in range(4_000)]
    assert abs(statistics.median(restored) / cal.RESTORED_MEDIAN - 1) < 0.05


def test_restored_tokens_median_and_seeded() -> None:
    assert round(math.exp(cal.RESTORED_LOG_MU)) == cal.RESTORED_MEDIAN
    assert cal.restored_tokens() == 18_960
    z = random.Random(5).normalvariate(0.0, 1.0)
    expected = round(math.exp(cal.RESTORED_LOG_MU + cal.RESTORED_LOG_SIGMA * z))
    assert cal.restored_tokens(random.Random(5)) == expected


def test_file_restore_rule_by_hand() -> None:
    # five most recent: 5,000 (cut) + 3,000 + 5,000 (cut) + 100 + 200; the sixth is ignored
    assert cal.file_restore_tokens([7_000, 3_000, 6_000, 100, 200, 9_000]) == 13_300
    assert cal.file_restore_tokens([]) == 0
    assert cal.file_restore_tokens([25_000, 25_000], per_file=20_000, budget=30_000) == 30_000
    assert cal.file_restore_tokens([1, 2, 3], max_files=2) == 3
    with pytest.raises(ValueError):
        cal.file_restore_tokens([10, -1])


def _sizes(blocks: list[tuple[int, int, int]], limit: int = 5) -> list[int]:
    """recent_file_sizes over (path, whole cl100k size or -1, shown tokens or -1) blocks,
    given oldest first."""
    path = [p for p, _, _ in blocks]
    whole = [w for _, w, _ in blocks]
    order = range(len(blocks) - 1, -1, -1)
    return cal.recent_file_sizes(order, path, whole, lambda i: blocks[i][2], limit)


def test_recent_file_sizes_by_hand() -> None:
    # Oldest first: path 1 read whole (1,000 cl100k), path 2 partly read (shows 300, no
    # whole size), path 1 edited (2,000 cl100k), a block with no path, path 3 written
    # (500 cl100k), path 4 touched without any size.
    blocks = [
        (1, 1_000, 1_200),
        (2, -1, 300),
        (1, 2_000, -1),
        (0, -1, -1),
        (3, 500, -1),
        (4, -1, -1),
    ]
    # Newest first: 4 (never sized: 0), 3 (500 x 1.207), 1 (its newest size, the edit's:
    # 2,000 x 1.207), 2 (what its Read showed: 300).
    assert _sizes(blocks) == [0, 604, 2_414, 300]
    assert _sizes(blocks, limit=2) == [0, 604]
    # A file's size is looked for further back than the `limit` newest files reach.
    assert _sizes([(1, 800, -1), (2, 100, -1), (1, -1, -1)], limit=1) == [966]
    assert _sizes([]) == []


@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(-1, 9_000), st.integers(-1, 9_000)),
        max_size=30,
    ),
    st.integers(0, 6),
)
def test_recent_file_sizes_is_the_plain_definition(
    blocks: list[tuple[int, int, int]], limit: int
) -> None:
    """Against a direct reading of the rule: the `limit` paths touched last, newest first,
    each sized by its newest block that has a whole size, else its newest shown size."""
    newest_first = blocks[::-1]
    order: list[int] = []
    for p, _, _ in newest_first:
        if p and p not in order:
            order.append(p)
    expected = []
    for p in order[:limit]:
        mine = [(w, sh) for q, w, sh in newest_first if q == p]
        whole = next((w for w, _ in mine if w >= 0), None)
        if whole is not None:
            expected.append(round(whole * cal.TOKENIZER_RATIO))
            continue
        shown = next((sh for w, sh in mine if sh >= 0), 0)
        expected.append(shown)
    assert _sizes(blocks, limit) == expected


def test_compaction_output_adds_the_dropped_analysis() -> None:
    assert cal.compaction_output_tokens(2_340) == 3_000  # 2,340 / (1 - 0.22)
    assert cal.compaction_output_tokens(2_340, analysis_stripped=False) == 2_340
    assert cal.compaction_output_tokens(0) == 0
    with pytest.raises(ValueError):
        cal.compaction_output_tokens(-1)


def test_post_compact_context_by_hand() -> None:
    post = cal.post_compact_context(14_000, 155_000)
    assert post == cal.PostCompact(14_000, 2_915, 18_960)
    assert post.total == 14_000 + 2_915 + 18_960
    given = cal.post_compact_context(46_529, 167_325, restored=7_020 + cal.BEYOND_FILE_RULE)
    assert given.total == 46_529 + 2_915 + 7_020 + 1_798
    # Seeded: the summary is drawn first, then the restored tokens, from the same rng.
    rng = random.Random(7)
    z1, z2 = rng.normalvariate(0.0, 1.0), rng.normalvariate(0.0, 1.0)
    s = round(math.exp(cal.SUMMARY_LOG_MU + cal.SUMMARY_LOG_SIGMA * z1))
    r = round(math.exp(cal.RESTORED_LOG_MU + cal.RESTORED_LOG_SIGMA * z2))
    assert cal.post_compact_context(20_000, 160_000, random.Random(7)) == cal.PostCompact(
        20_000, s, r
    )
    with pytest.raises(ValueError):
        cal.post_compact_context(-1, 10)
    with pytest.raises(ValueError):
        cal.post_compact_context(0, 10, restored=-1)


# -- constants against the committed data -------------------------------------------------


def test_constants_are_the_committed_fit() -> None:
    data = _data()
    summary, restored = data["fit"]["summary_tokens"], data["fit"]["restored_tokens"]
    committed = {
        "TOKENIZER_RATIO": data["tokenizer_ratio"]["claude_per_cl100k"],
        "SUMMARY_LOG_MU": summary["log_mu"],
        "SUMMARY_LOG_SIGMA": summary["log_sigma"],
        "SUMMARY_MEDIAN": summary["median"],
        "RESTORED_LOG_MU": restored["log_mu"],
        "RESTORED_LOG_SIGMA": restored["log_sigma"],
        "RESTORED_MEDIAN": restored["median"],
        "BEYOND_FILE_RULE": restored["beyond_model_median"],
    }
    assert {name: getattr(cal, name) for name in committed} == committed


def test_committed_rows_add_up_and_hold_no_text_or_paths() -> None:
    data = _data()
    ratio = data["tokenizer_ratio"]["claude_per_cl100k"]
    rows = data["compactions"]
    assert len(rows) == 9
    for row in rows:
        assert row["summary_tokens"] == round(row["summary_tokens_raw"] * ratio)
        other = round(row["other_new_tokens_raw"] * ratio)
        parts = row["prefix_tokens"] + row["summary_tokens"] + row["restored_tokens"] + other
        assert parts == row["context_after"]
        # the anchored count absorbs everything unlogged that entered with the summary
        assert row["summary_tokens_anchored"] >= row["summary_tokens"]
        for value in row.values():
            assert isinstance(value, int | float) or (
                isinstance(value, str) and len(value) <= 40 and "/" not in value
            )


# -- the committed data against the real traces -----------------------------------------


@pytest.mark.shared
def test_measurement_of_the_shared_traces_equals_the_committed_data(shared: Path) -> None:
    """Regenerate from ../shared/traces: any drift (reader, anchoring, traces) shows here;
    fix it by rerunning `python -m simulator.app.measure.calibration_measure` and updating
    summary.py."""
    assert calibration_measure.render(calibration_measure.measure(shared)) == DATA.read_text()


def test_check_mode_reports_up_to_date(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's write and --check (the measurement itself is the test above: here it
    is a fixed one, so the shared corpus is not measured three times)."""
    measured = {"events": [{"source": "s", "pre_tokens": 1}], "fit": {"slope": 0.5}}
    monkeypatch.setattr(calibration_measure, "measure", lambda traces: measured)
    traces, out = tmp_path / "traces", tmp_path / "compactions.json"
    traces.mkdir()
    assert calibration_measure.main(["--traces", str(traces), "--out", str(out), "--check"]) == 1
    assert calibration_measure.main(["--traces", str(traces), "--out", str(out)]) == 0
    assert out.read_text() == calibration_measure.render(measured)
    assert calibration_measure.main(["--traces", str(traces), "--out", str(out), "--check"]) == 0
    out.write_text(calibration_measure.render({**measured, "fit": {"slope": 0.25}}))
    assert calibration_measure.main(["--traces", str(traces), "--out", str(out), "--check"]) == 1
