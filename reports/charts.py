"""Charts of a run, drawn only from its Parquet rows and manifest (DESIGN.md section 8).

Every function takes the request rows (requests.parquet as a polars frame) and returns PNG
bytes. The bytes are reproducible: one bundled font (DejaVu Sans ships with matplotlib), no
PNG metadata (matplotlib writes its version by default), fixed sizes and resolution, and no
time or path anywhere, so two runs on the same inputs give identical files. Figures are
made without pyplot, so drawing keeps no global state between charts.

Speed (issue 16: the report at most 1.5x the run without it). matplotlib is imported only
where a chart is drawn (the names, keys and labels here need none of it), so a process
that hands its charts to workers (`ChartPool`) never pays its 0.5-0.9 s import. The run
and session charts are laid out from their own measured texts (`_Fit`) instead of a
layout engine: constrained layout computes every axis' ticks and texts for a layout pass
and again for the draw, half of a session chart's time. Session charts share one figure
per process (`_session_axes`) and draw their key as plain lines and texts (`_key`).

What each chart shows is listed in reports/METRICS.md ("Charts").
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import polars as pl

from simulator.workers import start_fork_server, worker_start

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend
    from matplotlib.lines import Line2D
    from matplotlib.ticker import Formatter

#: Settings every chart is drawn with: a font matplotlib ships, so no system font changes
#: a glyph, and no hash salt or date that varies between runs.
RC: dict[str, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "svg.hashsalt": "ctxsim",
    # FreeType's hinter fitted every glyph to the pixel grid, a fifth of a chart's drawing
    # (16 charts of `ctxsim run` on the shared Claude Code corpus: 0.80 -> 0.63 s in one
    # process, issue 16); at 100 dpi and these sizes the unhinted text reads the same.
    "text.hinting": "no_hinting",
    "figure.dpi": 100,
    "savefig.dpi": 100,
}

#: Cost components, bottom to top: the request rows' five token components, then every
#: dollar of the policy's own compaction calls (all their components together).
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("cost_uncached_input", "uncached input", "#4C72B0"),
    ("cost_cache_read", "cache read", "#55A868"),
    ("cost_cache_write_5m", "cache write 5m", "#DD8452"),
    ("cost_cache_write_1h", "cache write 1h", "#C44E52"),
    ("cost_output", "output", "#8172B3"),
    ("compaction", "compaction calls", "#937860"),
)
#: Colours of policy specs in per-session charts, in spec order.
POLICY_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B")
STAGE_MARKERS = ("o", "s", "^", "P", "*", "h")
EVENT_COLORS = {
    "compaction calls": "#4C72B0",
    "requests after a compaction": "#A5B8D8",
    "overflows": "#C44E52",
    "breaker trips": "#222222",
}

Spec = tuple[str, str]  # (policy, params_hash)


@contextmanager
def _style() -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context(cast(Any, RC)):
        yield


def _new_figure(
    width: float, height: float, layout: Literal["constrained"] | None = None
) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout=layout)


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes with no metadata (no version, no date): reproducible.

    Drawn once on an Agg canvas (a layout engine, where a figure has one, runs inside that
    draw: `Figure.savefig` would draw such a figure twice, the same pixels,
    tests/reports/test_charts.py), then written by Pillow as RGB at zlib level 1: the charts are
    opaque, and a 1000x440 session chart encodes in 8 ms so against 29 ms as matplotlib
    writes it (RGBA, level 6) and 11 ms as RGB at level 6, 7% smaller than the first and
    4% larger than the last (issue 16; zlib is deterministic at any level)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    # The canvas a `_Fit` measured on, if any: its renderer has the texts' sizes cached.
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    with _style():
        canvas.draw()  # type: ignore[no-untyped-call]  # matplotlib leaves these unannotated
    width, height = canvas.get_width_height()
    rgba = canvas.buffer_rgba()  # type: ignore[no-untyped-call]
    image = Image.frombuffer("RGBA", (width, height), rgba, "raw", "RGBA", 0, 1)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def tokens_label(value: float) -> str:
    """Token counts the way people say them: 950, 12k, 1.2M; a round tick keeps the digit
    that makes it itself (12.5k, 1.25M), never rounded onto its neighbour's label."""
    v = abs(value)
    if v >= 1_000_000:
        digits = 2 if v % 100_000 and not v % 10_000 else 1
        return f"{value / 1e6:.{digits}f}M".replace(".0M", "M").replace(".00M", "M")
    if v >= 10_000:
        return f"{value / 1e3:.1f}k" if v % 1_000 and not v % 100 else f"{value / 1e3:.0f}k"
    if v >= 1_000:
        return f"{value / 1e3:.1f}k".replace(".0k", "k")
    return f"{value:.0f}"


def dollars_label(value: float) -> str:
    if value >= 100:
        return f"${value:,.0f}"
    if value >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"


def _tokens_axis() -> Formatter:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: tokens_label(v))


def specs(requests: pl.DataFrame) -> list[Spec]:
    """The run's policy specs, in a fixed order."""
    frame = requests.select("policy", "params_hash").unique().sort(["policy", "params_hash"])
    return [(r[0], r[1]) for r in frame.iter_rows()]


def spec_labels(all_specs: Sequence[Spec]) -> dict[Spec, str]:
    """A short label per spec: the policy name, with its parameter hash only where two specs
    share a name."""
    names = [s[0] for s in all_specs]
    return {s: s[0] if names.count(s[0]) == 1 else f"{s[0]} #{s[1][:6]}" for s in all_specs}


def _empty_note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555")


def _money_axis(ax: Axes, top: float) -> Callable[[float], str]:
    """Dollar ticks with as many decimals as the scale needs ($0.50, not $0.5000); returns
    the tick format (for the layout)."""
    from matplotlib.ticker import FuncFormatter

    decimals = 2 if top >= 0.5 else 3 if top >= 0.05 else 4

    def money(v: float) -> str:
        return f"${v:,.{decimals}f}"

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: money(v)))
    return money


# -- layout -------------------------------------------------------------------------------

#: Pixels per point at the charts' 100 dpi (RC), and the white kept round a chart.
PX = 100 / 72
EDGE = 8.0
#: A tick mark and its pad (matplotlib's 3.5 pt each, RC keeps them), an axis label's pad
#: (4 pt), a title's (6 pt), all in pixels.
TICK = 7.0 * PX
LABELPAD = 4.0 * PX
TITLEPAD = 6.0 * PX
#: Font sizes (points) of RC: tick labels and axis labels, axes titles.
TEXT = 9.0
TITLE = 11.0


