"""Sweep charts (reports/sweep_charts.py) on hand-built cells tables: a 1-D chart holds the
other grid parameters at the policy's own values (issue 15), the cost-against-loss chart is
drawn when the cells carry loss proxies, file names and labels use the parameters' own
names, and the same table gives the same bytes."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from reports import sweep_charts as sc
from simulator.frames import CELL_FIGURES

PNG = b"\x89PNG"


def cells(loss: bool = True) -> pl.DataFrame:
    """Policy p over a (1, 2, 3) x b (10, 20, 30); cost = a + b / 10 and stale refs = 3a + b,
    so every cell is told apart by its figures; policy q over a only."""
    rows = []
    for a in (1, 2, 3):
        for b in (10, 20, 30):
            rows.append({"policy": "p", "params_hash": f"p{a}{b}", "x__a": a, "x__b": b})
    rows += [{"policy": "q", "params_hash": f"q{a}", "x__a": a, "x__b": None} for a in (1, 3)]
    frame = pl.DataFrame(rows, schema_overrides={"x__b": pl.Int64})
    # Every other figure 0, every loss proxy unknown.
    figures = {c: pl.lit(0, pl.Int64) for c in CELL_FIGURES}
    figures |= {c: pl.lit(None, pl.Float64) for c, *_ in sc.LOSS_PANELS}
    frame = frame.with_columns(**figures)
    b = pl.col("x__b").fill_null(0)
    frame = frame.with_columns(
        cost_total=(pl.col("x__a") + b / 10).cast(pl.Float64),
        stale_file_refs=(3 * pl.col("x__a") + b) if loss else pl.lit(None, pl.Int64),
        summary_share=(pl.col("x__a") / 10).cast(pl.Float64) if loss else pl.lit(None),
    )
    return frame


NAMES = {"x__a": "x.a", "x__b": "x.b"}


def test_a_section_holds_other_parameters_at_the_policys_own_value() -> None:
    rows, note = sc._section(cells(), "p", ["x__a"], {"x__a": 1, "x__b": 20}, NAMES)
    assert rows["x__b"].to_list() == [20, 20, 20]
    assert rows["cost_total"].to_list() == [3.0, 4.0, 5.0]
    assert note == "x.b=20"
    # The own value off the grid: the nearest grid value, and the note says so.
    rows, note = sc._section(cells(), "p", ["x__a"], {"x__b": 26}, NAMES)
    assert set(rows["x__b"]) == {30}
    assert note == "x.b=30 (own 26 not on the grid)"
    # Equally near: the lower one.
    rows, _ = sc._section(cells(), "p", ["x__a"], {"x__b": 15}, NAMES)
    assert set(rows["x__b"]) == {10}
    # No own value known: the first grid value (the old behaviour, as a last resort).
    rows, note = sc._section(cells(), "p", ["x__a"], {}, NAMES)
    assert set(rows["x__b"]) == {10} and note == "x.b=10"
    # A parameter the policy does not have is not held at all.
    rows, note = sc._section(cells(), "q", ["x__a"], {"x__a": 1}, NAMES)
    assert rows.height == 2 and note == ""


def test_held_value_needs_the_same_type() -> None:
    assert sc._held_value([0, 1], True) == (0, False)  # True is not the grid's 1
    assert sc._held_value([False, True], True) == (True, True)
    assert sc._held_value(["5m", "1h"], "1h") == ("1h", True)
    assert sc._held_value(["5m", "1h"], "request") == ("5m", False)


def test_sweep_charts_name_files_by_parameter_and_draw_loss_when_present() -> None:
    defaults = {"p": {"x__a": 2, "x__b": 20}, "q": {"x__a": 3}}
    files = sc.sweep_charts(cells(), defaults, NAMES)
    assert sorted(files) == [
        "charts/heatmap-x.a-vs-x.b.png",
        "charts/loss-x.a.png",
        "charts/loss-x.b.png",
        "charts/param-x.a.png",
        "charts/param-x.b.png",
    ]
    assert all(data.startswith(PNG) for data in files.values())
    assert sc.sweep_charts(cells(), defaults, NAMES) == files  # same table, same bytes
    without = sc.sweep_charts(cells(loss=False), defaults, NAMES)
    assert not [n for n in without if n.startswith("charts/loss-")]


def test_the_held_value_changes_the_chart() -> None:
    """Held at b=20 and at b=30 the 1-D chart over a differs: the hold is what is drawn."""
    at_20 = sc.parameter_chart(cells(), "x__a", {"p": {"x__b": 20}}, NAMES)
    at_30 = sc.parameter_chart(cells(), "x__a", {"p": {"x__b": 30}}, NAMES)
    assert at_20 != at_30
    assert sc.loss_chart(cells(), "x__a", {"p": {"x__b": 20}}, NAMES) != sc.loss_chart(
        cells(), "x__a", {"p": {"x__b": 30}}, NAMES
    )


@pytest.mark.parametrize("loss", [True, False])
def test_loss_panels_are_the_proxies_with_values(loss: bool) -> None:
    panels = [p[0] for p in sc.loss_panels(cells(loss))]
    assert panels == (["stale_file_refs", "summary_share"] if loss else [])


def test_the_cheapest_cell_overflows_no_more_than_the_own_one() -> None:
    rows = pl.DataFrame(
        {"x__a": [1, 2, 3, 4], "cost_total": [5.0, 1.0, 3.0, None], "overflows": [0, 2, 0, 0]}
    )
    # a=2 is cheapest but overflows twice where the own a=1 does not; a=4 is unpriced.
    assert sc._cheapest(rows, "x__a", 1) == 2
    assert sc._cheapest(rows, "x__a", 2) == 1  # its own overflows are the bound
    assert sc._cheapest(rows, "x__a", 9) == 1  # own value off the grid: every priced cell


def _loss_figure(monkeypatch: pytest.MonkeyPatch, frame: pl.DataFrame, own: int) -> Any:
    """The loss chart's figure, drawn once (png_bytes caught before it encodes)."""
    caught: list[Any] = []
    monkeypatch.setattr(sc, "png_bytes", lambda fig: caught.append(fig) or PNG)
    sc.loss_chart(frame, "x__a", {"p": {"x__a": own}}, NAMES)
    (fig,) = caught
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig, canvas.get_renderer()


