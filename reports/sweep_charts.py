"""Charts of a sweep and of a tuning study, drawn from their Parquet files and manifest.

A sweep is read through its cells table (simulator/app/sweep.py `cells_frame`: one row per
cell, a column per grid parameter, the cell's figures): a line chart per grid parameter
(cost, compactions, overflows and breaker trips against the parameter, one line per
policy), a cost-against-loss chart per grid parameter (the trade-off a setting makes:
dollars against each loss proxy, issue 14) and, where two parameters vary, a cost heatmap
per policy. Along one parameter every other grid parameter is held at the policy's own
value (the value it has without the grid; the nearest grid value when its own is not on
the grid), never at the first grid value (issue 15: buffer=0 is nobody's setting). A study
is drawn from its trials table (simulator/app/tune.py `trials_frame`), a multi-objective
study's Pareto front from its front table. Same reproducibility rules as
reports/charts.py: bundled font, no metadata, fixed sizes, no time or path, so the same
inputs give identical PNG bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast

import matplotlib
import polars as pl
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import IdentityTransform

from reports.charts import (
    EDGE,
    LABELPAD,
    POLICY_COLORS,
    RC,
    TICK,
    TITLEPAD,
    _Fit,
    dollars_label,
    png_bytes,
    tokens_label,
)
from simulator.frames import grid_keys

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.colorbar import Colorbar
    from matplotlib.legend import Legend

#: (cells-table column, panel title, y label) of a parameter chart, in panel order.
PANELS: tuple[tuple[str, str, str], ...] = (
    ("cost_total", "Cost", "USD, all sessions"),
    ("compactions", "Compaction calls", "calls"),
    ("overflows", "Overflows", "requests over the window"),
    ("breaker_trips", "Breaker trips", "trips"),
)
MARKERS = ("o", "s", "^", "D", "v", "P")
#: Line styles by policy: a later policy's line stays visible on top of an equal earlier one.
DASHES = ("-", "--", "-.", ":")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def chart_name(*keys: str) -> str:
    """A file name from parameter names (dots kept, anything odd replaced)."""
    return "-vs-".join(_UNSAFE.sub("_", k) for k in keys)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _value_label(value: Any) -> str:
    if _is_number(value):
        return tokens_label(float(value)) if abs(value) >= 1000 else f"{value:g}"
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _axis_values(values: Sequence[Any]) -> tuple[list[Any], bool]:
    """Distinct values in plotting order, and whether the axis is numeric."""
    distinct = list(dict.fromkeys(values))
    numeric = all(_is_number(v) for v in distinct)
    return (sorted(distinct) if numeric else distinct), numeric


def varying(cells: pl.DataFrame) -> list[str]:
    """Grid parameters taking at least two values."""
    return [k for k in grid_keys(cells) if cells[k].drop_nulls().n_unique() >= 2]


def _held_value(values: list[Any], own: Any) -> tuple[Any, bool]:
    """The grid value to hold a parameter at: the policy's own when it is on the grid (True),
    else the nearest numeric grid value (the lower of two equally near), else the first."""
    if any(v == own and type(v) is type(own) for v in values):
        return own, True
    numbers = [v for v in values if _is_number(v)]
    if _is_number(own) and numbers:
        return min(numbers, key=lambda v: (abs(float(v) - float(own)), float(v))), False
    return values[0], False


def _section(
    cells: pl.DataFrame,
    policy: str,
    keys: Sequence[str],
    own: dict[str, Any] | None = None,
    names: dict[str, str] | None = None,
) -> tuple[pl.DataFrame, str]:
    """The policy's cells along `keys`, every other grid parameter held at the policy's own
    value (`own`: column -> value; see `_held_value`); and a note saying which values those
    are ("" when none), a value not the policy's own marked with what its own is."""
    rows = cells.filter(pl.col("policy") == policy)
    for k in keys:
        rows = rows.filter(pl.col(k).is_not_null())
    if rows.is_empty():
        return rows, ""
    held = []
    for k in grid_keys(cells):
        present = rows[k].drop_nulls()
        if k in keys or present.is_empty() or present.n_unique() < 2:
            continue
        values, _numeric = _axis_values(present.to_list())
        value, exact = _held_value(values, (own or {}).get(k, values[0]))
        rows = rows.filter(pl.col(k) == value)
        note = f"{(names or {}).get(k, k)}={_value_label(value)}"
        if not exact and own and k in own:
            note += f" (own {_value_label(own[k])} not on the grid)"
        held.append(note)
    return rows, ", ".join(held)


def _count_axis(ax: Axes) -> None:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    low, high = ax.get_ylim()
    ax.set_ylim(min(0.0, low), max(1.0, high))


def _money(value: float, span: float) -> str:
    """Dollars with as many decimals as a range of `span` dollars needs to tell values apart
    ($196.42 beside $199.05, not $196 and $199 twice)."""
    decimals = 0 if span >= 50 else 1 if span >= 5 else 2 if span >= 0.05 else 4
    return f"${value:,.{decimals}f}"


def _money_axis(ax: Axes) -> None:
    def label(value: float, _pos: int | None) -> str:
        low, high = ax.get_ylim()
        return _money(value, abs(high - low))

    ax.yaxis.set_major_formatter(FuncFormatter(label))


def _x_axis(ax: Axes, key: str, order: list[Any], numeric: bool) -> None:
    ax.set_xlabel(key)
    if numeric:
        if max(abs(float(v)) for v in order) >= 1000:
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens_label(v)))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    else:
        ax.set_xticks(range(len(order)), [_value_label(v) for v in order])
        ax.set_xlim(-0.5, len(order) - 0.5)


