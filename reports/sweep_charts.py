"""Charts of a sweep and of a tuning study, drawn from their Parquet files and manifest.

A sweep is read through its cells table (simulator/sweep.py `cells_frame`: one row per
cell, a column per grid parameter, the cell's figures): a line chart per grid parameter
(cost, compactions, overflows and breaker trips against the parameter, one line per
policy) and, where two parameters vary, a cost heatmap per policy. A study is drawn from
its trials table (simulator/tune.py `trials_frame`). Same reproducibility rules as
reports/charts.py: bundled font, no metadata, fixed sizes, no time or path, so the same
inputs give identical PNG bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, TypeGuard, cast

import matplotlib
import polars as pl
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from reports.charts import POLICY_COLORS, RC, dollars_label, png_bytes, tokens_label

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


def grid_keys(cells: pl.DataFrame) -> list[str]:
    """The grid parameters of a cells table (every column between the keys and figures)."""
    from simulator.sweep import CELL_FIGURES

    return [c for c in cells.columns if c not in ("policy", "params_hash", *CELL_FIGURES)]


def varying(cells: pl.DataFrame) -> list[str]:
    """Grid parameters taking at least two values."""
    return [k for k in grid_keys(cells) if cells[k].drop_nulls().n_unique() >= 2]


def _section(cells: pl.DataFrame, policy: str, keys: Sequence[str]) -> tuple[pl.DataFrame, str]:
    """The policy's cells along `keys`, every other grid parameter held at the value of the
    policy's first cell; and a note saying which values those are ("" when none)."""
    rows = cells.filter(pl.col("policy") == policy)
    for k in keys:
        rows = rows.filter(pl.col(k).is_not_null())
    if rows.is_empty():
        return rows, ""
    first = rows.row(0, named=True)
    held = []
    for k in grid_keys(cells):
        if k in keys or first[k] is None or rows[k].n_unique() < 2:
            continue
        rows = rows.filter(pl.col(k) == first[k])
        held.append(f"{k}={_value_label(first[k])}")
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


def parameter_chart(cells: pl.DataFrame, key: str, defaults: dict[str, Any]) -> bytes:
    """Cost, compactions, overflows and breaker trips against one grid parameter, one line
    per policy (other grid parameters held at each policy's first cell); a dotted line at
    each policy's own value of the parameter (`defaults`: policy -> value) when known."""
    policies = list(dict.fromkeys(cells["policy"].to_list()))
    style = _styles(policies)
    order, numeric = _axis_values(cells[key].drop_nulls().to_list())
    own_lines = False
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(10.0, 6.6), layout="constrained")
        axes = fig.subplots(2, 2, sharex=True).ravel()
        drawn = []
        for policy in policies:
            rows, held = _section(cells, policy, [key])
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
            shipped = defaults.get(policy)
            if numeric and _is_number(shipped) and order[0] <= shipped <= order[-1]:
                own_lines = True
                for ax in axes:
                    color = style[policy]["color"]
                    ax.axvline(float(shipped), color=color, ls=":", lw=1.2, alpha=0.8)
        for ax, (column, title, unit) in zip(axes, PANELS, strict=True):
            ax.set_title(title, loc="left", fontsize=10)
            ax.set_ylabel(unit)
            if column == "cost_total":
                _money_axis(ax)
            else:
                _count_axis(ax)
        for ax in axes[2:]:
            _x_axis(ax, key, order, numeric)
        handles, labels = axes[0].get_legend_handles_labels()
        if own_lines:
            handles.append(Line2D([], [], color="#555555", ls=":", lw=1.2))
            labels.append("policy's own value")
        wide = max((len(t) for t in labels), default=0) > 36
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncol=(2 if wide else 4) if len(labels) > 1 else 1,
            title="policy (other grid parameters held at)" if wide else None,
        )
        fig.suptitle(f"Sweep over {key}", fontsize=11, x=0.01, ha="left")
        if not drawn:
            axes[0].text(0.5, 0.5, "no finished cell", transform=axes[0].transAxes)
        return png_bytes(fig)


def heatmap_chart(cells: pl.DataFrame, x_key: str, y_key: str) -> bytes:
    """Cost over two grid parameters, one panel per policy, on one colour scale; each
    square is labelled with its cost and, where there are any, its overflows and breaker
    trips (other grid parameters held at each policy's first cell)."""
    policies = [
        p
        for p in dict.fromkeys(cells["policy"].to_list())
        if _section(cells, p, [x_key, y_key])[0].height
    ]
    xs, _ = _axis_values(cells[x_key].drop_nulls().to_list())
    ys, _ = _axis_values(cells[y_key].drop_nulls().to_list())
    sections = {p: _section(cells, p, [x_key, y_key]) for p in policies}
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
            figsize=(min(18.0, max(6.0, width * columns + 1.2)), max(4.0, height * n_rows + 0.9)),
            layout="constrained",
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
            ax.set_xlabel(x_key)
            ax.set_ylabel(y_key)
            ax.grid(False)
            title = policy if not held else f"{policy}\n({held})"
            ax.set_title(title, loc="left", fontsize=9)
        for ax in axes[len(policies) :]:
            ax.set_visible(False)
        if image is not None:
            bar = fig.colorbar(image, ax=axes[: len(policies)], shrink=0.9)
            bar.set_label("cost (USD, all sessions)")
            bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: dollars_label(v)))
        fig.suptitle(f"Cost over {x_key} and {y_key}", fontsize=11, x=0.01, ha="left")
        return png_bytes(fig)


def sweep_charts(cells: pl.DataFrame, defaults: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    """Every chart of a sweep, by file name under charts/: `param-<key>.png` per grid
    parameter that takes two values or more, and `heatmap-<x>-vs-<y>.png` for each pair
    of them (the first three pairs). `defaults`: policy -> {parameter: own value}."""
    keys = varying(cells)
    out: dict[str, bytes] = {}
    for key in keys:
        own = {p: d[key] for p, d in defaults.items() if key in d}
        out[f"charts/param-{chart_name(key)}.png"] = parameter_chart(cells, key, own)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]][:3]
    for a, b in pairs:
        out[f"charts/heatmap-{chart_name(a, b)}.png"] = heatmap_chart(cells, a, b)
    return out


# -- tuning ---------------------------------------------------------------------------------


def trials_chart(
    trials: pl.DataFrame,
    objective: str,
    dimensions: Sequence[str],
    baseline: float | None = None,
    shipped: dict[str, Any] | None = None,
) -> bytes:
    """The objective of every finished trial (feasible and not), the best feasible so far,
    and the shipped configuration's value; then the objective against each numeric tuned
    parameter (up to two), the best trial starred."""
    done = trials.filter(pl.col("objective").is_not_null())
    numeric = [d for d in dimensions if d in done.columns and done[d].dtype.is_numeric()][:2]
    money = objective == "cost"
    with matplotlib.rc_context(cast(Any, RC)):
        fig = Figure(figsize=(4.2 * (1 + len(numeric)) + 1.0, 4.2), layout="constrained")
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
            ax.set_xlabel(key)
            top = done[key].abs().max()
            if isinstance(top, int | float) and top >= 1000:
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens_label(v)))
            if money:
                _money_axis(ax)
            ax.set_title(f"Objective against {key}", loc="left", fontsize=10)
            _legend_below(ax)
        return png_bytes(fig)


def _legend_below(ax: Axes) -> None:
    """Under the axes: no legend ever hides a trial."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(3, len(labels)))


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
