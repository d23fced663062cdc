"""Charts: drawn from the rows alone, reproducible to the byte, and sensible when a run has
no compaction or no loss columns."""

from __future__ import annotations

from typing import Any

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest

from reports import charts
from simulator import policy as registry
from simulator.frames import LOSS_SCHEMA, build_run
from tests.support.report_helpers import Toy, replayed, trace_a, trace_b

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
    # A round tick is never rounded onto its neighbour's label (12.5k is not "12k").
    ticks = (12_500, 17_500, 20_000, 1_250_000, 1_200_000, 2_500_000)
    assert [charts.tokens_label(v) for v in ticks] == [
        "12.5k",
        "17.5k",
        "20k",
        "1.25M",
        "1.2M",
        "2.5M",
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
    layout engine. Same pixels (png_bytes writes them as RGB, savefig as RGBA)."""
    import io

    fig = _laid_out_figure()
    buf = io.BytesIO()
    with charts._style():
        fig.savefig(buf, format="png", metadata={"Software": None})
    saved = _pixels(buf.getvalue())
    assert saved.shape[-1] == 4 and (saved[..., 3] == 1.0).all()  # opaque: RGB loses nothing
    assert np.array_equal(_pixels(charts.png_bytes(_laid_out_figure())), saved[..., :3])


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


def _blank_border(png: bytes, width: int) -> bool:
    """Whether the outer `width` pixels of the chart are all white: no text, legend or
    tick label was pushed off (or to) the figure's edge."""
    image = _pixels(png)[..., :3]
    border = np.concatenate(
        [
            image[:width].reshape(-1, 3),
            image[-width:].reshape(-1, 3),
            image[:, :width].reshape(-1, 3),
            image[:, -width:].reshape(-1, 3),
        ]
    )
    return bool((border > 0.99).all())


def _content_box(png: bytes) -> tuple[int, int, int, int]:
    """Left, top, right, bottom of the non-white pixels."""
    ink = (_pixels(png)[..., :3] < 0.95).any(axis=-1)
    rows, cols = np.nonzero(ink.any(axis=1))[0], np.nonzero(ink.any(axis=0))[0]
    return int(cols[0]), int(rows[0]), int(cols[-1]), int(rows[-1])


def test_the_fixed_layout_keeps_every_text_inside_the_figure() -> None:
    """The run and session charts are laid out from their measured texts, with no layout
    engine: long spec names (the y tick labels of the run charts), six specs' key entries
    (in two columns where they are many) and a two-line title stay inside the figure,
    and the chart fills it (its content comes within 30 pixels of every edge: no room is
    left unused)."""
    rows = []
    for i in range(6):
        frame = replayed([TRACES[1]], Toy())
        rows.append(
            frame.with_columns(
                pl.lit(f"a-variant-with-a-rather-long-name-{i}").alias("policy"),
                pl.lit(f"{i:012d}").alias("params_hash"),
            )
        )
    requests = pl.concat(rows)
    drawn = charts.run_charts(requests)
    keys = charts.session_keys(requests, 1)
    drawn |= dict(charts.session_charts(requests, {"policies": []}, keys))
    # Three limits per spec: a key of 25 entries, in two columns, widens the figure.
    limits = {"a.threshold": 0.002, "a.blocking_limit": 0.003, "b.threshold": 0.004}
    manifest = {
        "policies": [
            {"name": f"a-variant-with-a-rather-long-name-{i}", "params_hash": f"{i:012d}"}
            | {"params": {k: v * (i + 1) for k, v in limits.items()}}
            for i in range(6)
        ]
    }
    ((_, wide),) = charts.session_charts(requests, manifest, keys)
    assert _pixels(wide).shape[1] > _pixels(drawn["sessions/b.0.png"]).shape[1] == 1000
    drawn["wide"] = wide
    # The next chart on the shared figure has its own size again.
    assert dict(charts.session_charts(requests, {"policies": []}, keys)) == {
        "sessions/b.0.png": drawn["sessions/b.0.png"]
    }
    assert len(drawn) == 6
    for name, png in drawn.items():
        assert _blank_border(png, 3), name
        left, top, right, bottom = _content_box(png)
        height, width = _pixels(png).shape[:2]
        assert left <= 30 and top <= 30, (name, left, top)
        assert right >= width - 30 and bottom >= height - 30, (name, right, bottom, width)


def test_a_session_chart_drawn_after_others_has_the_bytes_of_one_drawn_first(
    run: tuple[pl.DataFrame, dict[str, Any]],
) -> None:
    """Session charts share one figure per process (`_session_axes`): what a chart leaves
    (its lines, markers, legend, limits) never shows in the next one."""
    requests, manifest = run
    (a,), (b,) = ([k] for k in charts.session_keys(requests, 2))
    first = dict(charts.session_charts(requests, manifest, [a]))
    charts._SESSION_AXES.clear()  # as a fresh process would
    fresh = dict(charts.session_charts(requests, manifest, [a]))
    dict(charts.session_charts(requests, manifest, [b, a, b]))
    after = dict(charts.session_charts(requests, manifest, [b, a]))
    assert first == fresh
    name = charts.session_file(*a)
    assert after[name] == fresh[name]
    assert after[charts.session_file(*b)] != fresh[name]


def test_a_chart_pool_draws_the_bytes_drawn_here(
    run: tuple[pl.DataFrame, dict[str, Any]],
) -> None:
    """Workers started before the rows exist (`ctxsim run` starts them before its replay)
    draw the run and session charts, the same bytes; with its workers gone, the charts
    are drawn here."""
    requests, manifest = run
    keys = charts.session_keys(requests, 12)
    here = charts.run_charts(requests) | dict(charts.session_charts(requests, manifest, keys))
    with charts.ChartPool(workers=2) as pool:
        drawn = dict(charts.session_charts(requests, manifest, keys, pool=pool))
        drawn |= charts.run_charts(requests, pool=pool)
    assert drawn == here
    closed = charts.ChartPool(workers=1)
    closed.close()
    again = charts.run_charts(requests, pool=closed)
    again |= dict(charts.session_charts(requests, manifest, keys, pool=closed))
    assert again == here


def test_a_pool_only_for_a_report_with_enough_charts() -> None:
    few = charts.POOL_MIN_CHARTS - len(charts.RUN_CHARTS) - 1
    assert not charts.pool_pays(sessions=few, session_limit=12)
    assert charts.pool_pays(sessions=few + 1, session_limit=12)
    assert not charts.pool_pays(sessions=500, session_limit=few)


def test_a_limit_that_changes_within_the_session_is_drawn_as_it_held() -> None:
    """A client that went from a 1M to a 200k window (flutter-docker 390ab778 of
    ../shared/traces: 967k, then 167k from request 94) states each limit over the requests
    it held; a limit that never changes keeps one line across the chart."""
    rows = pl.DataFrame(
        {
            "request": [0, 1, 2, 2, 3, 4],
            "threshold_tokens": [967_000, 967_000, 167_000, 167_000, None, 167_000],
            "blocking_tokens": [177_000] * 6,
        }
    )
    lines = {line.label: line for line in charts.stated_lines(rows)}
    threshold = lines["compaction threshold"]
    assert threshold.tokens == 967_000  # the first it worked to, as before
    assert threshold.spans == ((0, 1, 967_000), (2, 2, 167_000), (4, 4, 167_000))
    assert lines["blocking limit"].spans == ()
    assert lines["blocking limit"].tokens == 177_000