def _styles(policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {
        p: {
            "color": POLICY_COLORS[i % len(POLICY_COLORS)],
            "marker": MARKERS[i % len(MARKERS)],
            "ls": DASHES[i % len(DASHES)],
        }
        for i, p in enumerate(policies)
    }


# -- layout ---------------------------------------------------------------------------------
# As the run charts (reports/charts.py `_Fit`): each chart's axes are placed from the measured
# sizes of its own texts and it is drawn once, where constrained layout computed every tick
# and text for a layout pass and again for the draw (issue 16). Measured on the charts of a
# 20-cell sweep of the shared Claude Code corpus (parameter and loss chart: 0.92-1.06 s of CPU
# with constrained layout, 0.74-0.85 s so) and of a 2x2-parameter sweep of traces/samples
# (five charts with the heatmap: 2.14-2.19 s, 1.69-1.77 s), at load 7-8: a fifth less. The
# rest is matplotlib making the axes, ticks and texts, and drawing them once.


def _tick_texts(axis: Axis) -> list[str]:
    """The major tick labels `axis` draws, its limits final: its locator's ticks inside the
    view (with matplotlib's own tolerance for a tick on an end) as its formatter writes them."""
    low, high = sorted(axis.get_view_interval())
    slack = 1e-10 * max(abs(high - low), 1.0)
    locs = [float(v) for v in axis.get_major_locator()() if low - slack <= v <= high + slack]
    return [t for t in axis.get_major_formatter().format_ticks(locs) if t]


def _wrapped(fit: _Fit, text: str, size: float, room: float) -> str:
    """`text` with each line longer than `room` pixels broken between words, and a word
    longer than that after a dot, an underscore or "=" (a rotated axis label longer than
    its axes ran over the next row's and the title: a policy held at
    "autocompact.buffer_tokens=14k (own 13k not on the grid)")."""
    lines = []
    for line in text.split("\n"):
        pieces: list[tuple[str, str]] = []  # (what joins it to the piece before, piece)
        for k, word in enumerate(line.split(" ")):
            parts = [word]
            if fit.text(word, size)[0] > room:
                parts = [p for p in re.split(r"(?<=[._=])", word) if p]
            pieces += [(" " if k and not j else "", part) for j, part in enumerate(parts)]
        current = pieces[0][1] if pieces else ""
        for joint, piece in pieces[1:]:
            joined = current + joint + piece
            if fit.text(joined, size)[0] <= room:
                current = joined
            else:
                lines.append(current)
                current = piece
        lines.append(current)
    return "\n".join(lines)


def _suptitle(fig: Figure, fit: _Fit, text: str) -> float:
    """The chart's title at its top left; returns the room it takes from the top (pixels)."""
    fig.suptitle(text, fontsize=11, x=EDGE / fit.width, y=1 - EDGE / fit.height, ha="left")
    return EDGE + fit.text(text, 11)[1] + EDGE


def _bottom_legend(
    fig: Figure, fit: _Fit, handles: list[Any], labels: list[str], ncol: int, **options: Any
) -> float:
    """A figure legend centred on the bottom edge, in `ncol` columns, or one where a row of
    them is wider than the figure (a loss chart of two panels: its three long entries ran
    off both sides); returns the room it takes (pixels)."""
    anchor = {"loc": "lower center", "borderaxespad": 0.0, **options}
    anchor["bbox_to_anchor"] = (0.5, EDGE / fit.height)
    anchor["bbox_transform"] = fig.transFigure
    legend: Legend = fig.legend(handles, labels, ncol=ncol, **anchor)
    if ncol > 1 and fit.legend(legend)[0] > fit.width - 2 * EDGE:
        legend.remove()
        legend = fig.legend(handles, labels, ncol=1, **anchor)
    return EDGE + fit.legend(legend)[1] + EDGE


def parameter_chart(
    cells: pl.DataFrame,
    key: str,
    defaults: dict[str, dict[str, Any]],
    names: dict[str, str] | None = None,
    note: str = "",
) -> bytes:
    """Cost, compactions, overflows and breaker trips against one grid parameter (a column
    of the cells table), one line per policy (other grid parameters held at each policy's
    own values); a dotted line at each policy's own value of the parameter (`defaults`:
    policy -> {column: own value}). `names`: column -> parameter, for the labels."""
    names = names or {}
    title = names.get(key, key)
    policies = list(dict.fromkeys(cells["policy"].to_list()))
    style = _styles(policies)
    order, numeric = _axis_values(cells[key].drop_nulls().to_list())
    own_lines = False
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(10.0, 6.6))
        axes = fig.subplots(2, 2, sharex=True).ravel()
        drawn = []
        for policy in policies:
            own = defaults.get(policy, {})
            rows, held = _section(cells, policy, [key], own, names)
            if rows.height == 0:
                continue
            label = f"{policy} ({held})" if held else policy
            rows = rows.sort(key) if numeric else rows
            xs = rows[key].to_list()
            x = xs if numeric else [order.index(v) for v in xs]
            for ax, (column, _title, _unit) in zip(axes, PANELS, strict=True):
                y = [float(v) if v is not None else math.nan for v in rows[column].to_list()]
                ax.plot(x, y, markersize=4, lw=1.5, label=label, **style[policy])
            drawn.append(policy)
            shipped = own.get(key)
            if numeric and _is_number(shipped) and order[0] <= shipped <= order[-1]:
                own_lines = True
                for ax in axes:
                    color = style[policy]["color"]
                    ax.axvline(float(shipped), color=color, ls=":", lw=1.2, alpha=0.8)
        for ax, (column, panel, unit) in zip(axes, PANELS, strict=True):
            ax.set_title(panel, loc="left", fontsize=10)
            ax.set_ylabel(unit)
            if column == "cost_total":
                _money_axis(ax)
            else:
                _count_axis(ax)
        for ax in axes[2:]:
            _x_axis(ax, title, order, numeric)
        handles, labels = axes[0].get_legend_handles_labels()
        if own_lines:
            handles.append(Line2D([], [], color="#555555", ls=":", lw=1.2))
            labels.append("policy's own value")
        wide = max((len(t) for t in labels), default=0) > 36
        if not drawn:
            axes[0].text(0.5, 0.5, "no finished cell", transform=axes[0].transAxes)
        fit = _Fit(fig)
        top = _suptitle(fig, fit, f"Sweep over {title}{note}")
        bottom = _bottom_legend(
            fig,
            fit,
            handles,
            labels,
            (2 if wide else 4) if len(labels) > 1 else 1,
            title="policy (other grid parameters held at)" if wide else None,
        )
        _place_panels(fit, axes, top, bottom, fit.text(title)[1] + LABELPAD)
        return png_bytes(fig)


