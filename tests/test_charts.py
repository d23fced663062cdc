"""Charts: drawn from the rows alone, reproducible to the byte, and sensible when a run has
no compaction or no loss columns."""

from __future__ import annotations

from typing import Any

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest
from report_helpers import Toy, replayed, trace_a, trace_b

from reports import charts
from simulator import policy as registry
from simulator.frames import LOSS_SCHEMA, build_run

PNG = b"\x89PNG\r\n\x1a\n"
TRACES = [("a", trace_a()), ("b", trace_b())]


@pytest.fixture(scope="module")
def run() -> tuple[pl.DataFrame, dict[str, Any]]:
    policies = [registry.build("as-recorded"), Toy()]
    frames = [replayed(TRACES, p) for p in policies]
    outputs = build_run(
        frames,
        [p.spec() for p in policies],
        TRACES,
        seed=0,
        cache="auto",
        prices_version="test",
        lenient=False,
    )
    return outputs.requests, outputs.manifest


def _pixels(png: bytes) -> np.ndarray[Any, Any]:
    import io

    return np.asarray(mpimg.imread(io.BytesIO(png), format="png"))


def _has_color(png: bytes, hex_color: str) -> bool:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    image = _pixels(png)[..., :3]
    return bool((np.abs(image - rgb).max(axis=-1) < 0.01).any())


def test_every_chart_is_a_reproducible_png_without_metadata(
    run: tuple[pl.DataFrame, dict[str, Any]],
) -> None:
    requests, manifest = run
    drawn = dict(charts.run_charts(requests))
    keys = charts.session_keys(requests, 12)
    drawn |= dict(charts.session_charts(requests, manifest, keys))
    pairs = [(("as-recorded", s[1]), ("toy", t[1]), "x") for s, t in [_hashes(requests)]]
    drawn["compare.png"] = charts.compare_chart(requests, requests, pairs)
    assert set(drawn) == {
        "cost_by_policy.png",
        "cache_hit_ratio.png",
        "events_by_policy.png",
        "loss_by_policy.png",
        "sessions/a.0.png",
        "sessions/b.0.png",
        "compare.png",
    }
    for name, data in drawn.items():
        assert data.startswith(PNG), name
        assert b"Software" not in data and b"atplotlib" not in data, name
        height, width = _pixels(data).shape[:2]
        assert width >= 500 and height >= 200, (name, width, height)
    again = dict(charts.run_charts(requests))
    again |= dict(charts.session_charts(requests, manifest, keys))
    assert all(again[k] == drawn[k] for k in again)


def _hashes(requests: pl.DataFrame) -> tuple[tuple[str, str], tuple[str, str]]:
    specs = charts.specs(requests)
    return specs[0], specs[1]


def test_cost_chart_stacks_components_and_compaction_calls(
    run: tuple[pl.DataFrame, dict[str, Any]],
) -> None:
    requests, _ = run
    parts = charts.cost_components(requests).row(1, named=True)  # the toy
    assert parts["policy"] == "toy"
    req = requests.filter((pl.col("policy") == "toy") & (pl.col("kind") == "request"))
    assert parts["cost_cache_read"] == pytest.approx(req["cost_cache_read"].sum())
    comp = requests.filter((pl.col("policy") == "toy") & (pl.col("kind") == "compaction"))
    assert parts["compaction"] == pytest.approx(comp["cost_total"].sum())
    total = sum(parts[c] for c, _, _ in charts.COMPONENTS)
    assert total == pytest.approx(requests.filter(pl.col("policy") == "toy")["cost_total"].sum())
    png = charts.cost_by_policy(requests)
    for _, _, color in charts.COMPONENTS:
        if color != "#C44E52":  # no 1-hour writes in these sessions
            assert _has_color(png, color), color


def test_a_run_without_compactions_or_loss_columns_still_charts() -> None:
    plain = replayed([TRACES[0]], registry.build("as-recorded")).drop(list(LOSS_SCHEMA))
    manifest = {"policies": [{"name": "as-recorded", "params_hash": "x", "params": {}}]}
    drawn = charts.run_charts(plain)
    assert set(drawn) == {"cost_by_policy.png", "cache_hit_ratio.png", "events_by_policy.png"}
    assert charts.loss_by_policy(plain) is None
    ((name, png),) = charts.session_charts(plain, manifest, [("a", 0)])
    assert name == "sessions/a.0.png" and png.startswith(PNG)


def test_sessions_where_something_happened_come_first() -> None:
    rows = replayed(TRACES, registry.build("as-recorded"))
    # b has the recording's compaction (3 calls); a has more calls but no event
    assert charts.session_keys(rows, 5) == [("b", 0), ("a", 0)]
    assert charts.session_keys(rows, 1) == [("b", 0)]
    assert charts.session_keys(rows.drop("after_compaction"), 5) == [("a", 0), ("b", 0)]


def _lines(params: dict[str, Any]) -> list[tuple[str, int]]:
    return [(line.label, line.tokens) for line in charts.policy_lines(params, 200_000)]