class _Fit:
    """Places a chart's axes from the measured sizes of its own texts, so the chart is drawn
    once with no layout engine (issue 16: constrained layout computes every tick and text
    twice, a layout pass and the draw; half a session chart's time). Sizes come from the
    renderer that draws the chart (same font, size and dpi), so what is measured is what
    is drawn: tick labels, axis labels, titles and an outside legend get their room and
    nothing is clipped (tests/reports/test_charts.py looks for each at the figure's edges)."""

    def __init__(self, fig: Figure) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        self.fig = fig
        # A figure drawn before (`_session_axes`) keeps its canvas: its renderer has the
        # sizes of the texts drawn on it cached.
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        self.renderer: RendererAgg = canvas.get_renderer()  # type: ignore[no-untyped-call]
        self.width = float(fig.bbox.width)
        self.height = float(fig.bbox.height)

    def text(self, text: str, size: float = TEXT) -> tuple[float, float]:
        """Width and height in pixels of `text` (its lines as matplotlib lays them out)."""
        from matplotlib.text import Text

        if not text:
            return 0.0, 0.0
        artist = Text(0, 0, text, fontsize=size)
        artist.set_figure(self.fig)
        box = artist.get_window_extent(self.renderer)
        return float(box.width), float(box.height)

    def widest(self, texts: Sequence[str], size: float = TEXT) -> float:
        return max((self.text(t, size)[0] for t in texts), default=0.0)

    def legend(self, legend: Legend) -> tuple[float, float]:
        box = legend.get_window_extent(self.renderer)
        return float(box.width), float(box.height)

    def margins(
        self, *, ylabels: Sequence[str], ylabel: str = "", xlabel: str = "", title: str = ""
    ) -> tuple[float, float, float]:
        """Left, bottom and top margins (pixels) of an axes with these y tick labels, axis
        labels and title (TITLE size): the tick labels, then the rotated y label, beside
        the axes; the x tick labels and x label under it; the title over it."""
        left = EDGE + self.widest(ylabels) + TICK
        if ylabel:
            left += self.text(ylabel)[1] + LABELPAD
        bottom = EDGE + self.text("0")[1] + TICK
        if xlabel:
            bottom += self.text(xlabel)[1] + LABELPAD
        top = EDGE + (self.text(title, TITLE)[1] + TITLEPAD if title else 0.0)
        return left, bottom, top

    def place(self, ax: Axes, left: float, bottom: float, right: float, top: float) -> None:
        """Put `ax` inside these margins (pixels from each edge)."""
        w, h = self.width, self.height
        width = max(w - left - right, 0.2 * w)
        height = max(h - bottom - top, 0.2 * h)
        ax.set_position((left / w, bottom / h, width / w, height / h))

    def legend_right(self, legend: Legend, top: float) -> float:
        """Anchor an outside legend at the figure's right edge, its top at the axes' top;
        returns the room it takes (its width and a gap)."""
        legend.set_bbox_to_anchor(
            (1 - EDGE / self.width, 1 - top / self.height), transform=self.fig.transFigure
        )
        return EDGE + self.legend(legend)[0] + 2 * EDGE


def _outside_legend(ax: Axes, **options: Any) -> Legend:
    """A legend for the right of the axes (placed by `_Fit.legend_right`)."""
    return ax.legend(loc="upper right", borderaxespad=0.0, **options)


# -- per run ------------------------------------------------------------------------------
# Horizontal bars: a policy label of any length reads on the y axis, and a sweep of many
# specs only makes the chart taller.


def cost_components(requests: pl.DataFrame) -> pl.DataFrame:
    """Dollars per spec and component (COMPONENTS), priced rows only."""
    from simulator.frames import float_sum

    req = pl.col("kind") == "request"
    parts = [float_sum(pl.col(c).filter(req)).alias(c) for c, _, _ in COMPONENTS[:-1]]
    parts.append(float_sum(pl.col("cost_total").filter(~req)).alias("compaction"))
    return requests.group_by("policy", "params_hash").agg(parts).sort("policy", "params_hash")


def _totals(frame: pl.DataFrame) -> list[float]:
    return [
        float(v)
        for v in frame.select(
            pl.sum_horizontal(pl.col(c).fill_null(0.0) for c, _, _ in COMPONENTS)
        ).to_series()
    ]


def _stacked(ax: Axes, y: Sequence[float], frame: pl.DataFrame, height: float) -> list[Any]:
    """Stacked horizontal component bars at `y` (one per row of `frame`), each with its
    total at the end; returns legend handles."""
    left = [0.0] * frame.height
    handles = []
    for column, label, color in COMPONENTS:
        values = [float(v or 0.0) for v in frame[column].to_list()]
        handles.append(ax.barh(y, values, height, left=left, color=color, label=label))
        left = [a + v for a, v in zip(left, values, strict=True)]
    for yi, total in zip(y, left, strict=True):
        ax.annotate(
            dollars_label(total),
            (total, yi),
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=8,
        )
    return handles


def _spec_axis(ax: Axes, names: Sequence[str]) -> None:
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.4, -0.6)  # first spec on top
    ax.grid(axis="y", visible=False)


def _height(n: int) -> float:
    return 1.5 + 0.5 * n


@dataclass(frozen=True)
class RunFigures:
    """What the per-run charts are drawn from: small per-spec frames computed once from the
    request rows (a worker is sent these, never the rows of a million-request run)."""

    components: pl.DataFrame  # cost_components
    component_names: list[str]  # a label per row of `components`
    summary: pl.DataFrame  # simulator/frames.py policy_summary
    summary_names: list[str]  # a label per row of `summary`
    loss: bool  # the rows carry the loss proxies

    @classmethod
    def of(cls, requests: pl.DataFrame) -> RunFigures:
        from simulator.frames import has_loss, policy_summary

        labels = spec_labels(specs(requests))

        def names(frame: pl.DataFrame) -> list[str]:
            return [labels[(r[0], r[1])] for r in frame.select("policy", "params_hash").iter_rows()]

        components, summary = cost_components(requests), policy_summary(requests)
        return cls(components, names(components), summary, names(summary), has_loss(requests))


def cost_by_policy(requests: pl.DataFrame) -> bytes:
    """Dollars per policy spec, stacked by component (compaction calls last)."""
    return _cost_chart(RunFigures.of(requests))


def _cost_chart(run: RunFigures) -> bytes:
    frame, names = run.components, run.component_names
    top = max(_totals(frame), default=0.0)
    xlabel, title = "cost (USD, all sessions)", "Cost by policy, by component"
    with _style():
        fig = _new_figure(8.0, _height(len(names)) + 0.5)
        ax = fig.add_subplot()
        _stacked(ax, range(len(names)), frame, 0.6)
        _spec_axis(ax, names)
        right = top * 1.18 if top > 0 else 1.0
        ax.set_xlim(0, right)
        money = _money_axis(ax, top)
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left", y=1.0)
        legend = _outside_legend(ax, title="component")
        fit = _Fit(fig)
        left, bottom, top_px = fit.margins(ylabels=names, xlabel=xlabel, title=title)
        room = max(fit.legend_right(legend, top_px), EDGE + fit.text(money(right))[0] / 2)
        fit.place(ax, left, bottom, room, top_px)
        return png_bytes(fig)