def _place_panels(
    fit: _Fit, axes: Sequence[Axes], top: float, bottom: float, xlabel: float
) -> None:
    """The parameter chart's 2x2 panels (x shared: tick labels and label on the bottom row
    only): a column as wide as its widest y tick labels and label need, the panel titles
    (10 pt, one line) over each row, the last x tick label's overhang at the right."""
    w, h = fit.width, fit.height
    title = fit.text("Cost", 10)[1] + TITLEPAD
    ticks = _tick_texts(axes[2].xaxis)
    overhang = fit.text(ticks[-1])[0] / 2 if ticks else 0.0
    lefts = []
    for c in (0, 1):
        column = (axes[c], axes[c + 2])
        widest = max(fit.widest(_tick_texts(ax.yaxis)) for ax in column)
        label = max(fit.text(ax.get_ylabel())[1] for ax in column)
        lefts.append(EDGE + widest + TICK + label + LABELPAD)
    gap = overhang + 2 * EDGE
    width = (w - lefts[0] - gap - lefts[1] - overhang - EDGE) / 2
    under = fit.text("0")[1] + TICK + xlabel
    between = TICK + EDGE + title
    height = (h - top - title - between - under - bottom) / 2
    for i, ax in enumerate(axes):
        row, col = divmod(i, 2)
        left = lefts[0] + col * (width + gap + lefts[1])
        y = h - top - title - height - row * (height + between)
        ax.set_position((left / w, y / h, max(width, 0.1 * w) / w, max(height, 0.1 * h) / h))


def heatmap_chart(
    cells: pl.DataFrame,
    x_key: str,
    y_key: str,
    defaults: dict[str, dict[str, Any]] | None = None,
    names: dict[str, str] | None = None,
) -> bytes:
    """Cost over two grid parameters, one panel per policy, on one colour scale; each
    square is labelled with its cost and, where there are any, its overflows and breaker
    trips (other grid parameters held at each policy's own values, `defaults`)."""
    names = names or {}
    own = defaults or {}
    all_sections = {
        p: _section(cells, p, [x_key, y_key], own.get(p, {}), names)
        for p in dict.fromkeys(cells["policy"].to_list())
    }
    policies = [p for p, (rows, _) in all_sections.items() if rows.height]
    xs, _ = _axis_values(cells[x_key].drop_nulls().to_list())
    ys, _ = _axis_values(cells[y_key].drop_nulls().to_list())
    sections = {p: all_sections[p] for p in policies}
    costs = [
        float(v)
        for rows, _ in sections.values()
        for v in rows["cost_total"].to_list()
        if v is not None
    ]
    low, high = min(costs, default=0.0), max(costs, default=1.0)
    norm = Normalize(low, high)
    cmap = matplotlib.colormaps["viridis_r"]
    # Side by side while the squares are few; one above the other when each is wide.
    columns = 1 if len(xs) > 6 else min(3, max(1, len(policies)))
    n_rows = max(1, math.ceil(len(policies) / columns))
    width = 0.8 * len(xs) + 1.6
    height = 0.45 * len(ys) + 1.7
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(
            figsize=(min(18.0, max(6.0, width * columns + 1.2)), max(4.0, height * n_rows + 0.9))
        )
        grid = fig.subplots(n_rows, columns, squeeze=False)
        axes = list(grid.ravel())
        image = None
        for ax, policy in zip(axes, policies, strict=False):
            rows, held = sections[policy]
            values = [[math.nan] * len(xs) for _ in ys]
            texts: dict[tuple[int, int], str] = {}
            for r in rows.iter_rows(named=True):
                i, j = ys.index(r[y_key]), xs.index(r[x_key])
                cost = r["cost_total"]
                values[i][j] = math.nan if cost is None else float(cost)
                text = "-" if cost is None else _money(float(cost), high - low)
                events = []
                if r["overflows"]:
                    events.append(f"{r['overflows']} ovf")
                if r["breaker_trips"]:
                    events.append(f"{r['breaker_trips']} trip")
                texts[(i, j)] = "\n".join([text, *events[:1]]) if events else text
            image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto", origin="lower")
            for (i, j), text in texts.items():
                v = values[i][j]
                dark = not math.isnan(v) and norm(v) > 0.55
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
            ax.set_xticks(range(len(xs)), [_value_label(v) for v in xs], rotation=0)
            ax.set_yticks(range(len(ys)), [_value_label(v) for v in ys])
            ax.set_xlabel(names.get(x_key, x_key))
            ax.set_ylabel(names.get(y_key, y_key))
            ax.grid(False)
            title = policy if not held else f"{policy}\n({held})"
            ax.set_title(title, loc="left", fontsize=9)
        for ax in axes[len(policies) :]:
            ax.set_visible(False)
        bar = None
        if image is not None:
            bar = fig.colorbar(image, cax=fig.add_axes((0.0, 0.0, 0.1, 0.1)))
            bar.set_label("cost (USD, all sessions)")
            bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: dollars_label(v)))
        x_name, y_name = names.get(x_key, x_key), names.get(y_key, y_key)
        fit = _Fit(fig)
        top = _suptitle(fig, fit, f"Cost over {x_name} and {y_name}")
        _place_heatmaps(fit, grid, bar, top)
        return png_bytes(fig)


