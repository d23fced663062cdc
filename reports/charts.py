"""Charts of a run, drawn only from its Parquet rows and manifest (DESIGN.md section 8).

Every function takes the request rows (requests.parquet as a polars frame) and returns PNG
bytes. The bytes are reproducible: one bundled font (DejaVu Sans ships with matplotlib), no
PNG metadata (matplotlib writes its version by default), fixed sizes and resolution, and no
time or path anywhere, so two runs on the same inputs give identical files. Figures are
made without pyplot, so drawing keeps no global state between charts.

What each chart shows is listed in reports/METRICS.md ("Charts").
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import matplotlib
import polars as pl
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from simulator.frames import has_loss
from simulator.models import facts

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
    with matplotlib.rc_context(cast(Any, RC)):
        yield


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes with no metadata (no version, no date): reproducible.

    Printed through the Agg canvas, so the figure is drawn once, its layout engine run
    inside that draw. `Figure.savefig` with a layout engine draws every figure twice (a
    draw with rendering switched off to run the layout, then the real one): 20-25% of
    each chart's time (issue 16), for the same pixels (tests/test_charts.py compares the
    two to the byte)."""
    buf = io.BytesIO()
    with _style():
        # matplotlib leaves print_png unannotated
        FigureCanvasAgg(fig).print_png(buf, metadata={"Software": None})  # type: ignore[no-untyped-call]
    return buf.getvalue()


def tokens_label(value: float) -> str:
    """Token counts the way people say them: 950, 12k, 1.2M."""
    v = abs(value)
    if v >= 1_000_000:
        return f"{value / 1e6:.1f}M".replace(".0M", "M")
    if v >= 10_000:
        return f"{value / 1e3:.0f}k"
    if v >= 1_000:
        return f"{value / 1e3:.1f}k".replace(".0k", "k")
    return f"{value:.0f}"


def dollars_label(value: float) -> str:
    if value >= 100:
        return f"${value:,.0f}"
    if value >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"


_TOKENS = FuncFormatter(lambda v, _pos: tokens_label(v))


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


def _money_axis(ax: Axes, top: float) -> None:
    """Dollar ticks with as many decimals as the scale needs ($0.50, not $0.5000)."""
    decimals = 2 if top >= 0.5 else 3 if top >= 0.05 else 4
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"${v:,.{decimals}f}"))


# -- per run ------------------------------------------------------------------------------
# Horizontal bars: a policy label of any length reads on the y axis, and a sweep of many
# specs only makes the chart taller.


def cost_components(requests: pl.DataFrame) -> pl.DataFrame:
    """Dollars per spec and component (COMPONENTS), priced rows only."""
    req = pl.col("kind") == "request"
    parts = [pl.col(c).filter(req).sum().alias(c) for c, _, _ in COMPONENTS[:-1]]
    parts.append(pl.col("cost_total").filter(~req).sum().alias("compaction"))
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


def cost_by_policy(requests: pl.DataFrame) -> bytes:
    """Dollars per policy spec, stacked by component (compaction calls last)."""
    frame = cost_components(requests)
    labels = spec_labels(specs(requests))
    names = [labels[(r[0], r[1])] for r in frame.select("policy", "params_hash").iter_rows()]
    top = max(_totals(frame), default=0.0)
    with _style():
        fig = Figure(figsize=(8.0, _height(len(names)) + 0.5), layout="constrained")
        ax = fig.add_subplot()
        _stacked(ax, range(len(names)), frame, 0.6)
        _spec_axis(ax, names)
        ax.set_xlim(0, top * 1.18 if top > 0 else 1.0)
        _money_axis(ax, top)
        ax.set_xlabel("cost (USD, all sessions)")
        ax.set_title("Cost by policy, by component", loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), title="component")
        return png_bytes(fig)


def _summary(requests: pl.DataFrame) -> pl.DataFrame:
    from simulator.frames import policy_summary

    return policy_summary(requests)


def _names(requests: pl.DataFrame, summary: pl.DataFrame) -> list[str]:
    labels = spec_labels(specs(requests))
    return [labels[(r[0], r[1])] for r in summary.select("policy", "params_hash").iter_rows()]


def _percent_axis(ax: Axes) -> None:
    ax.set_xlim(0, 112)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))