def _percent_axis(ax: Axes) -> None:
    from matplotlib.ticker import PercentFormatter

    ax.set_xlim(0, 112)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))


def _percent_room(fit: _Fit, left: float) -> float:
    """The right margin of a percent axis (`_percent_axis`) beginning `left` pixels in:
    the "100%" tick's right half, and whatever of a 100% bar's label ("100.0%", 3 pt
    past the bar) the axes' last 12 points do not hold."""
    tick = EDGE + fit.text("100%")[0] / 2
    label = fit.text("100.0%", 8)[0] + 3 * PX
    spare = 12 / 112  # of the axes' width, past 100%
    need = EDGE + (label - spare * (fit.width - left - tick)) / (1 - spare)
    return max(tick, need)


def _bar_labels(ax: Axes, y: Sequence[float], values: Sequence[float], texts: list[str]) -> None:
    for yi, v, text in zip(y, values, texts, strict=True):
        ax.annotate(
            text, (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )


def hit_ratio_by_policy(requests: pl.DataFrame) -> bytes:
    """Cache hit ratio (cache read / whole prompt, all calls) per policy spec."""
    return _hit_chart(RunFigures.of(requests))


def _hit_chart(run: RunFigures) -> bytes:
    names = run.summary_names
    raw = run.summary["cache_hit_ratio"].to_list()
    values = [100 * (v or 0.0) for v in raw]
    xlabel, title = "cache read / prompt tokens (all calls)", "Cache hit ratio"
    with _style():
        fig = _new_figure(6.5, _height(len(names)))
        ax = fig.add_subplot()
        y = list(range(len(names)))
        ax.barh(y, values, 0.6, color="#55A868")
        _bar_labels(
            ax,
            y,
            values,
            ["-" if r is None else f"{v:.1f}%" for v, r in zip(values, raw, strict=True)],
        )
        _spec_axis(ax, names)
        _percent_axis(ax)
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left", y=1.0)
        fit = _Fit(fig)
        left, bottom, top = fit.margins(ylabels=names, xlabel=xlabel, title=title)
        fit.place(ax, left, bottom, _percent_room(fit, left), top)
        return png_bytes(fig)


def _grouped(
    ax: Axes, names: Sequence[str], series: dict[str, list[float]], colors: dict[str, str]
) -> None:
    """Horizontal bars grouped per name, one per series, each labelled with its value."""
    n = max(1, len(series))
    height = 0.8 / n
    for i, (label, values) in enumerate(series.items()):
        y = [j - 0.4 + height * (i + 0.5) for j in range(len(names))]
        ax.barh(y, values, height * 0.9, color=colors[label], label=label)
        _bar_labels(ax, y, values, [f"{v:,.0f}" for v in values])
    _spec_axis(ax, names)


def events_by_policy(requests: pl.DataFrame) -> bytes:
    """Compaction calls, overflows and breaker trips per policy spec."""
    return _events_chart(RunFigures.of(requests))


def _events_chart(run: RunFigures) -> bytes:
    from matplotlib.ticker import MaxNLocator

    summary, names = run.summary, run.summary_names
    series = {"compaction calls": [float(v) for v in summary["compactions"].to_list()]}
    if run.loss:  # the recording's own compactions show here under as-recorded
        after = summary["post_compaction_requests"].to_list()
        series["requests after a compaction"] = [float(v) for v in after]
    series["overflows"] = [float(v) for v in summary["overflows"].to_list()]
    series["breaker trips"] = [float(v) for v in summary["breaker_trips"].to_list()]
    top = max((max(v) for v in series.values()), default=0.0)
    xlabel, title = "count (calls, all sessions)", "Compactions, overflows and breaker trips"
    with _style():
        fig = _new_figure(7.5, _height(len(names)) * 1.3)
        ax = fig.add_subplot()
        _grouped(ax, names, series, EVENT_COLORS)
        right = max(1.0, top * 1.15)
        ax.set_xlim(0, right)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left", y=1.0)
        legend = _outside_legend(ax)
        if top == 0:
            _empty_note(ax, "no compaction, overflow or breaker trip in this run")
        fit = _Fit(fig)
        left, bottom, top_px = fit.margins(ylabels=names, xlabel=xlabel, title=title)
        room = max(fit.legend_right(legend, top_px), EDGE + fit.text(f"{right:,.0f}")[0] / 2)
        fit.place(ax, left, bottom, room, top_px)
        return png_bytes(fig)


LOSS_PANELS: tuple[tuple[str, str, str], ...] = (
    ("human_verbatim_share", "Human words kept verbatim", "share of the human's tokens"),
    ("summary_share", "View written by compaction", "share of request context tokens"),
    ("stale_file_refs", "Stale file references", "count (tool calls)"),
    ("resent_tokens", "Re-sent after compaction", "tokens (uncached + written)"),
)
LOSS_SUPTITLE = "What each policy loses (request rows, all sessions)"


def loss_by_policy(requests: pl.DataFrame) -> bytes | None:
    """The loss proxies per policy spec, one panel each; None when the rows lack them."""
    return _loss_chart(RunFigures.of(requests))


def _loss_chart(run: RunFigures) -> bytes | None:
    from matplotlib.ticker import MaxNLocator

    if not run.loss:
        return None
    summary, names = run.summary, run.summary_names
    with _style():
        fig = _new_figure(10, 2 * _height(len(names)) + 0.4)
        axes = fig.subplots(2, 2).ravel()
        y = list(range(len(names)))
        widest_last = ""  # the widest right-end tick label of a panel
        for ax, (column, title, unit) in zip(axes, LOSS_PANELS, strict=True):
            raw = summary[column].to_list()
            share = column.endswith("share")
            values = [(100 * v if share else float(v)) if v is not None else 0.0 for v in raw]
            ax.barh(y, values, 0.6, color="#8172B3")
            texts = [
                "-" if r is None else f"{v:.1f}%" if share else f"{v:,.0f}"
                for v, r in zip(values, raw, strict=True)
            ]
            _bar_labels(ax, y, values, texts)
            _spec_axis(ax, names)
            ax.set_title(title, loc="left", fontsize=10, y=1.0)
            ax.set_xlabel(unit)
            if share:
                _percent_axis(ax)
                last = "100%"
            else:
                right = max(1.0, max(values, default=0.0) * 1.25)
                ax.set_xlim(0, right)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
                ax.xaxis.set_major_formatter(_tokens_axis())
                last = tokens_label(right)
            widest_last = max(widest_last, last, key=len)
        fit = _Fit(fig)
        fig.suptitle(LOSS_SUPTITLE, fontsize=11, y=1 - EDGE / fit.height)
        # Every panel has the same texts' heights (a title of 10 pt, a tick row, a label):
        # the rows share one height, the columns one width.
        name_w = fit.widest(names) + TICK
        title_h = fit.text(LOSS_PANELS[0][1], 10)[1] + TITLEPAD
        under = fit.text("0")[1] + TICK + fit.text(LOSS_PANELS[0][2])[1] + LABELPAD
        overhang = fit.text(widest_last)[0] / 2
        top = EDGE + fit.text(LOSS_SUPTITLE, 11)[1] + EDGE + title_h
        w, h = fit.width, fit.height
        panel_w = (w - 2 * EDGE - 2 * name_w - 2 * overhang - 2 * EDGE) / 2
        panel_h = (h - top - EDGE - 2 * under - title_h - EDGE) / 2
        for i, ax in enumerate(axes):
            row, col = divmod(i, 2)
            left = EDGE + name_w + col * (panel_w + overhang + 2 * EDGE + name_w)
            bottom = h - top - panel_h - row * (panel_h + under + EDGE + title_h)
            ax.set_position((left / w, bottom / h, panel_w / w, panel_h / h))
        return png_bytes(fig)


# -- per session --------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """A horizontal limit drawn on a session chart; `spans`, where the limit changed
    within the session (a client that went from a 1M to a 200k window), each (first
    request, last request, tokens) it held over, in order."""

    label: str
    tokens: int
    style: str
    spans: tuple[tuple[int, int, int], ...] = ()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _tokens_of(value: float, window: int) -> int:
    """A parameter's threshold in tokens: fractions (at most 1) are of the window."""
    return round(value * window) if 0 < value <= 1 else round(value)


def stated_lines(rows: pl.DataFrame) -> list[Line]:
    """The limits the policy stated for these rows (one spec, one session: the
    `threshold_tokens` and `blocking_tokens` columns, simulator/policy.py `Limits`): the
    first threshold it worked to (a breaker or thrashing may switch it off later) and its
    blocking limit. Empty where the policy states none, or the rows predate the columns."""
    lines: list[Line] = []
    requests = rows["request"].to_list()
    for column, label, style in (
        ("threshold_tokens", "compaction threshold", "--"),
        ("blocking_tokens", "blocking limit", ":"),
    ):
        if column not in rows.columns:
            continue
        values = rows[column].drop_nulls()
        if len(values) and int(values[0]) > 0:
            spans = _spans(requests, rows[column].to_list())
            changed = len({t for _, _, t in spans}) > 1
            lines.append(Line(label, int(values[0]), style, spans if changed else ()))
    return sorted(lines, key=lambda line: (-line.tokens, line.label))


def _spans(requests: list[int], values: list[Any]) -> tuple[tuple[int, int, int], ...]:
    """(first request, last request, value) of each run of one positive value, in order
    (rows where the limit is off or unstated end a run)."""
    spans: list[tuple[int, int, int]] = []
    for k, value in zip(requests, values, strict=True):
        if value is None or value <= 0:
            continue
        if spans and spans[-1][2] == value and spans[-1][1] >= k - 1:
            spans[-1] = (spans[-1][0], k, value)
        else:
            spans.append((k, k, int(value)))
    return tuple(spans)


def policy_lines(params: dict[str, Any], window: int) -> list[Line]:
    """Thresholds and blocking limits of a policy that states no limits of its own, from
    its parameters: a parameter `threshold`, `*_threshold` or `blocking_limit` under any
    stage prefix (tokens; a fraction of the window when at most 1), unless the stage's
    `enabled` is false."""
    lines: dict[tuple[str, int], Line] = {}

    def add(kind: str, label: str, tokens: int, style: str) -> None:
        if tokens > 0:
            lines[(kind, tokens)] = Line(label, tokens, style)

    off = {k.rsplit(".", 1)[0] for k, v in params.items() if k.endswith("enabled") and not v}
    for key, value in sorted(params.items()):
        stage, _, leaf = key.rpartition(".")
        amount = _number(value)
        if amount is None or amount <= 0 or (stage and stage in off):
            continue
        name = stage or "compaction"
        if leaf == "threshold" or leaf.endswith("_threshold"):
            add("t", f"{name} threshold", _tokens_of(amount, window), "--")
        elif leaf == "blocking_limit":
            add("b", f"{name} blocking limit", _tokens_of(amount, window), ":")
    return sorted(lines.values(), key=lambda line: (-line.tokens, line.label))


def spec_params(manifest: dict[str, Any]) -> dict[Spec, dict[str, Any]]:
    """Every spec's parameters from the manifest, keyed as rows name the spec: (variant name
    if it has one, else policy name; parameter hash)."""
    return {
        (p.get("variant") or p["name"], p["params_hash"]): p.get("params", {})
        for p in manifest.get("policies", [])
    }


def session_keys(requests: pl.DataFrame, limit: int) -> list[tuple[str, int]]:
    """The sessions worth a chart, at most `limit`: those where something happened
    (compaction, overflow, breaker trip) first, then the longest; ties by key."""
    events = ((pl.col("kind") == "compaction") | pl.col("overflow") | pl.col("breaker_trip")).cast(
        pl.Int64
    )
    if "after_compaction" in requests.columns:
        events = events + pl.col("after_compaction").cast(pl.Int64)
    ranked = (
        requests.group_by("trace", "session_index")
        .agg(events.sum().alias("events"), pl.len().alias("calls"))
        .with_columns((pl.col("events") > 0).alias("eventful"))
        .sort(
            ["eventful", "calls", "trace", "session_index"],
            descending=[True, True, False, False],
        )
        .head(limit)
    )
    return [(r[0], r[1]) for r in ranked.select("trace", "session_index").iter_rows()]


def short_id(text: str, keep: int = 18) -> str:
    return text if len(text) <= keep else text[: keep - 1] + "…"


def _marker(marker: str, label: str, **style: Any) -> Line2D:
    """A legend entry for a marker shape (events are told apart by shape; the colour of a
    marker on the chart is its policy's)."""
    from matplotlib.lines import Line2D

    style = {"color": "#444444", **style}
    return Line2D([], [], ls="none", marker=marker, label=label, **style)


#: The session chart's key, in points of its 8 pt font: matplotlib's legend defaults
#: (handle length 2, pad to the text 0.8, rows 0.5 apart, columns 2, border 0.4, handle
#: height 0.7, one marker per entry).
KEY_SIZE = 8.0
KEY_HANDLE, KEY_PAD, KEY_ROWS, KEY_COLUMNS, KEY_BORDER, KEY_HEIGHT = 2.0, 0.8, 0.5, 2.0, 0.4, 0.7
#: Pixels a session chart keeps beside its key for the axes and their labels: a key that
#: leaves fewer (many specs' long names and limits) widens the figure instead.
KEY_AXES = 620.0


def _key(ax: Axes, fit: _Fit, handles: Sequence[Line2D], top: float) -> float:
    """Draw the key of a session chart at the figure's right edge, its top at the axes'
    top (`top` pixels down), as a column of entries (more columns where one is taller
    than the figure); returns the room it takes (its width and a gap).

    Drawn as plain lines and texts, laid out here once: a matplotlib Legend packs its
    boxes again at every draw, a quarter of a session chart's time (23 of 87 ms, issue
    16). Each entry shows its handle's line (2 em) and marker (one, in the middle) as the
    chart draws them, then its label."""
    from matplotlib.lines import Line2D
    from matplotlib.text import Text
    from matplotlib.transforms import IdentityTransform

    em = KEY_SIZE * PX
    labels = [str(h.get_label()) for h in handles]
    height = max(fit.text("lp", KEY_SIZE)[1], KEY_HEIGHT * em)
    pitch = height + KEY_ROWS * em
    room = fit.height - top - EDGE - 2 * KEY_BORDER * em
    per_column = max(1, int((room + KEY_ROWS * em) // pitch))
    columns = [labels[i : i + per_column] for i in range(0, len(labels), per_column)]
    widths = [(KEY_HANDLE + KEY_PAD) * em + fit.widest(c, KEY_SIZE) for c in columns]
    width = sum(widths) + KEY_COLUMNS * em * (len(columns) - 1) + 2 * KEY_BORDER * em
    if fit.width - width - 3 * EDGE < KEY_AXES:  # a key this wide widens the figure
        fit.width = width + 3 * EDGE + KEY_AXES
        fit.fig.set_size_inches(fit.width / fit.fig.dpi, fit.height / fit.fig.dpi)
    pixels = IdentityTransform()

    def add(artist: Line2D | Text, like: Line2D | None = None) -> None:
        if like is not None:
            artist.update_from(like)  # its colour, width, style and marker (and transform)
        artist.set_transform(pixels)
        ax.add_artist(artist)
        artist.set_clip_on(False)  # outside the axes, which clip what they hold

    x = fit.width - EDGE - width + KEY_BORDER * em
    for c, column in enumerate(columns):
        for r in range(len(column)):
            handle = handles[c * per_column + r]
            y = fit.height - top - KEY_BORDER * em - r * pitch - height / 2
            if handle.get_linestyle() not in ("None", "none", "", " "):
                line = Line2D([x, x + KEY_HANDLE * em], [y, y])
                add(line, handle)
                line.set_marker("None")
            if handle.get_marker() not in (None, "None", "none", "", " "):
                mark = Line2D([x + KEY_HANDLE * em / 2], [y])
                add(mark, handle)
                mark.set_linestyle("None")
            label = x + (KEY_HANDLE + KEY_PAD) * em
            add(Text(label, y, column[r], fontsize=KEY_SIZE, va="center"))
        x += widths[c] + KEY_COLUMNS * em
    return EDGE + width + 2 * EDGE


_SESSION_AXES: list[tuple[Figure, Axes]] = []


def _session_axes() -> tuple[Figure, Axes]:
    """The figure and axes session charts are drawn on, made once per process and cleared
    of the last chart's lines, markers, texts and legend (issue 16): a new figure and axes
    cost a fifth of a chart, the ticks an axis creates for its first draw another fifth,
    and a kept axis keeps its ticks (redrawn, relabelled and placed at every draw). What a
    chart sets (limits, locators, formatters, labels, title, position) it sets every time,
    so a chart's bytes do not depend on the charts this process drew before it
    (tests/reports/test_charts.py draws one after others and alone)."""
    if not _SESSION_AXES:
        fig = _new_figure(10, 4.4)
        _SESSION_AXES.append((fig, fig.add_subplot()))
    fig, ax = _SESSION_AXES[0]
    fig.set_size_inches(10, 4.4)  # a wide key may have widened it (`_key`)
    for artist in [*ax.lines, *ax.collections, *ax.texts, *ax.artists]:
        artist.remove()
    legend = ax.get_legend()
    if legend is not None:
        legend.remove()
    ax.ignore_existing_data_limits = True
    return fig, ax


def session_window(rows: pl.DataFrame) -> int:
    """The largest context window of the session's models (simulator/models.py): the line
    a session chart draws at the top."""
    from simulator.models import facts

    return max(facts(m).window for m in rows["model"].unique().sort().to_list())


def session_chart(
    rows: pl.DataFrame,
    manifest: dict[str, Any],
    *,
    title: str | None = None,
    window: int | None = None,
) -> bytes:
    """Context size over the requests of one session, every policy spec of the run.

    Lines: each spec's context per request; the model's window; the thresholds and
    blocking limits each spec stated for this session (else those its parameters name).
    Markers: compaction calls (one shape per stage), requests right after a compaction
    (including the recording's own under as-recorded), overflows and breaker trips.
    `window`: `session_window(rows)`, where the caller has it (a chart worker then needs
    no model table: simulator/models.py imports the price data, 0.2 s).
    """
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    rows = rows.sort("request", "call", "policy", "params_hash")
    all_specs = specs(rows)
    labels = spec_labels(all_specs)
    params = spec_params(manifest)
    window = window or session_window(rows)
    context_max = int(rows["context_tokens"].max() or 0)  # type: ignore[arg-type]
    stages = sorted(s for s in rows.filter(pl.col("kind") != "request")["stage"].unique())
    markers = {s: STAGE_MARKERS[i % len(STAGE_MARKERS)] for i, s in enumerate(stages)}
    contexts: list[Line2D] = []
    events: dict[str, Line2D] = {}
    limits: list[tuple[Line, str]] = [
        (Line(f"window {tokens_label(window)}", window, "-"), "#777777")
    ]
    with _style():
        fig, ax = _session_axes()
        for i, spec in enumerate(all_specs):
            color = POLICY_COLORS[i % len(POLICY_COLORS)]
            mine = rows.filter((pl.col("policy") == spec[0]) & (pl.col("params_hash") == spec[1]))
            # The rows as lists, the markers' rows picked from them: a few hundred rows,
            # where a polars filter per marker kind cost more than drawing it (issue 16).
            x, y = mine["request"].to_list(), mine["context_tokens"].to_list()
            kind, stage_of = mine["kind"].to_list(), mine["stage"].to_list()
            flags = {
                c: mine[c].to_list() if c in mine.columns else [False] * mine.height
                for c in ("after_compaction", "overflow", "breaker_trip")
            }
            req = [j for j, k in enumerate(kind) if k == "request"]
            # Earlier specs are drawn wider, so a later spec on the same values leaves them
            # visible as a border.
            (line,) = ax.plot(
                [x[j] for j in req],
                [y[j] for j in req],
                color=color,
                lw=max(1.2, 3.2 - 1.0 * i),
                marker="." if len(req) < 30 else None,
                label=f"{labels[spec]}: context",
                zorder=3 + 0.1 * i,
            )
            contexts.append(line)

            def scatter(
                picked: list[int], x: list[Any] = x, y: list[Any] = y, **style: Any
            ) -> None:
                ax.scatter([x[j] for j in picked], [y[j] for j in picked], zorder=5, **style)

            for stage in stages:
                calls = [j for j, k in enumerate(kind) if k != "request" and stage_of[j] == stage]
                if calls:
                    label = f"compaction call: {stage or 'unnamed'}"
                    scatter(
                        calls,
                        marker=markers[stage],
                        s=48,
                        color=color,
                        edgecolors="black",
                        linewidths=0.6,
                    )
                    events[label] = _marker(
                        markers[stage], label, markeredgecolor="black", markersize=7
                    )
            if "after_compaction" in mine.columns:
                after = [j for j in req if flags["after_compaction"][j]]
                if after:
                    label = "first request after a compaction"
                    scatter(
                        after,
                        marker="v",
                        s=44,
                        facecolors="white",
                        edgecolors=color,
                        linewidths=1.4,
                    )
                    events[label] = _marker("v", label, markerfacecolor="white", markersize=7)
            over = [j for j, flag in enumerate(flags["overflow"]) if flag]
            if over:
                scatter(over, marker="X", s=70, color="#D62728", edgecolors=color, linewidths=0.8)
                events["overflow"] = _marker("X", "overflow", color="#D62728", markersize=8)
            trips = [j for j, flag in enumerate(flags["breaker_trip"]) if flag]
            if trips:
                scatter(trips, marker="D", s=42, color="black")
                events["breaker trip"] = _marker("D", "breaker trip", color="black", markersize=6)
            for lim in stated_lines(mine) or policy_lines(params.get(spec, {}), window):
                label = f"{labels[spec]}: {lim.label} {tokens_label(lim.tokens)}"
                if lim.spans:
                    label = f"{labels[spec]}: {lim.label} " + ", ".join(
                        tokens_label(t)
                        + (f" from request {first}" if n else "")
                        + ("" if context_max >= 0.4 * t else " (above the chart)")
                        for n, (first, _, t) in enumerate(lim.spans)
                    )
                limits.append((Line(label, lim.tokens, lim.style, lim.spans), color))
        # A limit far above the data would squash it against the axis: a limit is drawn
        # when the context comes within reach of it, else the legend names it.
        reach = [
            t
            for lim, _ in limits
            for t in ([t for _, _, t in lim.spans] or [lim.tokens])
            if context_max >= 0.4 * t
        ]
        top = max([context_max, *reach])
        limit_handles = []
        for lim, color in limits:
            if lim.spans:  # the limit changed: each value over the requests it held
                for first, end, t in lim.spans:
                    if context_max >= 0.4 * t:
                        ax.hlines(t, first - 0.5, end + 0.5, color=color, lw=1.1, ls=lim.style)
                limit_handles.append(
                    Line2D([], [], color=color, lw=1.1, ls=lim.style, label=lim.label)
                )
            elif context_max >= 0.4 * lim.tokens:
                limit_handles.append(
                    ax.axhline(lim.tokens, color=color, lw=1.1, ls=lim.style, label=lim.label)
                )
            else:
                limit_handles.append(
                    Line2D(
                        [],
                        [],
                        color=color,
                        lw=1.1,
                        ls=lim.style,
                        label=f"{lim.label} (above the chart)",
                    )
                )
        last = int(rows["request"].max() or 0)  # type: ignore[arg-type]
        ax.set_xlim(-0.5, max(last, 1) + 0.5)
        ax.set_ylim(0, max(1, top) * 1.08)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(_tokens_axis())
        xlabel, ylabel = "request (index within the session)", "context (tokens)"
        title = title or "Context size over the session"
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, loc="left", y=1.0)
        handles = [*contexts, *limit_handles, *events.values()]
        fit = _Fit(fig)
        _, bottom, top_px = fit.margins(ylabels=[], xlabel=xlabel, title=title)
        room = max(_key(ax, fit, handles, top_px), EDGE + fit.text(str(last))[0] / 2)
        # The y ticks depend on the axes' height only: placed at its height first, the
        # axis says which labels it will draw, and they set the left margin.
        fit.place(ax, 0.0, bottom, room, top_px)
        shown = [v for v in ax.yaxis.get_majorticklocs() if 0 <= v <= ax.get_ylim()[1]]
        left, _, _ = fit.margins(ylabels=[tokens_label(v) for v in shown], ylabel=ylabel)
        fit.place(ax, left, bottom, room, top_px)
        if not events:
            ax.text(
                0.01,
                0.98,
                "no compaction, overflow or breaker trip",
                transform=ax.transAxes,
                va="top",
                fontsize=8,
                color="#555555",
            )
        return png_bytes(fig)


# -- two runs -----------------------------------------------------------------------------


def compare_chart(
    baseline: pl.DataFrame,
    candidate: pl.DataFrame,
    pairs: Sequence[tuple[Spec, Spec, str]],
) -> bytes:
    """Two runs side by side for each compared spec pair (baseline spec, candidate spec,
    label): cost stacked by component, cache hit ratio, compactions and overflows.
    Constrained layout: drawn once per `ctxsim compare`, its two-line names and legends
    under the panels are the layout engine's to fit."""
    from matplotlib.ticker import MaxNLocator

    from simulator.frames import policy_summary

    def pick(frame: pl.DataFrame, spec: Spec) -> pl.DataFrame:
        return frame.filter((pl.col("policy") == spec[0]) & (pl.col("params_hash") == spec[1]))

    base_cost, cand_cost = cost_components(baseline), cost_components(candidate)
    base_sum, cand_sum = policy_summary(baseline), policy_summary(candidate)
    # Bars top to bottom: each pair's baseline, then its candidate.
    names: list[str] = []
    cost_rows: list[pl.DataFrame] = []
    summary_rows: list[dict[str, Any]] = []
    for b, c, label in pairs:
        for tag, spec, cost, summ in (
            ("baseline", b, base_cost, base_sum),
            ("candidate", c, cand_cost, cand_sum),
        ):
            names.append(f"{tag}: {spec[0]}" if len(pairs) == 1 else f"{label}\n{tag}")
            cost_rows.append(pick(cost, spec))
            summary_rows.append(pick(summ, spec).row(0, named=True))
    costs = pl.concat(cost_rows)
    y = list(range(len(names)))
    top = max(_totals(costs), default=0.0)
    with _style():
        fig = _new_figure(12, 1.9 + 0.55 * len(names), layout="constrained")
        ax_cost, ax_hit, ax_events = fig.subplots(1, 3, width_ratios=[1.5, 1.0, 1.1], sharey=True)
        handles = _stacked(ax_cost, y, costs, 0.62)
        _spec_axis(ax_cost, names)
        ax_cost.set_xlim(0, top * 1.25 if top > 0 else 1.0)
        _money_axis(ax_cost, top)
        ax_cost.set_xlabel("cost (USD, all sessions)")
        ax_cost.set_title("Cost by component", loc="left", fontsize=10)
        ax_cost.legend(
            handles,
            [label for _, label, _ in COMPONENTS],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.22),
            ncols=3,
        )
        hits = [100 * (r["cache_hit_ratio"] or 0.0) for r in summary_rows]
        ax_hit.barh(y, hits, 0.62, color=["#9CC3A4", "#2E7D46"] * len(pairs))
        _bar_labels(ax_hit, y, hits, [f"{v:.1f}%" for v in hits])
        _percent_axis(ax_hit)
        ax_hit.set_xlabel("cache read / prompt tokens")
        ax_hit.set_title("Cache hit ratio", loc="left", fontsize=10)
        series = {
            "compaction calls": [float(r["compactions"]) for r in summary_rows],
            "overflows": [float(r["overflows"]) for r in summary_rows],
        }
        _grouped(ax_events, names, series, EVENT_COLORS)
        peak = max((max(v) for v in series.values()), default=0.0)
        ax_events.set_xlim(0, max(1.0, peak * 1.2))
        ax_events.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_events.set_xlabel("count (calls)")
        ax_events.set_title("Compactions and overflows", loc="left", fontsize=10)
        ax_events.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
        if peak == 0:
            _empty_note(ax_events, "none in either run")
        fig.suptitle("Baseline and candidate side by side", fontsize=11)
        return png_bytes(fig)


# -- a whole run --------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def session_file(trace: str, session_index: int) -> str:
    """The chart file of a session: named by trace and index, nothing else."""
    return f"sessions/{_UNSAFE.sub('_', trace)}.{session_index}.png"


#: The per-run charts by file name under charts/, in the report's order, and what draws
#: each (None: the run has nothing for it).
RUN_CHARTS: dict[str, Callable[[RunFigures], bytes | None]] = {
    "cost_by_policy.png": _cost_chart,
    "cache_hit_ratio.png": _hit_chart,
    "events_by_policy.png": _events_chart,
    "loss_by_policy.png": _loss_chart,
}


def _run_chart(name: str, run: RunFigures) -> bytes | None:
    return RUN_CHARTS[name](run)


def run_charts(requests: pl.DataFrame, *, pool: ChartPool | None = None) -> dict[str, bytes]:
    """The per-run charts, by file name under charts/; drawn by `pool`'s workers if given."""
    return run_charts_started(requests, pool)()


def run_charts_started(
    requests: pl.DataFrame, pool: ChartPool | None
) -> Callable[[], dict[str, bytes]]:
    """`run_charts`, started now on `pool`'s workers (drawn here at the call without one);
    returns what gives them. A report submits them before its session charts: each is a
    first of its kind in a worker (the bars, the grouped legend), 60-120 ms against 40-50
    for a session chart, and queued last they were the tail every other worker waited on
    (0.16 s after the last session chart, `ctxsim run --policy claude-code` on the shared
    Claude Code corpus)."""
    run = RunFigures.of(requests)
    if pool is None:
        return lambda: _present({name: draw(run) for name, draw in RUN_CHARTS.items()})
    pending = {name: pool.draw(_run_chart, name, run) for name in RUN_CHARTS}
    return lambda: _present({name: result() for name, result in pending.items()})


def _present(drawn: dict[str, bytes | None]) -> dict[str, bytes]:
    return {name: png for name, png in drawn.items() if png is not None}


def session_title(rows: pl.DataFrame) -> str:
    """Two short lines: trace and session index; session id (where the trace name does not
    already say it) and models. Long ids are cut: the report's caption has them whole."""
    first = rows.row(0, named=True)
    trace, session = first["trace"], first["session"]
    models = ", ".join(rows["model"].unique().sort().to_list())
    detail = models if trace.startswith(session) else f"{short_id(session, 30)}, {models}"
    return f"Context over session #{first['session_index']} of {short_id(trace, 44)}\n{detail}"


#: Without a `ChartPool` (`ctxsim report`), from this many session charts on a worker
#: process draws some of them. A worker is ready about 1.4 s after the call (a fork server
#: importing matplotlib and polars), and a command waits at its exit for a worker to
#: finish. Measured with the whole `ctxsim run --policy claude-code` on the shared Claude
#: Code corpus (a loaded 2-core machine), when a chart took 0.15-0.25 s (before the fixed
#: layout): 12 session charts 4.8-5.7 s with a worker against 4.4-5.0 s without; 40
#: charts 6.1 s against 7.7-8.6 s. Not measured again since charts take 70-100 ms.
PARALLEL_MIN = 24


def chart_workers(n_charts: int, jobs: int = 0) -> int:
    """Worker processes for `n_charts` session charts beside this one: `jobs` - 1 (0: one
    per other core this process may run on), none below PARALLEL_MIN charts."""
    if n_charts < PARALLEL_MIN:
        return 0
    if jobs <= 0:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        jobs = jobs or os.cpu_count() or 1
    return max(0, min(jobs - 1, n_charts // 2))


#: The columns a session chart reads (what a worker is sent of a session's rows).
SESSION_COLUMNS = (
    "trace",
    "session",
    "session_index",
    "request",
    "call",
    "kind",
    "stage",
    "policy",
    "params_hash",
    "model",
    "context_tokens",
    "overflow",
    "breaker_trip",
    "after_compaction",
    "threshold_tokens",
    "blocking_tokens",
)


def _session_png(rows: pl.DataFrame, manifest: dict[str, Any], window: int | None = None) -> bytes:
    return session_chart(rows, manifest, title=session_title(rows), window=window)


def session_charts(
    requests: pl.DataFrame,
    manifest: dict[str, Any],
    keys: Sequence[tuple[str, int]],
    *,
    jobs: int = 0,
    pool: ChartPool | None = None,
) -> Iterator[tuple[str, bytes]]:
    """(file name, PNG) of each chosen session, in the order of `keys`, one at a time (so a
    caller can show progress). Workers, if any, start at the call: a caller that draws
    other charts before iterating has them drawing meanwhile.

    With `pool` (workers started earlier, `ChartPool`), its workers draw every chart, the
    longest sessions first (so the last to finish is a short one), and this process waits
    for each in order. Else, with many charts (`chart_workers`), worker processes draw them
    as well: they take the charts from the last, this process draws from the first, and it
    uses a worker's chart where the worker has finished it when this process gets there
    (never waiting for one). A chart is a pure function of its rows and the manifest, drawn
    with the same settings and bundled font in every process, so the bytes do not depend
    on which process drew it (tests/reports/test_charts.py). Workers come from a fork server (a
    fresh interpreter: a process forked from one that has used polars can hang in it;
    simulator/app/sweep.py `start_method`), else are spawned."""
    columns = [c for c in SESSION_COLUMNS if c in requests.columns]
    work = [
        (
            session_file(trace, index),
            requests.filter((pl.col("trace") == trace) & (pl.col("session_index") == index)).select(
                columns
            ),
        )
        for trace, index in keys
    ]
    if pool is not None:
        longest = sorted(range(len(work)), key=lambda i: (-work[i][1].height, i))
        pending = {
            i: pool.draw(_session_png, work[i][1], manifest, session_window(work[i][1]))
            for i in longest
        }
        return ((name, pending[i]()) for i, (name, _) in enumerate(work))
    workers = chart_workers(len(work), jobs)
    if not workers:
        return ((name, _session_png(rows, manifest)) for name, rows in work)
    pool_here = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
    # Submitted now, last first (the workers start from the end of the list), so the
    # workers start while the caller draws something else.
    futures = [pool_here.submit(_session_png, rows, manifest) for _, rows in reversed(work)]
    return _collected(pool_here, futures[::-1], work, manifest)


def _context() -> Any:
    """A fork server that has imported the charts' modules once for every worker, else
    spawn (see `session_charts`). A fork server already running (started by a sweep in
    the same process) keeps its own preload: workers then import matplotlib themselves."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(list(PRELOAD))
    return context


#: What a chart worker imports before it is asked for a chart.
PRELOAD = (
    "reports.charts",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "matplotlib.ticker",
    "matplotlib.legend",
    "PIL.PngImagePlugin",
)


def _warm() -> None:
    """Draw a two-request session chart in a worker waiting for its first chart: a process'
    first chart pays for loading the font, the text and glyph caches and the shared
    session axes' ticks (134 ms against 80-100 for the next ones, measured on the shared
    Claude Code corpus), and a worker started before the replay has the time."""
    rows = pl.DataFrame(
        {
            "trace": ["warm", "warm"],
            "session": ["warm", "warm"],
            "session_index": [0, 0],
            "request": [0, 1],
            "call": [0, 1],
            "kind": ["request", "compaction"],
            "stage": [None, "warm"],
            "policy": ["warm", "warm"],
            "params_hash": ["0", "0"],
            "model": ["warm", "warm"],
            "context_tokens": [1_000, 2_000],
            "overflow": [False, True],
            "breaker_trip": [False, True],
            "after_compaction": [False, True],
        }
    )
    _session_png(rows, {"policies": []}, window=2_500)


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


#: A run whose report has at least this many charts gets its chart workers before the
#: replay (`ChartPool`, `pool_pays`). Below it this process draws them: a fork server
#: takes 0.6-0.7 s of CPU to start (a fresh interpreter importing polars and matplotlib,
#: measured in `ctxsim run`), more than a few charts at 70-100 ms and the import here, and
#: a small run's replay is too short to hide it. A judgement, not a fitted figure: the
#: tests' two-session runs (6 charts) stay in one process.
POOL_MIN_CHARTS = 8


def pool_pays(sessions: int, session_limit: int) -> bool:
    """Whether a run of this many sessions, charting at most `session_limit` of them, should
    start chart workers before its replay (POOL_MIN_CHARTS)."""
    return len(RUN_CHARTS) + min(sessions, session_limit) >= POOL_MIN_CHARTS


T = TypeVar("T")


class ChartPool:
    """Chart workers started before there is anything to draw (issue 16).

    `ctxsim run` starts them before its replay: while it replays on one core, the fork
    server imports polars and matplotlib on the other and forks the workers, which draw a
    first chart (`_warm`). When the rows are written, the workers draw every chart (run and
    session charts; this process never imports matplotlib) and this process builds the
    page. One worker per core the process may run on: this process only waits while they
    draw. Where the workers are gone (killed, or a caller's script that starts processes
    when imported, with no `if __name__ == "__main__"` guard) a chart is drawn here:
    the same bytes (tests/reports/test_charts.py)."""

    def __init__(self, workers: int = 0) -> None:
        self.workers = workers if workers > 0 else _cores()
        context = _context()
        start_fork_server(context)  # deaf to Ctrl-C while it imports (simulator/workers.py)
        self._pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=worker_start,  # Ctrl-C as usual, and never outlive this process
        )
        # Starting a worker waits for the fork server to have imported PRELOAD (1.0-1.4 s,
        # measured in `ctxsim run`): a thread waits for it, the replay goes on.
        self._starting = threading.Thread(target=self._start, daemon=True)
        self._starting.start()

    def _start(self) -> None:
        with contextlib.suppress(BrokenProcessPool, RuntimeError):
            for _ in range(self.workers):  # one task each: every worker starts now
                self._pool.submit(_warm)

    def draw(self, fn: Callable[..., T], *args: Any) -> Callable[[], T]:
        """Start `fn(*args)` in a worker; returns what gives its result (drawn here when
        the workers are gone)."""
        self._starting.join()
        try:
            future: Future[T] = self._pool.submit(fn, *args)
        except (BrokenProcessPool, RuntimeError):
            return lambda: fn(*args)

        def result() -> T:
            try:
                return future.result()
            except (BrokenProcessPool, CancelledError):
                return fn(*args)

        return result

    def close(self) -> None:
        """Stop the workers. Waited for: once the report is drawn they are idle and stop at
        once (a pool left to stop on its own as the interpreter exits can print an
        `OSError` from its wake-up pipe, CPython 3.11); a command failing before its
        report waits for them to finish starting."""
        self._starting.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ChartPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collected(
    pool: ProcessPoolExecutor,
    futures: list[Future[bytes]],
    work: list[tuple[str, pl.DataFrame]],
    manifest: dict[str, Any],
) -> Iterator[tuple[str, bytes]]:
    """The charts in order: a worker's where it has finished one, else drawn here (a chart
    a worker has not finished is not waited for: on a machine whose cores are busy the
    worker may be far behind, and this process draws it as fast). Here too when the
    workers died (e.g. a caller's script that starts processes when imported, with no
    `if __name__ == "__main__"` guard: its workers cannot start)."""
    try:
        for future, (name, rows) in zip(futures, work, strict=True):
            png = None
            if future.done() and not future.cancelled():
                with contextlib.suppress(BrokenProcessPool):
                    png = future.result()
            else:
                future.cancel()
            yield name, png if png is not None else _session_png(rows, manifest)
    finally:
        # The charts still queued are not needed; the ones in hand are waited for (a
        # few tenths of a second), as a pool left running prints an OSError at exit.
        pool.shutdown(wait=True, cancel_futures=True)