#: Width of a heatmap chart's colour bar, in pixels.
BAR_WIDTH = 16.0


def _place_heatmaps(fit: _Fit, grid: Any, bar: Colorbar | None, top: float) -> None:
    """The heatmap panels (each with its own tick labels, axis labels and a title of one or
    two lines, 9 pt) in rows of equal panels, and the colour bar at the right, as tall as
    the panels' rows (nine tenths), its dollar ticks and label beside it."""
    w, h = fit.width, fit.height
    rows, columns = grid.shape
    shown = [ax for ax in grid.ravel() if ax.get_visible()] or [grid[0][0]]
    left = EDGE + max(fit.widest(_tick_texts(ax.yaxis)) for ax in shown) + TICK
    left += max(fit.text(ax.get_ylabel())[1] for ax in shown) + LABELPAD
    title = max(fit.text(ax.get_title(loc="left"), 9)[1] for ax in shown) + TITLEPAD
    under = fit.text("0")[1] + TICK + max(fit.text(ax.get_xlabel())[1] for ax in shown)
    under += LABELPAD
    ends = [t for ax in shown for t in (_tick_texts(ax.xaxis)[-1:] or [""])]
    overhang = max(fit.text(t)[0] / 2 for t in ends)
    right = overhang + EDGE
    if bar is not None:
        ticks = fit.widest(_tick_texts(bar.ax.yaxis))
        right = 3 * EDGE + BAR_WIDTH + TICK + ticks + LABELPAD + fit.text(bar.ax.get_ylabel())[1]
        right += EDGE
    gap = overhang + 2 * EDGE
    width = (w - columns * left - (columns - 1) * gap - right) / columns
    height = (h - top - rows * (title + under) - (rows - 1) * EDGE - EDGE) / rows
    for r in range(rows):
        y = h - top - title - height - r * (height + under + EDGE + title)
        for c in range(columns):
            x = left + c * (width + gap + left)
            grid[r][c].set_position(
                (x / w, y / h, max(width, 0.1 * w) / w, max(height, 0.1 * h) / h)
            )
    if bar is not None:
        used = max(1, math.ceil(len(shown) / columns))
        span = used * (height + title + under + EDGE) - title - under - EDGE
        low = h - top - title - span
        x = w - right + 2 * EDGE
        bar.ax.set_position(
            (x / w, (low + 0.05 * span) / h, BAR_WIDTH / w, max(0.9 * span, 0.1 * h) / h)
        )


#: (cells-table column, panel title, x label) of a cost-against-loss chart, in panel order:
#: the loss proxies of simulator/loss.py (reports/METRICS.md, "Loss proxies").
LOSS_PANELS: tuple[tuple[str, str, str], ...] = (
    ("stale_file_refs", "Stale file references", "tool calls naming a file no longer in view"),
    ("resent_tokens", "Re-sent tokens", "prompt tokens not cached, after a compaction"),
    ("summary_share", "Summary share", "share of the context that is summary"),
    ("human_verbatim_share", "Human words kept", "share of the human's tokens kept verbatim"),
)


def _share_axis(ax: Axes, which: str) -> None:
    """Percent ticks with as many decimals as the axis's range needs (1.2%, 1.4%, not 1%
    three times)."""

    def label(value: float, _pos: int | None) -> str:
        low, high = ax.get_xlim() if which == "x" else ax.get_ylim()
        span = abs(high - low)
        decimals = 0 if span >= 0.05 else 1 if span >= 0.005 else 2
        return f"{value:.{decimals}%}"

    (ax.xaxis if which == "x" else ax.yaxis).set_major_formatter(FuncFormatter(label))


def loss_panels(cells: pl.DataFrame) -> list[tuple[str, str, str]]:
    """The loss panels the cells carry values for (none when the rows had no loss)."""
    return [p for p in LOSS_PANELS if p[0] in cells.columns and cells[p[0]].drop_nulls().len()]


def _cheapest(rows: pl.DataFrame, key: str, own: Any) -> int | None:
    """Index of the cheapest priced cell among those with no more overflows than the cell at
    the policy's own value (all cells when it is not on the grid): a setting that saves by
    overflowing more is not a candidate (the overflowing calls fail, reports/METRICS.md)."""
    cells = list(rows.iter_rows(named=True))
    at_own = [r["overflows"] or 0 for r in cells if r[key] == own and type(r[key]) is type(own)]
    bound = max(at_own) if at_own else None
    best: tuple[float, int] | None = None
    for i, r in enumerate(cells):
        if r["cost_total"] is None or (bound is not None and (r["overflows"] or 0) > bound):
            continue
        if best is None or float(r["cost_total"]) < best[0]:
            best = (float(r["cost_total"]), i)
    return None if best is None else best[1]


#: Radius of the own value's ring in points: the marker's size (120 points squared, the
#: square of its diameter) halved, plus half its edge.
_RING_RADIUS = math.sqrt(120) / 2 + 1.4 / 2
_Align = Literal["left", "center", "right"]