def _near_the_own_cell() -> pl.DataFrame:
    """Like 2.1.221's buffers: below the own 13k the cells barely move (it seldom compacts
    there), so the 2k end sits a hair from the ringed 13k cell; above it the cost falls."""
    a = [2000, 4000, 13000, 30000, 60000, 90000]
    stale = [46, 46, 45, 64, 93, 135]
    cost = [1603.4, 1603.3, 1603.0, 1595.0, 1576.0, 1567.0]
    return _one_line(a, stale, cost)


def _one_line(a: list[int], stale: list[int], cost: list[float]) -> pl.DataFrame:
    """One policy's cells along x.a: its cost and stale references, every other figure 0."""
    frame = pl.DataFrame({"policy": ["p"] * len(a), "x__a": a})
    figures = {c: pl.lit(0, pl.Int64) for c in CELL_FIGURES}
    figures |= {c: pl.lit(None, pl.Float64) for c, *_ in sc.LOSS_PANELS}
    return frame.with_columns(**figures).with_columns(
        params_hash=pl.col("x__a").cast(pl.String),
        cost_total=pl.Series(cost),
        stale_file_refs=pl.Series(stale),
    )


def _clash(label: Any, others: list[Any], ring: tuple[float, float], renderer: Any) -> bool:
    """Whether a drawn label touches another label or the ring (radius: half the marker's
    diameter of sqrt(120) points plus half its 1.4-point edge, in pixels at the figure's dpi)."""
    box = label.get_window_extent(renderer)
    if any(box.overlaps(o.get_window_extent(renderer)) for o in others):
        return True
    cx, cy = label.axes.transData.transform(ring)
    radius = (120**0.5 / 2 + 0.7) * label.figure.dpi / 72
    nx, ny = min(max(cx, box.x0), box.x1), min(max(cy, box.y0), box.y1)
    return bool(((cx - nx) ** 2 + (cy - ny) ** 2) ** 0.5 < radius)


def test_an_end_label_gives_way_to_the_own_values_ring_and_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 2k end label, whose usual place (left of and below its cell) touches the 13k
    ring, is drawn clear of the ring and of the 13k and 90k (star) labels, or not at all."""
    fig, renderer = _loss_figure(monkeypatch, _near_the_own_cell(), 13000)
    ax = fig.axes[0]
    texts = {t.get_text(): t for t in ax.texts}
    assert sorted(texts) == ["13k", "2k", "90k"]
    marked, ring = [texts["13k"], texts["90k"]], (45, 1603.0)
    usual = ax.annotate(
        "2k", (46, 1603.4), xytext=(-4, -11), textcoords="offset points", ha="right", fontsize=7
    )
    assert _clash(usual, marked, ring, renderer)
    usual.remove()
    end = texts["2k"]
    assert getattr(end, "left_out", False) or not _clash(end, marked, ring, renderer)


def test_an_end_label_with_room_keeps_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Far from the marked cells both ends are labelled where they always were: the first
    left of and below its cell, the last right of and above it, neither clipped."""
    a = [2000, 30000, 60000, 90000, 120000]
    frame = _one_line(a, [10, 300, 600, 900, 1200], [100.0, 70.0, 40.0, 10.0, 50.0])
    fig, _renderer = _loss_figure(monkeypatch, frame, 60000)
    texts = {t.get_text(): t for t in fig.axes[0].texts}
    assert sorted(texts) == ["120k", "2k", "60k", "90k"]
    assert (texts["2k"].xyann, texts["2k"].get_horizontalalignment()) == ((-4, -11), "right")
    assert (texts["120k"].xyann, texts["120k"].get_horizontalalignment()) == ((5, 3), "left")
    assert not getattr(texts["2k"], "left_out", False)
    # Unclipped like every other label: one past the axes' edge is drawn whole.
    assert all(t.get_clip_box() is None and t.get_clip_path() is None for t in texts.values())


