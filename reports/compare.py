"""`ctxsim compare BASELINE CANDIDATE`: two runs side by side, and a gate CI can fail on.

Both runs must have replayed the same traces (same names and source digests); otherwise
their figures do not measure the same work and the comparison is refused (exit 2). Policy
specs are paired by policy name (by parameter hash too, where a run holds several specs of
one name); two runs of one spec each with different names are paired with each other, which
is the usual CI set-up (baseline policy against candidate policy). Every figure is the run
summary of simulator/frames.py over the paired specs' request rows; "overall" is the same
over all paired specs together.

A limit is a bound on how much worse a figure may get, in the figure's own unit (`0`,
`0.05`, `$0.10`), relative to the baseline (`2%`), or in percentage points for shares
(`0.5pp`). It is checked on every compared row (each pair and overall).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI builds its options from METRICS: keep this module light
    import polars as pl

Spec = tuple[str, str]

EXIT_OK = 0
EXIT_CROSSED = 1
EXIT_UNUSABLE = 2


@dataclass(frozen=True)
class Metric:
    """A compared figure: its summary column, unit and which direction is worse."""

    key: str
    label: str
    unit: str  # "usd", "share", "count" or "tokens"
    worse: int  # +1: an increase is worse; -1: a decrease is worse
    option: str  # the limit's option: --max-<option>

    @property
    def param(self) -> str:
        return "max_" + self.option.replace("-", "_")


METRICS: tuple[Metric, ...] = (
    Metric("cost_total", "cost", "usd", +1, "cost-increase"),
    Metric("cache_hit_ratio", "cache hit ratio", "share", -1, "hit-ratio-decrease"),
    Metric("compactions", "compactions", "count", +1, "compaction-increase"),
    Metric("breaker_trips", "breaker trips", "count", +1, "breaker-trip-increase"),
    Metric("overflows", "overflows", "count", +1, "overflow-increase"),
    Metric("edits", "context edits", "count", +1, "edit-increase"),
    Metric("edit_tokens", "tokens edited out", "tokens", +1, "edit-token-increase"),
    Metric("human_verbatim_share", "human words kept", "share", -1, "human-kept-decrease"),
    Metric("summary_share", "summary share of view", "share", +1, "summary-share-increase"),
    Metric("stale_file_refs", "stale file refs", "count", +1, "stale-ref-increase"),
    Metric("resent_tokens", "re-sent tokens", "tokens", +1, "resent-increase"),
)
BY_KEY = {m.key: m for m in METRICS}


@dataclass(frozen=True)
class Limit:
    """How much worse a figure may get: `absolute` in its unit, or `relative` to the
    baseline (0.02 = 2%)."""

    text: str
    value: float
    relative: bool

    def crossed(self, base: float, cand: float, worse: int) -> bool:
        """Whether the change from `base` to `cand` is worse than allowed."""
        change = (cand - base) * worse
        if self.relative:
            if base == 0:
                ratio = 0.0 if change == 0 else math.copysign(math.inf, change)
            else:
                ratio = change / abs(base)
            return ratio > self.value + 1e-12
        return change > self.value + 1e-9 * max(1.0, abs(self.value))


_LIMIT = re.compile(r"^\s*([+-]?)\s*(\$?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|pp)?\s*$")


def parse_limit(text: str, metric: Metric) -> Limit:
    """`2%` (relative), `0.5pp` (points, shares only), `$0.10` or `3` (absolute)."""
    m = _LIMIT.match(text)
    if not m:
        raise ValueError(f"{text!r}: expected a number, N%, or Npp")
    sign, dollar, number, suffix = m.groups()
    value = float(number) * (-1 if sign == "-" else 1)
    if dollar and metric.unit != "usd":
        raise ValueError(f"{text!r}: $ is for cost only")
    if suffix == "%":
        return Limit(text.strip(), value / 100, True)
    if suffix == "pp":
        if metric.unit != "share":
            raise ValueError(f"{text!r}: pp (percentage points) is for shares only")
        return Limit(text.strip(), value / 100, False)
    return Limit(text.strip(), value, False)


@dataclass(frozen=True)
class Run:
    label: str  # "baseline" or "candidate"
    requests: pl.DataFrame
    manifest: dict[str, Any]

    def specs(self) -> list[Spec]:
        frame = self.requests.select("policy", "params_hash").unique()
        return sorted((r[0], r[1]) for r in frame.iter_rows())

    def rows_of(self, specs: list[Spec]) -> pl.DataFrame:
        import polars as pl

        keys = pl.DataFrame(
            {"policy": [s[0] for s in specs], "params_hash": [s[1] for s in specs]},
            schema={"policy": pl.String, "params_hash": pl.String},
        )
        return self.requests.join(keys, on=["policy", "params_hash"], how="semi")


def load(run_dir: Path, label: str) -> Run:
    from reports.html import read_run

    requests, _, manifest = read_run(run_dir)
    return Run(label, requests, manifest)


def check_same_traces(base: Run, cand: Run) -> None:
    """Refuse runs over different traces: their figures would not measure the same work."""

    def traces(run: Run) -> set[tuple[str, str]]:
        return {(t.get("name", ""), t.get("source_digest", "")) for t in run.manifest["traces"]}

    from reports.html import ReportError

    b, c = traces(base), traces(cand)
    if b != c:
        only_b, only_c = len(b - c), len(c - b)
        raise ReportError(
            f"the runs replayed different traces ({only_b} only in the baseline, {only_c} "
            "only in the candidate); compare runs over the same trace set"
        )


def pair_specs(base: list[Spec], cand: list[Spec]) -> list[tuple[Spec, Spec, str]]:
    """(baseline spec, candidate spec, label) of each compared pair."""
    pairs: list[tuple[Spec, Spec, str]] = []
    names = sorted({s[0] for s in base} & {s[0] for s in cand})
    for name in names:
        b = [s for s in base if s[0] == name]
        c = [s for s in cand if s[0] == name]
        if len(b) == 1 and len(c) == 1:
            label = name if b[0][1] == c[0][1] else f"{name} ({b[0][1][:6]} → {c[0][1][:6]})"
            pairs.append((b[0], c[0], label))
            continue
        for spec in b:
            if spec in c:
                pairs.append((spec, spec, f"{name} #{spec[1][:6]}"))
    if not pairs and len(base) == 1 and len(cand) == 1:
        pairs.append((base[0], cand[0], f"{base[0][0]} → {cand[0][0]}"))
    return pairs


@dataclass(frozen=True)
class Row:
    scope: str
    metric: Metric
    base: Any
    cand: Any
    limit: Limit | None
    crossed: bool
    #: Calls each side's dollars leave out (no price for their model): cost rows only.
    unpriced: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Comparison:
    base: Run
    cand: Run
    pairs: list[tuple[Spec, Spec, str]]
    rows: list[Row]
    unpaired: list[str]

    @property
    def crossed(self) -> list[Row]:
        return [r for r in self.rows if r.crossed]

    @property
    def exit_code(self) -> int:
        return EXIT_CROSSED if self.crossed else EXIT_OK


def compare(base: Run, cand: Run, limits: dict[str, Limit]) -> Comparison:
    """Every figure of every pair and overall, each checked against its limit.

    Raises ReportError when the runs cannot be compared (different traces, nothing to pair,
    a limit on a figure one run lacks).
    """
    from reports.html import ReportError
    from simulator.frames import overall_summary

    check_same_traces(base, cand)
    base_specs, cand_specs = base.specs(), cand.specs()
    pairs = pair_specs(base_specs, cand_specs)
    if not pairs:
        raise ReportError(
            "no policy spec to compare: the runs share no policy name and do not hold one spec each"
        )
    paired_b = {p[0] for p in pairs}
    paired_c = {p[1] for p in pairs}
    unpaired = [f"baseline {s[0]} #{s[1]}" for s in base_specs if s not in paired_b]
    unpaired += [f"candidate {s[0]} #{s[1]}" for s in cand_specs if s not in paired_c]
    scopes = [(label, base.rows_of([b]), cand.rows_of([c])) for b, c, label in pairs]
    if len(pairs) > 1:
        scopes.append(("overall", base.rows_of(sorted(paired_b)), cand.rows_of(sorted(paired_c))))
    rows: list[Row] = []
    for scope, b_rows, c_rows in scopes:
        b_sum, c_sum = overall_summary(b_rows), overall_summary(c_rows)
        for metric in METRICS:
            limit = limits.get(metric.key)
            bv, cv = b_sum[metric.key], c_sum[metric.key]
            if limit is not None and (bv is None or cv is None):
                side = base.label if bv is None else cand.label
                raise ReportError(
                    f"--max-{metric.option}: the {side} run has no {metric.label} "
                    f"({scope}); made by an older ctxsim, or nothing to measure"
                )
            crossed = limit is not None and limit.crossed(float(bv), float(cv), metric.worse)
            unpriced = (0, 0)
            if metric.unit == "usd":
                unpriced = (int(b_sum["unpriced_calls"] or 0), int(c_sum["unpriced_calls"] or 0))
            rows.append(Row(scope, metric, bv, cv, limit, crossed, unpriced))
    return Comparison(base, cand, pairs, rows, unpaired)


# -- rendering ----------------------------------------------------------------------------


def _value(metric: Metric, v: Any) -> str:
    if v is None:
        return "-"
    if metric.unit == "usd":
        return f"${v:,.4f}"
    if metric.unit == "share":
        return f"{100 * v:.1f}%"
    return f"{int(v):,}"


def _change(metric: Metric, b: Any, c: Any) -> str:
    if b is None or c is None:
        return "-"
    d = c - b
    if metric.unit == "share":
        return f"{100 * d:+.1f} pp"
    sign = "+" if d >= 0 else "-"
    text = f"{sign}${abs(d):,.4f}" if metric.unit == "usd" else f"{int(d):+,}"
    if b:
        text += f" ({100 * d / abs(b):+.1f}%)"
    return text


def _limit(metric: Metric, limit: Limit | None) -> str:
    if limit is None:
        return ""
    word = "increase" if metric.worse > 0 else "decrease"
    return f"{word} ≤ {limit.text}"


#: The mark of an overflowing policy (reports/tables.py OVERFLOW_MARK, kept in step).
OVERFLOW_MARK = "!"


def _shown(metric: Metric, v: Any, unpriced: int = 0) -> str:
    """A figure as shown, an overflow count above zero marked (issue 15: a policy whose
    requests do not fit its window must not pass for the cheapest), and dollars that leave
    out unpriced calls marked *."""
    text = _value(metric, v)
    if metric.key == "overflows" and v:
        text += " " + OVERFLOW_MARK
    if unpriced and v is not None:
        text += "*"
    return text


def _unpriced_note(result: Comparison) -> str | None:
    """The note on dollars marked *, with how many calls each side leaves out, or None."""
    rows = [r for r in result.rows if r.scope != "overall" and any(r.unpriced)]
    if not rows:
        return None
    base = sum(r.unpriced[0] for r in rows)
    cand = sum(r.unpriced[1] for r in rows)
    return (
        f"* dollars leave out calls whose model has no price (baseline {base:,}, candidate "
        f"{cand:,}); a change there is not in the dollars."
    )


def _overflow_note(result: Comparison) -> str | None:
    """One line naming each side of each pair that overflowed, or None."""
    named = []
    for row in result.rows:
        if row.metric.key != "overflows" or row.scope == "overall":
            continue
        for side, value in (("baseline", row.base), ("candidate", row.cand)):
            if value:
                named.append(f"{side} {row.scope} ({int(value):,})")
    if not named:
        return None
    return (
        f"{OVERFLOW_MARK} overflowed: {', '.join(named)} request(s) larger than the model's "
        "context window, which the API refuses; compare such a policy with care."
    )


def _spec_text(run: Run) -> str:
    specs = run.specs()
    return ", ".join(f"`{name}` {h}" for name, h in specs)


def render_markdown(result: Comparison) -> str:
    """The comparison as GitHub-flavoured markdown (a CI job summary)."""
    b, c = result.base, result.cand
    traces = len(b.manifest["traces"])
    lines = [
        "## ctxsim compare",
        "",
        f"Baseline: {_spec_text(b)}. Candidate: {_spec_text(c)}. "
        f"{traces} trace(s), the same in both runs.",
    ]
    if b.manifest.get("prices") != c.manifest.get("prices"):
        lines.append("")
        lines.append(
            f"Note: the runs used different price tables ({b.manifest.get('prices')} / "
            f"{c.manifest.get('prices')}); dollar changes include price changes."
        )
    if result.unpaired:
        lines.append("")
        lines.append("Not compared (no counterpart): " + "; ".join(result.unpaired) + ".")
    lines += [
        "",
        "| policy | metric | baseline | candidate | change | limit | status |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    previous = None
    for row in result.rows:
        scope = f"**{row.scope}**" if row.scope != previous else ""
        previous = row.scope
        status = "" if row.limit is None else ("❌ crossed" if row.crossed else "✅ ok")
        lines.append(
            f"| {scope} | {row.metric.label} | {_shown(row.metric, row.base, row.unpriced[0])} | "
            f"{_shown(row.metric, row.cand, row.unpriced[1])} | "
            f"{_change(row.metric, row.base, row.cand)} | "
            f"{_limit(row.metric, row.limit)} | {status} |"
        )
    lines.append("")
    for note in (_overflow_note(result), _unpriced_note(result)):
        if note is not None:
            lines += [note, ""]
    limited = [r for r in result.rows if r.limit is not None]
    if result.crossed:
        lines.append(f"**{len(result.crossed)} limit(s) crossed:**")
        lines.append("")
        for r in result.crossed:
            lines.append(
                f"- {r.scope}: {r.metric.label} {_change(r.metric, r.base, r.cand)} "
                f"(allowed: {_limit(r.metric, r.limit)})"
            )
    elif limited:
        lines.append(f"**All {len(limited)} limit check(s) hold.**")
    else:
        lines.append("No limits set (add --max-cost-increase 2% and the like to gate).")
    return "\n".join(lines) + "\n"


def _header_lines(result: Comparison) -> list[str]:
    b, c = result.base, result.cand
    lines = [
        f"baseline: {_spec_text(b).replace('`', '')}; candidate: "
        f"{_spec_text(c).replace('`', '')}; {len(b.manifest['traces'])} trace(s), the same in both"
    ]
    if b.manifest.get("prices") != c.manifest.get("prices"):
        lines.append(
            f"note: the runs used different price tables ({b.manifest.get('prices')} / "
            f"{c.manifest.get('prices')}); dollar changes include price changes"
        )
    if result.unpaired:
        lines.append("not compared (no counterpart): " + "; ".join(result.unpaired))
    return lines


def render_terminal(result: Comparison, width: int | None = None) -> str:
    """The comparison as a terminal table that fits the terminal (reports/tables.py); the
    same figures as `render_markdown`, which `--markdown` prints for CI job summaries."""
    from reports.tables import Column, render, wrap

    columns = [
        Column("policy", wrap=True),
        Column("metric"),
        Column("baseline", right=True),
        Column("candidate", right=True),
        Column("change", right=True),
        Column("limit", drop=1),
        Column("status", drop=2),
    ]
    rows = []
    previous = None
    for row in result.rows:
        scope = row.scope if row.scope != previous else ""
        previous = row.scope
        status = "" if row.limit is None else ("crossed" if row.crossed else "ok")
        rows.append(
            [
                scope,
                row.metric.label,
                _shown(row.metric, row.base, row.unpriced[0]),
                _shown(row.metric, row.cand, row.unpriced[1]),
                _change(row.metric, row.base, row.cand),
                _limit(row.metric, row.limit),
                status,
            ]
        )
    notes = [n for n in (_overflow_note(result), _unpriced_note(result)) if n is not None]
    limited = [r for r in result.rows if r.limit is not None]
    if result.crossed:
        notes.append(f"{len(result.crossed)} limit(s) crossed:")
        notes += [
            f"- {r.scope}: {r.metric.label} {_change(r.metric, r.base, r.cand)} "
            f"(allowed: {_limit(r.metric, r.limit)})"
            for r in result.crossed
        ]
    elif limited:
        notes.append(f"All {len(limited)} limit check(s) hold.")
    else:
        notes.append("No limits set (add --max-cost-increase 2% and the like to gate).")
    head = "\n".join(wrap(_header_lines(result), width)) + "\n"
    return head + render(columns, rows, notes=notes, width=width)