class _EndLabel(Annotation):
    """The label of an end of a loss-chart line that gives way to the labels of the marked
    cells (the own value, the cheapest) and to the own value's ring: where a marked cell
    sits next to an end (2.1.221 barely compacts below 13k, so its 2k and 13k cells nearly
    coincide) the end label would be drawn over them. At draw time, when the axes' limits
    and the layout are final, it takes the first of its four places (the usual one, the
    other side vertically, then horizontally, then both) that touches none of them; with
    none free it is left out (the marked label says the same place)."""

    def __init__(
        self, ax: Axes, text: str, xy: tuple[float, float], offset: tuple[int, int], align: _Align
    ) -> None:
        super().__init__(
            text,
            xy,
            xytext=offset,
            textcoords="offset points",
            ha=align,
            fontsize=7,
            color="black",
        )
        self.set_transform(IdentityTransform())
        self._data = ax.transData
        ax.add_artist(self)
        # Unclipped, as `Axes.annotate` leaves a label (`add_artist` clips to the axes box).
        self.set_clip_box(None)
        self.set_clip_path(None)
        dx, dy = offset
        flip: dict[_Align, _Align] = {"left": "right", "right": "left", "center": "center"}
        other = (-4 if align == "left" else 5, -11 if dy > -4 else 3)
        self.places: list[tuple[tuple[int, int], _Align]] = [
            (offset, align),
            ((dx, other[1]), align),
            ((other[0], dy), flip[align]),
            (other, flip[align]),
        ]
        self.obstacles: list[Annotation] = []
        self.rings: list[tuple[float, float]] = []
        self.left_out = False

    def _clear(self, renderer: RendererBase) -> bool:
        box = self.get_window_extent(renderer).padded(1.0)
        if any(box.overlaps(o.get_window_extent(renderer)) for o in self.obstacles):
            return False
        radius = cast(float, renderer.points_to_pixels(_RING_RADIUS))
        for centre in self.rings:
            cx, cy = self._data.transform(centre)
            nx = min(max(cx, box.x0), box.x1)
            ny = min(max(cy, box.y0), box.y1)
            if math.hypot(cx - nx, cy - ny) < radius:
                return False
        return True

    def draw(self, renderer: RendererBase) -> None:
        """Drawn at the first clear place, or not at all."""
        for offset, align in self.places:
            self.xyann = offset
            self.set_horizontalalignment(align)
            if self._clear(renderer):
                self.left_out = False
                super().draw(renderer)
                return
        self.left_out = True


def loss_chart(
    cells: pl.DataFrame,
    key: str,
    defaults: dict[str, dict[str, Any]],
    names: dict[str, str] | None = None,
    note: str = "",
) -> bytes:
    """Cost against each loss proxy along one grid parameter: a row of panels per policy
    (each on its own dollar scale: presets differ by more than a setting moves them), a line
    through its cells in the parameter's order (other grid parameters held at the policy's
    own values). Labelled: the two ends, the policy's own value (ringed) and the cheapest
    cell (starred). Down and left is cheaper and loses less, except for the share of human
    words kept, where right is better; the line shows what each dollar buys."""
    names = names or {}
    title = names.get(key, key)
    panels = loss_panels(cells) or [LOSS_PANELS[0]]
    _order, numeric = _axis_values(cells[key].drop_nulls().to_list())
    sections = []
    for policy in dict.fromkeys(cells["policy"].to_list()):
        own = defaults.get(policy, {})
        rows, held = _section(cells, policy, [key], own, names)
        if rows.height:
            sections.append((policy, rows.sort(key) if numeric else rows, held, own.get(key)))
    style = _styles([p for p, *_ in sections])
    n_rows = max(1, len(sections))
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(3.2 * len(panels) + 0.9, 2.9 * n_rows + 1.3))
        grid = fig.subplots(n_rows, len(panels), squeeze=False, sharey="row")
        for r, (policy, rows, held, mine) in enumerate(sections):
            color = style[policy]["color"]
            values = rows[key].to_list()
            cost = [math.nan if v is None else float(v) for v in rows["cost_total"].to_list()]
            known = [c for c in cost if not math.isnan(c)]
            cheapest = _cheapest(rows, key, mine)
            for c, (column, panel, unit) in enumerate(panels):
                ax = grid[r][c]
                x = [math.nan if v is None else float(v) for v in rows[column].to_list()]
                ax.plot(x, cost, color=color, marker="o", markersize=3, lw=1.2)
                marks: dict[int, tuple[tuple[int, int], _Align]] = {
                    0: ((-4, -11), "right"),
                    len(values) - 1: ((5, 3), "left"),
                }
                ends = set(marks)
                rings: list[tuple[float, float]] = []
                for i, v in enumerate(values):
                    if v == mine and type(v) is type(mine):
                        marks[i] = ((6, 7), "left")
                        rings.append((x[i], cost[i]))
                        ax.scatter(
                            [x[i]],
                            [cost[i]],
                            s=120,
                            facecolors="none",
                            edgecolors="black",
                            lw=1.4,
                            zorder=4,
                        )
                if cheapest is not None:
                    marks[cheapest] = ((6, -12), "left")
                    ax.scatter(
                        [x[cheapest]],
                        [cost[cheapest]],
                        s=110,
                        marker="*",
                        color="#2CA02C",
                        edgecolor="black",
                        lw=0.6,
                        zorder=5,
                    )
                marked: list[Annotation] = []
                end_labels: list[_EndLabel] = []
                for i, (offset, align) in sorted(marks.items()):
                    if math.isnan(x[i]) or math.isnan(cost[i]):
                        continue
                    text, xy = _value_label(values[i]), (x[i], cost[i])
                    if i in ends:
                        end_labels.append(_EndLabel(ax, text, xy, offset, align))
                        continue
                    marked.append(
                        ax.annotate(
                            text,
                            xy,
                            xytext=offset,
                            textcoords="offset points",
                            ha=align,
                            fontsize=7,
                            color="black",
                        )
                    )
                for end in end_labels:
                    end.obstacles, end.rings = marked, rings
                if r == 0:
                    ax.set_title(panel, loc="left", fontsize=10)
                ax.set_xlabel(unit, fontsize=8)
                if column.endswith("_share"):
                    _share_axis(ax, "x")
                elif column == "resent_tokens":
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens_label(v)))
                ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
                ax.margins(x=0.12, y=0.1)
            span = (max(known) - min(known)) if known else 0.0
            first = grid[r][0]
            first.yaxis.set_major_formatter(FuncFormatter(lambda v, _p, s=span: _money(v, s)))
            label = f"{policy}\n({held})" if held else policy
            first.set_ylabel(f"{label}\nUSD, all sessions", fontsize=8)
        if not sections:
            grid[0][0].text(0.5, 0.5, "no finished cell", transform=grid[0][0].transAxes)
        handles = [
            Line2D([], [], color="#555555", marker="o", ms=3, lw=1.2),
            Line2D([], [], ls="", marker="o", ms=10, mfc="none", mec="black", mew=1.4),
            Line2D([], [], ls="", marker="*", ms=11, color="#2CA02C", mec="black", mew=0.6),
        ]
        labels = [
            f"a cell per {title} value, in order (ends labelled)",
            f"the policy's own {title}",
            "the cheapest cell overflowing no more than the own value",
        ]
        fit = _Fit(fig)
        top = _suptitle(fig, fit, f"Cost against loss along {title}{note}")
        bottom = _bottom_legend(fig, fit, handles, labels, 3)
        _place_loss_panels(fit, grid, top, bottom)
        return png_bytes(fig)