def _stated(name: str, params: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    """The lines a session chart draws for a Claude Code preset on a 200k Sonnet 4.5
    session: the limits the policy stated in its rows."""
    rows = replayed(TRACES[:1], registry.build(name, params or {}))
    return [(line.label, line.tokens) for line in charts.stated_lines(rows)]


def test_lines_are_the_limits_the_policy_stated() -> None:
    """DESIGN.md section 4: 167k and 177k on a 200k window; 155k and 165k when the whole
    32k max output is reserved (2.1.6); 1.0: 92% of the 168,000 effective window."""
    assert _stated("claude-code@2.1.88") == [
        ("blocking limit", 177_000),
        ("compaction threshold", 167_000),
    ]
    assert _stated("claude-code@2.1.6") == [
        ("blocking limit", 165_000),
        ("compaction threshold", 155_000),
    ]
    assert _stated("claude-code@1.0") == [
        ("blocking limit", 165_000),
        ("compaction threshold", 154_560),
    ]
    # CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=60: floor(0.6 x 180,000) = 108,000
    assert _stated("claude-code@2.1.88", {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": 60}) == [
        ("blocking limit", 177_000),
        ("compaction threshold", 108_000),
    ]
    assert _stated("claude-code@2.1.88", {"autocompact.enabled": False}) == [
        ("blocking limit", 177_000)
    ]
    # collapse: commit at 0.9 and block at 0.95 of the 180,000 effective window
    assert _stated("claude-code@2.1.88", {"collapse.enabled": True}) == [
        ("blocking limit", 171_000),
        ("compaction threshold", 162_000),
    ]
    assert _stated("as-recorded") == []


def test_policy_lines_from_parameters_of_a_policy_that_states_none() -> None:
    assert _lines({"compact.threshold": 0.9, "compact.blocking_limit": 190_000}) == [
        ("compact blocking limit", 190_000),
        ("compact threshold", 180_000),
    ]
    assert _lines({"x.enabled": False, "x.threshold": 1000, "gemini_threshold": 0.5}) == [
        ("compaction threshold", 100_000)
    ]
    assert _lines({"warm_start": True, "threshold": "high"}) == []


def test_labels_and_file_names() -> None:
    assert [charts.tokens_label(v) for v in (950, 1_000, 1_500, 12_345, 1_000_000)] == [
        "950",
        "1k",
        "1.5k",
        "12k",
        "1M",
    ]
    assert charts.session_file("a/b c:d", 3) == "sessions/a_b_c_d.3.png"
    specs = [("p", "aaaaaaaaaaaa"), ("p", "bbbbbbbbbbbb"), ("q", "cccccccccccc")]
    assert charts.spec_labels(specs) == {
        specs[0]: "p #aaaaaa",
        specs[1]: "p #bbbbbb",
        specs[2]: "q",
    }


def test_spec_parameters_are_found_by_the_name_rows_use() -> None:
    manifest = {
        "policies": [
            {"name": "claude-code", "params_hash": "h1", "params": {"a": 1}},
            {"name": "claude-code", "variant": "cc-8k", "params_hash": "h2", "params": {"a": 2}},
        ]
    }
    assert charts.spec_params(manifest) == {
        ("claude-code", "h1"): {"a": 1},
        ("cc-8k", "h2"): {"a": 2},
    }


def _laid_out_figure() -> Any:
    """A figure whose layout engine has work to do: a legend outside the axes, a title."""
    from matplotlib.figure import Figure

    with charts._style():
        fig = Figure(figsize=(6, 3), layout="constrained")
        ax = fig.add_subplot()
        ax.plot([0, 1, 2], [3, 1, 2], label="a rather long legend entry: context")
        ax.set_title("title", loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def test_one_draw_gives_the_pixels_of_savefig() -> None:
    """png_bytes draws once (the layout inside that draw); savefig draws twice with a
    layout engine. Same bytes."""
    import io

    fig = _laid_out_figure()
    buf = io.BytesIO()
    with charts._style():
        fig.savefig(buf, format="png", metadata={"Software": None})
    assert charts.png_bytes(_laid_out_figure()) == buf.getvalue()


def test_chart_workers_only_for_many_charts() -> None:
    few = charts.PARALLEL_MIN - 1
    assert charts.chart_workers(few, jobs=4) == 0
    many = 2 * charts.PARALLEL_MIN
    assert charts.chart_workers(many, jobs=1) == 0  # one process: this one
    assert charts.chart_workers(many, jobs=3) == 2  # two workers beside this process
    assert charts.chart_workers(charts.PARALLEL_MIN, jobs=64) == charts.PARALLEL_MIN // 2


def test_charts_drawn_by_workers_are_the_bytes_drawn_here(
    run: tuple[pl.DataFrame, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same session charts, in the same order, whichever process drew each one."""
    requests, manifest = run
    keys = charts.session_keys(requests, 12) * 3  # enough charts for a worker to take some
    serial = list(charts.session_charts(requests, manifest, keys, jobs=1))
    monkeypatch.setattr(charts, "PARALLEL_MIN", 2)
    assert charts.chart_workers(len(keys), jobs=2) == 1
    parallel = list(charts.session_charts(requests, manifest, keys, jobs=2))
    assert [name for name, _ in serial] == [charts.session_file(*k) for k in keys]
    assert parallel == serial
    # A chart drawn in a worker for certain (the parallel pass may have drawn all here).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    trace, index = keys[0]
    rows = requests.filter((pl.col("trace") == trace) & (pl.col("session_index") == index))
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        drawn = pool.submit(charts._session_png, rows, manifest).result()
    assert drawn == serial[0][1]