def _bar_labels(ax: Axes, y: Sequence[float], values: Sequence[float], texts: list[str]) -> None:
    for yi, v, text in zip(y, values, texts, strict=True):
        ax.annotate(
            text, (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )


def hit_ratio_by_policy(requests: pl.DataFrame) -> bytes:
    """Cache hit ratio (cache read / whole prompt, all calls) per policy spec."""
    summary = _summary(requests)
    names = _names(requests, summary)
    raw = summary["cache_hit_ratio"].to_list()
    values = [100 * (v or 0.0) for v in raw]
    with _style():
        fig = Figure(figsize=(6.5, _height(len(names))), layout="constrained")
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
        ax.set_xlabel("cache read / prompt tokens (all calls)")
        ax.set_title("Cache hit ratio", loc="left")
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
    summary = _summary(requests)
    names = _names(requests, summary)
    series = {"compaction calls": [float(v) for v in summary["compactions"].to_list()]}
    if has_loss(requests):  # the recording's own compactions show here under as-recorded
        after = summary["post_compaction_requests"].to_list()
        series["requests after a compaction"] = [float(v) for v in after]
    series["overflows"] = [float(v) for v in summary["overflows"].to_list()]
    series["breaker trips"] = [float(v) for v in summary["breaker_trips"].to_list()]
    top = max((max(v) for v in series.values()), default=0.0)
    with _style():
        fig = Figure(figsize=(7.5, _height(len(names)) * 1.3), layout="constrained")
        ax = fig.add_subplot()
        _grouped(ax, names, series, EVENT_COLORS)
        ax.set_xlim(0, max(1.0, top * 1.15))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("count (calls, all sessions)")
        ax.set_title("Compactions, overflows and breaker trips", loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if top == 0:
            _empty_note(ax, "no compaction, overflow or breaker trip in this run")
        return png_bytes(fig)


LOSS_PANELS: tuple[tuple[str, str, str], ...] = (
    ("human_verbatim_share", "Human words kept verbatim", "share of the human's tokens"),
    ("summary_share", "View written by compaction", "share of request context tokens"),
    ("stale_file_refs", "Stale file references", "count (tool calls)"),
    ("resent_tokens", "Re-sent after compaction", "tokens (uncached + written)"),
)


def loss_by_policy(requests: pl.DataFrame) -> bytes | None:
    """The loss proxies per policy spec, one panel each; None when the rows lack them."""
    if not has_loss(requests):
        return None
    summary = _summary(requests)
    names = _names(requests, summary)
    with _style():
        fig = Figure(figsize=(10, 2 * _height(len(names)) + 0.4), layout="constrained")
        axes = fig.subplots(2, 2).ravel()
        y = list(range(len(names)))
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
            ax.set_title(title, loc="left", fontsize=10)
            ax.set_xlabel(unit)
            if share:
                _percent_axis(ax)
            else:
                ax.set_xlim(0, max(1.0, max(values, default=0.0) * 1.25))
                ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
                ax.xaxis.set_major_formatter(_TOKENS)
        fig.suptitle("What each policy loses (request rows, all sessions)", fontsize=11)
        return png_bytes(fig)


# -- per session --------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """A horizontal limit drawn on a session chart."""

    label: str
    tokens: int
    style: str


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
    for column, label, style in (
        ("threshold_tokens", "compaction threshold", "--"),
        ("blocking_tokens", "blocking limit", ":"),
    ):
        if column not in rows.columns:
            continue
        values = rows[column].drop_nulls()
        if len(values) and int(values[0]) > 0:
            lines.append(Line(label, int(values[0]), style))
    return sorted(lines, key=lambda line: (-line.tokens, line.label))


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
    style = {"color": "#444444", **style}
    return Line2D([], [], ls="none", marker=marker, label=label, **style)


def session_chart(
    rows: pl.DataFrame, manifest: dict[str, Any], *, title: str | None = None
) -> bytes:
    """Context size over the requests of one session, every policy spec of the run.

    Lines: each spec's context per request; the model's window; the thresholds and
    blocking limits each spec stated for this session (else those its parameters name).
    Markers: compaction calls (one shape per stage), requests right after a compaction
    (including the recording's own under as-recorded), overflows and breaker trips.
    """
    rows = rows.sort("request", "call", "policy", "params_hash")
    all_specs = specs(rows)
    labels = spec_labels(all_specs)
    params = spec_params(manifest)
    model_facts = [facts(m) for m in rows["model"].unique().sort().to_list()]
    window = max(f.window for f in model_facts)
    context_max = int(rows["context_tokens"].max() or 0)  # type: ignore[arg-type]
    stages = sorted(s for s in rows.filter(pl.col("kind") != "request")["stage"].unique())
    markers = {s: STAGE_MARKERS[i % len(STAGE_MARKERS)] for i, s in enumerate(stages)}
    contexts: list[Line2D] = []
    events: dict[str, Line2D] = {}
    limits: list[tuple[Line, str]] = [
        (Line(f"window {tokens_label(window)}", window, "-"), "#777777")
    ]
    with _style():
        fig = Figure(figsize=(10, 4.4), layout="constrained")
        ax = fig.add_subplot()
        for i, spec in enumerate(all_specs):
            color = POLICY_COLORS[i % len(POLICY_COLORS)]
            mine = rows.filter((pl.col("policy") == spec[0]) & (pl.col("params_hash") == spec[1]))
            req = mine.filter(pl.col("kind") == "request")
            # Earlier specs are drawn wider, so a later spec on the same values leaves them
            # visible as a border.
            (line,) = ax.plot(
                req["request"].to_list(),
                req["context_tokens"].to_list(),
                color=color,
                lw=max(1.2, 3.2 - 1.0 * i),
                marker="." if req.height < 30 else None,
                label=f"{labels[spec]}: context",
                zorder=3 + 0.1 * i,
            )
            contexts.append(line)

            def scatter(frame: pl.DataFrame, **style: Any) -> None:
                ax.scatter(
                    frame["request"].to_list(),
                    frame["context_tokens"].to_list(),
                    zorder=5,
                    **style,
                )

            for stage in stages:
                calls = mine.filter((pl.col("kind") != "request") & (pl.col("stage") == stage))
                if calls.height:
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
                after = req.filter(pl.col("after_compaction"))
                if after.height:
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
            over = mine.filter(pl.col("overflow"))
            if over.height:
                scatter(over, marker="X", s=70, color="#D62728", edgecolors=color, linewidths=0.8)
                events["overflow"] = _marker("X", "overflow", color="#D62728", markersize=8)
            trips = mine.filter(pl.col("breaker_trip"))
            if trips.height:
                scatter(trips, marker="D", s=42, color="black")
                events["breaker trip"] = _marker("D", "breaker trip", color="black", markersize=6)
            for lim in stated_lines(mine) or policy_lines(params.get(spec, {}), window):
                label = f"{labels[spec]}: {lim.label} {tokens_label(lim.tokens)}"
                limits.append((Line(label, lim.tokens, lim.style), color))
        # A limit far above the data would squash it against the axis: a limit is drawn
        # when the context comes within reach of it, else the legend names it.
        reach = [lim.tokens for lim, _ in limits if context_max >= 0.4 * lim.tokens]
        top = max([context_max, *reach])
        limit_handles = []
        for lim, color in limits:
            if context_max >= 0.4 * lim.tokens:
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
        ax.yaxis.set_major_formatter(_TOKENS)
        ax.set_xlabel("request (index within the session)")
        ax.set_ylabel("context (tokens)")
        ax.set_title(title or "Context size over the session", loc="left")
        handles = [*contexts, *limit_handles, *events.values()]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
    label): cost stacked by component, cache hit ratio, compactions and overflows."""
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
        fig = Figure(figsize=(12, 1.9 + 0.55 * len(names)), layout="constrained")
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


def run_charts(requests: pl.DataFrame) -> dict[str, bytes]:
    """The per-run charts, by file name under charts/."""
    charts = {
        "cost_by_policy.png": cost_by_policy(requests),
        "cache_hit_ratio.png": hit_ratio_by_policy(requests),
        "events_by_policy.png": events_by_policy(requests),
    }
    loss = loss_by_policy(requests)
    if loss is not None:
        charts["loss_by_policy.png"] = loss
    return charts


def session_title(rows: pl.DataFrame) -> str:
    """Two short lines: trace and session index; session id (where the trace name does not
    already say it) and models. Long ids are cut: the report's caption has them whole."""
    first = rows.row(0, named=True)
    trace, session = first["trace"], first["session"]
    models = ", ".join(rows["model"].unique().sort().to_list())
    detail = models if trace.startswith(session) else f"{short_id(session, 30)}, {models}"
    return f"Context over session #{first['session_index']} of {short_id(trace, 44)}\n{detail}"


#: From this many session charts on, a worker process draws some of them. A worker is ready
#: about 1.4 s after the call (a fork server importing matplotlib and polars), a chart takes
#: 0.15-0.25 s, and a command waits at its exit for a worker to finish. Measured with the
#: whole `ctxsim run --policy claude-code` on the shared Claude Code corpus (a loaded 2-core
#: machine): 12 session charts 4.8-5.7 s with a worker against 4.4-5.0 s without; 40 charts
#: 6.1 s against 7.7-8.6 s.
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


def _session_png(rows: pl.DataFrame, manifest: dict[str, Any]) -> bytes:
    return session_chart(rows, manifest, title=session_title(rows))


def session_charts(
    requests: pl.DataFrame,
    manifest: dict[str, Any],
    keys: Sequence[tuple[str, int]],
    *,
    jobs: int = 0,
) -> Iterator[tuple[str, bytes]]:
    """(file name, PNG) of each chosen session, in the order of `keys`, one at a time (so a
    caller can show progress). Workers, if any, start at the call: a caller that draws
    other charts before iterating has them drawing meanwhile.

    With many charts (`chart_workers`), worker processes draw them as well: they take the
    charts from the last, this process draws from the first, and it uses a worker's chart
    where the worker has finished it when this process gets there (never waiting for
    one). A chart is a pure function of its rows and the manifest, drawn with the same
    settings and bundled font in every process, so the bytes do not depend on which
    process drew it (tests/test_charts.py). Workers come from a fork server (a fresh
    interpreter: a process forked from one that has used polars can hang in it;
    simulator/app/sweep.py `start_method`), else are spawned."""
    work = [
        (
            session_file(trace, index),
            requests.filter((pl.col("trace") == trace) & (pl.col("session_index") == index)),
        )
        for trace, index in keys
    ]
    workers = chart_workers(len(work), jobs)
    if not workers:
        return ((name, _session_png(rows, manifest)) for name, rows in work)
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["reports.charts"])
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    # Submitted now, last first (the workers start from the end of the list), so the
    # workers start while the caller draws something else.
    futures = [pool.submit(_session_png, rows, manifest) for _, rows in reversed(work)][::-1]
    return _collected(pool, futures, work, manifest)


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
        pool.shutdown(wait=False, cancel_futures=True)  # a worker's chart in hand is not needed