def _place_loss_panels(fit: _Fit, grid: Any, top: float, bottom: float) -> None:
    """The loss chart's rows of panels (y shared along a row: tick labels and label in the
    first column only; every panel has its x tick labels and label, 8 pt): the first
    column's y texts at the left, panel titles (10 pt) over the first row, and between
    panels the x tick labels' overhangs (half the first and last labels)."""
    w, h = fit.width, fit.height
    rows, columns = grid.shape
    title = fit.text("Stale", 10)[1] + TITLEPAD
    under = fit.text("0")[1] + TICK + fit.text("tool", 8)[1] + LABELPAD
    height = (h - top - title - rows * under - (rows - 1) * EDGE - bottom) / rows
    first = [grid[r][0] for r in range(rows)]
    for ax in first:  # a policy's label and held values, read along its row's height
        ax.set_ylabel(_wrapped(fit, ax.get_ylabel(), 8, height), fontsize=8)
    widest = max(fit.widest(_tick_texts(ax.yaxis)) for ax in first)
    label = max(fit.text(ax.get_ylabel(), 8)[1] for ax in first)
    left = EDGE + widest + TICK + label + LABELPAD
    ends = [_tick_texts(ax.xaxis) for ax in grid.ravel()]
    right = max((fit.text(t[-1])[0] / 2 for t in ends if t), default=0.0)
    start = max((fit.text(t[0])[0] / 2 for t in ends if t), default=0.0)
    gap = right + start + 2 * EDGE
    width = (w - left - (columns - 1) * gap - right - EDGE) / columns
    for r in range(rows):
        y = h - top - title - height - r * (height + under + EDGE)
        for c in range(columns):
            x = left + c * (width + gap)
            grid[r][c].set_position(
                (x / w, y / h, max(width, 0.1 * w) / w, max(height, 0.1 * h) / h)
            )


def sweep_charts(
    cells: pl.DataFrame,
    defaults: dict[str, dict[str, Any]],
    names: dict[str, str] | None = None,
    note: str = "",
) -> dict[str, bytes]:
    """Every chart of a sweep, by file name under charts/: `param-<key>.png` and, when the
    rows carry loss proxies, `loss-<key>.png` per grid parameter that takes two values or
    more, and `heatmap-<x>-vs-<y>.png` for each pair of them (the first three pairs).
    `defaults`: policy -> {column: own value}; `names`: column -> parameter (file names and
    labels use the parameter's own name); `note`: the replay mode, said in each title (the
    same cells mean other things open loop and with re-fetch)."""
    note = f" ({note})" if note else ""
    names = names or {}
    keys = varying(cells)
    out: dict[str, bytes] = {}
    with_loss = bool(loss_panels(cells))
    for key in keys:
        name = chart_name(names.get(key, key))
        out[f"charts/param-{name}.png"] = parameter_chart(cells, key, defaults, names, note)
        if with_loss:
            out[f"charts/loss-{name}.png"] = loss_chart(cells, key, defaults, names, note)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]][:3]
    for a, b in pairs:
        name = chart_name(names.get(a, a), names.get(b, b))
        out[f"charts/heatmap-{name}.png"] = heatmap_chart(cells, a, b, defaults, names)
    return out


# -- tuning ---------------------------------------------------------------------------------