def _drawn(monkeypatch: pytest.MonkeyPatch, draw: Any) -> tuple[Any, Any]:
    """The figure a chart function draws, and the renderer it was drawn with (png_bytes
    caught before it encodes)."""
    caught: list[Any] = []
    monkeypatch.setattr(sc, "png_bytes", lambda fig: caught.append(fig) or PNG)
    draw()
    (fig,) = caught
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig, canvas.get_renderer()


def _trials() -> pl.DataFrame:
    """Four trials of a study over x.a: cost falls as stale references rise (every feasible
    trial on the Pareto front), trial 2 breaks a constraint."""
    return pl.DataFrame(
        {
            "trial": [0, 1, 2, 3],
            "state": ["complete"] * 4,
            "x__a": [1_000, 5_000, 9_000, 29_500],
            "objective": [4.0, 3.5, 3.8, 3.2],
            "cost": [4.0, 3.5, 3.8, 3.2],
            "stale_file_refs": [2, 5, 7, 9],
            "feasible": [True, True, False, True],
            "best_so_far": [4.0, 3.5, 3.5, 3.2],
            "pareto": [True, True, False, True],
        }
    )


def test_the_fixed_layout_keeps_each_text_inside_the_figure_and_off_the_other_panels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep and study charts are laid out from their measured texts and drawn once (no
    layout engine, issue 16): each panel with its tick labels, axis labels, title, legend
    and annotations (a Pareto front's tuned values), the figure's title and legend lie
    inside the figure, no panel's texts reach another panel's, and a
    policy's y label longer than its row (a long name held at a value off the grid) is
    broken to the row's height instead of running into the next row."""
    name = "a-policy-with-a-rather-long-name"
    frame = cells().with_columns(
        policy=pl.when(pl.col("policy") == "p").then(pl.lit(name)).otherwise(pl.col("policy"))
    )
    defaults = {name: {"x__a": 2, "x__b": 26}, "q": {"x__a": 3}}
    draws = {
        "param": lambda: sc.parameter_chart(frame, "x__a", defaults, NAMES, " (open loop)"),
        "loss": lambda: sc.loss_chart(frame, "x__a", defaults, NAMES, " (open loop)"),
        "heatmap": lambda: sc.heatmap_chart(frame, "x__a", "x__b", defaults, NAMES),
        "trials": lambda: sc.trials_chart(
            _trials(), "cost", ["x__a"], 3.9, {"x__a": 13_000}, {"x__a": "x.a"}
        ),
        "pareto": lambda: sc.pareto_chart(
            _trials(),
            [("cost", False), ("stale_file_refs", False)],
            ["x__a"],
            {"cost": 3.9, "stale_file_refs": 6},
            {"x__a": "x.a"},
        ),
    }
    for chart, draw in draws.items():
        fig, renderer = _drawn(monkeypatch, draw)
        page = fig.bbox.padded(0.5)
        axes = [ax for ax in fig.axes if ax.get_visible()]
        boxes = [ax.get_tightbbox(renderer) for ax in axes]
        boxes += [legend.get_window_extent(renderer) for legend in fig.legends]
        if fig._suptitle is not None:
            boxes.append(fig._suptitle.get_window_extent(renderer))
        for box in boxes:
            assert page.x0 <= box.x0 and box.x1 <= page.x1, (chart, box)
            assert page.y0 <= box.y0 and box.y1 <= page.y1, (chart, box)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not a.overlaps(b), (chart, a, b)
        for ax in axes:
            label = ax.yaxis.label
            if label.get_text():
                assert label.get_window_extent(renderer).height <= ax.bbox.height, chart
    # Held at a value of a long-named parameter: the label is broken into more lines.
    names = {"x__a": "x.a", "x__b": "x.a_parameter_with_a_name_as_long_as_they_come"}
    fig, renderer = _drawn(monkeypatch, lambda: sc.loss_chart(frame, "x__a", defaults, names))
    first = fig.axes[0]
    label = first.get_ylabel()
    held = "(x.a_parameter_with_a_name_as_long_as_they_come=30 (own 26 not on the grid))"
    assert label.split("\n")[0] == name and label.split("\n")[-1] == "USD, all sessions"
    assert label.count("\n") >= 3  # the held value broken in two lines or more
    assert label.replace("\n", "").replace(" ", "") == f"{name}{held}USD,allsessions".replace(
        " ", ""
    )
    assert first.yaxis.label.get_window_extent(renderer).height <= first.bbox.height


def test_wrapped_breaks_between_words_only_where_a_line_is_too_long() -> None:
    from matplotlib.figure import Figure

    from reports.charts import _Fit

    fit = _Fit(Figure(figsize=(4, 3)))
    room = fit.text("aaaa bbbb", 8)[0] + 1
    assert sc._wrapped(fit, "aaaa bbbb cccc\nshort", 8, room) == "aaaa bbbb\ncccc\nshort"
    assert sc._wrapped(fit, "aaaa bbbb", 8, room) == "aaaa bbbb"
    assert sc._wrapped(fit, "unbreakable-and-long", 8, 5.0) == "unbreakable-and-long"