def trials_chart(
    trials: pl.DataFrame,
    objective: str,
    dimensions: Sequence[str],
    baseline: float | None = None,
    shipped: dict[str, Any] | None = None,
    names: dict[str, str] | None = None,
) -> bytes:
    """The objective of every finished trial (feasible and not), the best feasible so far,
    and the shipped configuration's value; then the objective against each numeric tuned
    parameter (up to two; `dimensions` and `shipped` by trials-table column, `names`:
    column -> parameter for the labels), the best trial starred."""
    names = names or {}
    done = trials.filter(pl.col("objective").is_not_null())
    numeric = [d for d in dimensions if d in done.columns and done[d].dtype.is_numeric()][:2]
    money = objective == "cost"
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(4.2 * (1 + len(numeric)) + 1.0, 4.2))
        axes = fig.subplots(1, 1 + len(numeric), squeeze=False)[0]
        ax = axes[0]
        feasible = done.filter(pl.col("feasible"))
        infeasible = done.filter(~pl.col("feasible"))
        ax.scatter(
            feasible["trial"].to_list(),
            feasible["objective"].to_list(),
            s=16,
            color="#1F77B4",
            label="trial (feasible)",
            zorder=3,
        )
        if infeasible.height:
            ax.scatter(
                infeasible["trial"].to_list(),
                infeasible["objective"].to_list(),
                s=20,
                marker="x",
                color="#D62728",
                label="trial (breaks a constraint)",
                zorder=3,
            )
        best = done.filter(pl.col("best_so_far").is_not_null())
        if best.height:
            ax.step(
                best["trial"].to_list(),
                best["best_so_far"].to_list(),
                where="post",
                color="#2CA02C",
                lw=1.8,
                label="best feasible so far",
            )
        if baseline is not None:
            ax.axhline(baseline, color="#555555", ls="--", lw=1.2, label="shipped value")
        ax.set_xlabel("trial")
        ax.set_ylabel("cost (USD, all sessions)" if money else objective)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if money:
            _money_axis(ax)
        ax.set_title("Objective per trial", loc="left", fontsize=10)
        _legend_below(ax)
        if done.is_empty():
            ax.text(0.5, 0.5, "no finished trial", transform=ax.transAxes, ha="center")
        winner = _best_row(done)
        for ax, key in zip(axes[1:], numeric, strict=True):
            for frame, style in (
                (feasible, {"s": 16, "color": "#1F77B4"}),
                (infeasible, {"s": 20, "marker": "x", "color": "#D62728"}),
            ):
                if frame.height:
                    ax.scatter(frame[key].to_list(), frame["objective"].to_list(), **style)
            if winner is not None:
                ax.scatter(
                    [winner[key]],
                    [winner["objective"]],
                    s=140,
                    marker="*",
                    color="#2CA02C",
                    edgecolor="black",
                    zorder=4,
                    label=f"best: {_exact(winner[key])}",
                )
            value = (shipped or {}).get(key)
            if _is_number(value):
                ax.axvline(
                    float(value),
                    color="#555555",
                    ls="--",
                    lw=1.2,
                    label=f"shipped: {_exact(value)}",
                )
            ax.set_xlabel(names.get(key, key))
            top = done[key].abs().max()
            if isinstance(top, int | float) and top >= 1000:
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens_label(v)))
            if money:
                _money_axis(ax)
            ax.set_title(f"Objective against {names.get(key, key)}", loc="left", fontsize=10)
            _legend_below(ax)
        fit = _Fit(fig)
        _place_row(fit, list(axes), EDGE)
        return png_bytes(fig)


def _legend_below(ax: Axes, ncol: int = 3) -> None:
    """Under the axes (placed by `_place_row`): no legend ever hides a trial."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper center", borderaxespad=0.0, ncol=min(ncol, len(labels)))


def _overhang(fit: _Fit, ax: Axes) -> tuple[float, float]:
    """How far (pixels) the annotations of `ax` reach past its right edge and its top."""
    box = ax.get_window_extent(fit.renderer)
    right = top = 0.0
    for text in ax.texts:
        extent = text.get_window_extent(fit.renderer)
        right, top = max(right, extent.x1 - box.x1), max(top, extent.y1 - box.y1)
    return right, top


def _place_row(fit: _Fit, axes: list[Axes], top: float) -> None:
    """A row of panels, each with its own tick labels, axis labels, title (10 pt, one line)
    and legend under it (`_legend_below`; in one column where its row of entries is wider
    than the panel: a Pareto chart's ran into the next panel's and off the figure), and
    room at the right of a panel for what its annotations (a Pareto front's tuned values)
    reach past it. `top`: the room the figure's own title takes."""
    w, h = fit.width, fit.height
    lefts = [
        fit.widest(_tick_texts(ax.yaxis)) + TICK + fit.text(ax.get_ylabel())[1] + LABELPAD
        for ax in axes
    ]
    ticks = [_tick_texts(ax.xaxis) for ax in axes]
    rights = [fit.text(t[-1])[0] / 2 if t else 0.0 for t in ticks]
    title = max(fit.text(ax.get_title(loc="left"), 10)[1] for ax in axes) + TITLEPAD
    under = fit.text("0")[1] + TICK + max(fit.text(ax.get_xlabel())[1] for ax in axes)
    under += LABELPAD + EDGE
    raised = 0.0
    for _ in range(2):  # placed, then again with the room the annotations turned out to need
        width = (w - 2 * EDGE - sum(lefts) - sum(rights) - 2 * EDGE * (len(axes) - 1)) / len(axes)
        width = max(width, 0.1 * w)
        legends = []
        for ax in axes:
            legend = ax.get_legend()
            # As wide as a panel and the narrowest left margin: it reaches neither edge nor
            # the next panel's legend.
            if legend is not None and fit.legend(legend)[0] > width + min(lefts):
                legend.remove()
                _legend_below(ax, ncol=1)
                legend = ax.get_legend()
            legends.append(legend)
        below = max((fit.legend(g)[1] for g in legends if g is not None), default=0.0)
        height = max(h - top - raised - title - under - below - EDGE, 0.1 * h)
        bottom = h - top - raised - title - height
        x = EDGE
        for i, (ax, legend) in enumerate(zip(axes, legends, strict=True)):
            x += lefts[i]
            ax.set_position((x / w, bottom / h, width / w, height / h))
            if legend is not None:
                anchor = ((x + width / 2) / w, (bottom - under) / h)
                legend.set_bbox_to_anchor(anchor, transform=fit.fig.transFigure)
            x += width + rights[i] + 2 * EDGE
        reach = [_overhang(fit, ax) for ax in axes]
        wanted = [max(r, o[0] + EDGE / 2) for r, o in zip(rights, reach, strict=True)]
        lift = max(0.0, *(o[1] for o in reach))
        if wanted == rights and lift <= raised:
            return
        rights, raised = wanted, max(raised, lift)


def _exact(value: Any) -> str:
    """A value in full (29,500, not 30k): the number to type back in."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.6g}"
    return _value_label(value)


def _best_row(done: pl.DataFrame) -> dict[str, Any] | None:
    """The best feasible trial: the one where best_so_far last improved."""
    feasible = done.filter(pl.col("feasible"))
    if feasible.is_empty():
        return None
    target = feasible["best_so_far"].drop_nulls()
    if target.is_empty():
        return None
    value = target[-1]
    row: dict[str, Any] = feasible.filter(pl.col("objective") == value).row(0, named=True)
    return row


#: Axis labels of figures a Pareto chart may plot (anything else: its own name).
FIGURE_LABELS = {
    "cost": "cost (USD, all sessions)",
    "stale_file_refs": "stale file references (tool calls)",
    "resent_tokens": "re-sent tokens after compactions",
    "summary_share": "summary share of the context",
    "human_verbatim_share": "share of human words kept",
    "compactions": "compaction calls",
    "overflows": "overflows (requests over the window)",
}


def _figure_axis(ax: Axes, which: str, metric: str) -> None:
    """Format the x or y axis for a figure: dollars, a share, tokens or a count."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    if metric == "cost":
        low, high = ax.get_xlim() if which == "x" else ax.get_ylim()
        span = abs(high - low)
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: _money(v, span)))
    elif metric.endswith(("_share", "_ratio")):
        _share_axis(ax, which)
    elif metric.endswith("_tokens"):
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens_label(v)))


#: Front points labelled at most in a Pareto chart.
FRONT_LABELS = 6


def pareto_chart(
    trials: pl.DataFrame,
    objectives: Sequence[tuple[str, bool]],
    dimensions: Sequence[str],
    baseline: dict[str, Any] | None = None,
    names: dict[str, str] | None = None,
) -> bytes:
    """The first objective against each other one (up to three panels): every feasible
    trial, those breaking a constraint, the Pareto front joined in order and each of its
    points labelled with the tuned values, and the shipped configuration. `objectives`:
    (trials-table column, maximised); `dimensions`: the tuned columns."""
    names = names or {}
    done = trials.filter(pl.col("state") == "complete")
    first, _first_max = objectives[0]
    others = list(objectives[1:4])
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(max(8.0, 5.6 * len(others) + 0.8), 5.4))
        axes = fig.subplots(1, len(others), squeeze=False)[0]
        for ax, (metric, maximize) in zip(axes, others, strict=True):
            usable = done.filter(pl.col(first).is_not_null() & pl.col(metric).is_not_null())
            feasible = usable.filter(pl.col("feasible"))
            infeasible = usable.filter(~pl.col("feasible"))
            ax.scatter(
                feasible[metric].to_list(),
                feasible[first].to_list(),
                s=14,
                color="#9BB8D3",
                label="trial (feasible)",
                zorder=2,
            )
            if infeasible.height:
                ax.scatter(
                    infeasible[metric].to_list(),
                    infeasible[first].to_list(),
                    s=18,
                    marker="x",
                    color="#D62728",
                    label="trial (breaks a constraint)",
                    zorder=2,
                )
            front = feasible.filter(pl.col("pareto")).sort([metric, first, *dimensions, "trial"])
            if front.height:
                ax.plot(
                    front[metric].to_list(),
                    front[first].to_list(),
                    color="#1F77B4",
                    marker="o",
                    ms=5,
                    lw=1.5,
                    label="Pareto front (some points labelled with their tuned values)",
                    zorder=3,
                )
                at: dict[tuple[float, float], list[str]] = {}
                for r in front.iter_rows(named=True):
                    point = (float(r[metric]), float(r[first]))
                    at.setdefault(point, []).append(", ".join(_exact(r[d]) for d in dimensions))
                points = list(at)
                # At most FRONT_LABELS labels, spread along the front (both ends kept), so
                # they do not pile up where the front is dense.
                step = max(1, math.ceil((len(points) - 1) / (FRONT_LABELS - 1)))
                chosen = {*range(0, len(points), step), len(points) - 1}
                for index in sorted(chosen):
                    point = points[index]
                    # Equal points, one label: their values (the first and last when several).
                    texts = list(dict.fromkeys(at[point]))
                    text = texts[0] if len(texts) == 1 else f"{texts[0]} to {texts[-1]}"
                    ax.annotate(
                        text,
                        point,
                        xytext=(5, 4),
                        textcoords="offset points",
                        fontsize=7,
                        color="#1F4E79",
                    )
            shipped = baseline or {}
            if shipped.get(metric) is not None and shipped.get(first) is not None:
                ax.scatter(
                    [float(shipped[metric])],
                    [float(shipped[first])],
                    s=120,
                    marker="D",
                    color="#FF7F0E",
                    edgecolor="black",
                    label="shipped",
                    zorder=4,
                )
            better = "right" if maximize else "left"
            ax.set_xlabel(f"{FIGURE_LABELS.get(metric, metric)} ({better} is better)")
            ax.set_ylabel(FIGURE_LABELS.get(first, first))
            _figure_axis(ax, "x", metric)
            _figure_axis(ax, "y", first)
            ax.set_title(f"{first} against {metric}, trials", loc="left", fontsize=10)
            _legend_below(ax)
            if usable.is_empty():
                ax.text(0.5, 0.5, "no finished trial", transform=ax.transAxes, ha="center")
        tuned = ", ".join(names.get(d, d) for d in dimensions)
        fit = _Fit(fig)
        _place_row(fit, list(axes), _suptitle(fig, fit, f"Pareto front over {tuned}"))
        return png_bytes(fig)
