"""report.html: one self-contained page about a run, readable by people and diffable by CI.

Built only from a run directory's requests.parquet, sessions.parquet and manifest.json:
summary tables, the per-run charts and the charts of the most eventful sessions, each PNG
embedded as a data URI so the page is one file that opens anywhere (a CI artifact, an
e-mail). No script, no external resource, no time and no path: two runs on the same inputs
give byte-identical pages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from simulator.frames import (
    CHARTS_DIR,
    CHARTS_INDEX,
    MANIFEST_FILE,
    REPORT_FILE,
    REQUESTS_FILE,
    SESSIONS_FILE,
    has_loss,
    policy_summary,
    versus_recorded,
)

if TYPE_CHECKING:
    from reports.charts import ChartPool

__all__ = ["CHARTS_DIR", "CHARTS_INDEX", "REPORT_FILE", "ReportError", "build_report"]
#: Sessions that get a chart of their own (the most eventful, then the longest).
SESSION_CHARTS = 12
#: Rows of the session table shown; the rest are in sessions.parquet.
SESSION_ROWS = 200


class ReportError(ValueError):
    """A run directory a report cannot be made from (missing or unreadable files)."""


def read_run(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """The request rows, session rows and manifest of a run directory."""
    paths = [run_dir / REQUESTS_FILE, run_dir / SESSIONS_FILE, run_dir / MANIFEST_FILE]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ReportError(f"{run_dir.name or run_dir}: no {', '.join(missing)} (not a run)")
    try:
        requests = pl.read_parquet(paths[0])
        sessions = pl.read_parquet(paths[1])
        manifest = json.loads(paths[2].read_text())
    except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
        raise ReportError(f"{run_dir.name or run_dir}: unreadable run: {exc}") from exc
    needed = {"trace", "session_index", "request", "call", "kind", "policy", "params_hash"}
    lacking = needed - set(requests.columns)
    if lacking or not isinstance(manifest, dict) or "policies" not in manifest:
        raise ReportError(f"{run_dir.name or run_dir}: not a ctxsim run (columns or manifest)")
    return requests, sessions, manifest


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _dollars(value: float | None, unpriced: int = 0) -> str:
    text = "-" if value is None else f"${value:,.4f}"
    return text + ("*" if unpriced else "")


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _table(
    header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1, css: str = ""
) -> str:
    """An HTML table; the first `left` columns are text, the rest numbers (right-aligned).
    Wrapped so a wide table scrolls instead of overflowing the page."""
    head = "".join(
        f'<th class="{"l" if i < left else "n"}">{escape(h)}</th>' for i, h in enumerate(header)
    )
    body = "\n".join(
        "<tr>"
        + "".join(
            f'<td class="{"l" if i < left else "n"}">{escape(c)}</td>' for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    cls = f' class="{css}"' if css else ""
    return (
        f'<div class="scroll"><table{cls}>\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}\n</tbody>\n</table></div>"
    )


SUMMARY_HEADER = (
    "policy",
    "params",
    "requests",
    "calls",
    "compactions",
    "overflows",
    "breaker trips",
    "cost",
    "vs recorded",
    "cache hit",
    "human kept",
    "summary share",
    "stale file refs",
    "re-sent tokens",
)


def _versus(cost: float | None, recorded: float | None) -> str:
    """A policy's dollars against the recording's, as a signed share."""
    if cost is None or not recorded:
        return "-"
    return f"{(cost - recorded) / recorded:+.1%}"


def summary_cells(
    policy: str,
    params: str,
    r: dict[str, Any],
    recorded: float | None = None,
    compared: float | None = None,
) -> list[str]:
    """One summary row's cells (the figures of simulator/frames.py SUMMARY_COLUMNS);
    "vs recorded" is `compared` (the spec's dollars over the sessions that logged usage)
    against `recorded` (the recording's over the same sessions)."""
    return [
        policy,
        params,
        _count(r["requests"]),
        _count(r["calls"]),
        _count(r["compactions"]),
        _count(r["overflows"]),
        _count(r["breaker_trips"]),
        _dollars(r["cost_total"], r["unpriced_calls"]),
        _versus(compared, recorded),
        _percent(r["cache_hit_ratio"]),
        _percent(r["human_verbatim_share"]),
        _percent(r["summary_share"]),
        _count(r["stale_file_refs"]),
        _tokens(r["resent_tokens"]),
    ]


#: The mark of a policy with failed (overflowing) calls, as in the terminal tables
#: (reports/tables.py OVERFLOW_MARK).
FAILED_MARK = "!"


def _marked(policy: str, overflows: int | None) -> str:
    return f"{policy} {FAILED_MARK}" if overflows else policy


def _summary_table(requests: pl.DataFrame, sessions: pl.DataFrame) -> tuple[str, str]:
    """One row per policy spec (never a sum across policies: each replays the same work),
    and the note on the specs whose calls failed (a policy that overflows must not read as
    the cheapest or the one that loses least: its figures are of refused requests)."""
    summary = policy_summary(requests)
    versus = {}
    if "recorded_cost" in sessions.columns:
        versus = {
            (v["policy"], v["params_hash"]): v
            for v in versus_recorded(sessions).iter_rows(named=True)
            if v["compared_sessions"]
        }
    rows = []
    for r in summary.iter_rows(named=True):
        v = versus.get((r["policy"], r["params_hash"]), {})
        marked = _marked(r["policy"], r["overflows"])
        rows.append(
            summary_cells(
                marked, r["params_hash"], r, v.get("recorded_cost"), v.get("compared_cost")
            )
        )
    failed = [
        f"{r['policy']} ({r['overflows']:,} of {r['calls']:,} calls)"
        for r in summary.iter_rows(named=True)
        if r["overflows"]
    ]
    note = ""
    if failed:
        note = (
            f"{FAILED_MARK} Failed calls: {'; '.join(failed)} sent a prompt larger than the "
            "model's context window. The provider refuses such a request and bills nothing, "
            "so each is priced $0 here; the harness would have had to retry or compact. "
            "Their dollars, cache hit ratio and loss figures describe requests that "
            "failed: they are not the cheapest or the most faithful, they did not run."
        )
    return _table(SUMMARY_HEADER, rows, left=2), note


def _compared_note(sessions: pl.DataFrame) -> str:
    """Where only some sessions logged usage of priced models, what "vs recorded" is taken
    over (the cost column covers every session, so the two do not divide into each other)."""
    if "recorded_cost" not in sessions.columns:
        return ""
    for v in versus_recorded(sessions).iter_rows(named=True):
        if 0 < v["compared_sessions"] < v["sessions"]:
            return (
                f"vs recorded: the spec's dollars against the recording's "
                f"(${v['recorded_cost']:,.4f}) over the {v['compared_sessions']:,} of "
                f"{v['sessions']:,} replayed sessions (a subagent's its own) that logged "
                "usage of priced models; cost covers every session."
            )
    return ""


def _defaults(name: str) -> dict[str, Any] | None:
    """The parameters a registered policy is built with by default (None: not registered
    here, e.g. a run made by another version): what a spec is shown against."""
    from simulator import policy as registry

    try:
        return dict(registry.build(name).spec().params)
    except registry.PolicyError:
        return None


def _policies_table(manifest: dict[str, Any]) -> str:
    """Each spec with the parameters it sets apart from its policy's defaults (all of them
    are in manifest.json; `ctxsim policies show NAME` lists the defaults)."""
    rows = []
    for p in manifest["policies"]:
        params = p.get("params", {})
        base = _defaults(str(p.get("name", "")))
        shown = params if base is None else {k: v for k, v in params.items() if base.get(k) != v}
        text = ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(shown.items()))
        if base is not None:
            same = len(params) - len(shown)
            if p.get("version") == "matched":
                lead = "each session under the preset of its recorded version"
                text = f"{lead}; {text}" if text else lead
            elif not text:
                text = f"the defaults ({same} parameters)" if same else "no parameters"
            else:
                text += f"; {same} more at their defaults" if same else ""
        name = str(p.get("name", "?"))
        if p.get("variant"):
            name = f"{p['variant']} ({name})"
        rows.append([name, str(p.get("version", "?")), str(p.get("params_hash", "?")), text])
    return _table(["policy", "version", "params hash", "parameters"], rows, 4, "params")


#: Figures of each policy spec in the session table, one group of columns per spec (short
#: headers: four specs must fit the page; the summary and sessions.parquet have the rest).
SESSION_FIGURES = ("cost", "compact", "overflow")


def _sessions_table(sessions: pl.DataFrame) -> tuple[str, str]:
    """The session table pivoted by policy: one row per session (the costliest under any
    spec first, at most SESSION_ROWS), one group of columns per spec, so a reader compares
    policies along a row and never reads a sum across them; and a note on cuts."""
    from reports.charts import short_id, spec_labels

    specs = sorted({(r["policy"], r["params_hash"]) for r in sessions.iter_rows(named=True)})
    labels = spec_labels(specs)
    keys = ["trace", "session_index", "session"]
    order = (
        sessions.group_by(keys)
        .agg(pl.col("cost_total").max().alias("top"), pl.col("requests").max())
        .sort(["top", *keys], descending=[True, False, False, False], nulls_last=True)
    )
    shown = order.head(SESSION_ROWS)
    cells: dict[tuple[str, int, str, str, str], dict[str, Any]] = {
        (r["trace"], r["session_index"], r["session"], r["policy"], r["params_hash"]): r
        for r in sessions.iter_rows(named=True)
    }
    rows = []
    for s in shown.iter_rows(named=True):
        row = [
            short_id(s["trace"], 24),
            str(s["session_index"]),
            short_id(s["session"], 16),
            _count(s["requests"]),
        ]
        for policy, params_hash in specs:
            r = cells.get((s["trace"], s["session_index"], s["session"], policy, params_hash))
            if r is None:
                row += ["-"] * len(SESSION_FIGURES)
                continue
            overflows = _count(r["overflows"]) + (f" {FAILED_MARK}" if r["overflows"] else "")
            row += [
                _dollars(r["cost_total"], r["unpriced_calls"]),
                _count(r["compactions"]),
                overflows,
            ]
        rows.append(row)
    head_top = "".join(
        f'<th class="l" rowspan="2">{escape(h)}</th>' for h in ("trace", "#", "session")
    )
    head_top += '<th class="n" rowspan="2">requests</th>'
    head_top += "".join(
        f'<th class="group" colspan="{len(SESSION_FIGURES)}">{escape(labels[spec])}</th>'
        for spec in specs
    )
    head_sub = "".join(
        f'<th class="n{" first" if i == 0 else ""}">{escape(f)}</th>'
        for _ in specs
        for i, f in enumerate(SESSION_FIGURES)
    )
    width = len(SESSION_FIGURES)

    def cell(i: int, text: str) -> str:
        if i < 3:
            return f'<td class="l">{escape(text)}</td>'
        first = i >= 4 and (i - 4) % width == 0
        return f'<td class="n{" first" if first else ""}">{escape(text)}</td>'

    body = "\n".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    table = (
        '<div class="scroll"><table class="sessions">\n'
        f"<thead><tr>{head_top}</tr>\n<tr>{head_sub}</tr></thead>\n"
        f"<tbody>\n{body}\n</tbody>\n</table></div>"
    )
    note = ""
    if order.height > shown.height:
        note = (
            f"The {shown.height} costliest of {order.height} sessions; "
            "sessions.parquet has them all."
        )
    return table, note


def _img(data: bytes, alt: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img src="data:image/png;base64,{encoded}" alt="{escape(alt)}">'


def _figure(data: bytes, alt: str, caption: str) -> str:
    return f"<figure>{_img(data, alt)}<figcaption>{escape(caption)}</figcaption></figure>"


CAPTIONS = {
    "cost_by_policy.png": (
        "Cost by policy",
        "Dollars per policy spec over all sessions, stacked by component: the requests' "
        "uncached input, cache reads, 5-minute and 1-hour cache writes and output, then the "
        "policy's own compaction calls (all their components together).",
    ),
    "cache_hit_ratio.png": (
        "Cache hit ratio",
        "Tokens read from the cache over all prompt tokens, every call of the policy.",
    ),
    "events_by_policy.png": (
        "Compactions, overflows and breaker trips",
        "Compaction calls the policy made; requests whose view a compaction had just "
        "rewritten (under as-recorded: the recording's own compactions); calls whose view "
        "exceeded the model's window; calls whose failure tripped a circuit breaker.",
    ),
    "loss_by_policy.png": (
        "What each policy loses",
        "Share of the human's own words still sent verbatim; share of the request context "
        "that a compaction wrote (summary and restored context); tool calls that named a "
        "file whose last read result was no longer in the view; prompt tokens re-sent (not "
        "read from the cache) right after compactions.",
    ),
}

DEFINITIONS = (
    ("cost", "sum of cost_total over priced calls, USD (* when some calls have no price)"),
    ("cache hit", "sum(cache_read) / sum(uncached_input + cache_read + cache writes)"),
    (
        "human kept",
        "human_verbatim_tokens / human_tokens summed over requests: the share of the "
        "human's own words still sent unchanged",
    ),
    (
        "summary share",
        "summary_tokens / context_tokens summed over requests: the share of the view a "
        "compaction wrote (its summary and what it restored) instead of the history",
    ),
    (
        "stale file refs",
        "tool calls naming a file whose last read result was cleared or compacted away",
    ),
    (
        "re-sent tokens",
        "uncached input + cache writes of the first request after each compaction",
    ),
)

STYLE = """
body { font-family: "DejaVu Sans", Verdana, sans-serif; margin: 24px auto; max-width: 1240px;
       color: #222; padding: 0 16px; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px;
     border-bottom: 1px solid #ddd; padding-bottom: 3px; }
p.facts { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { background: #f4f4f4; white-space: normal; vertical-align: bottom; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
td.l, th.l { text-align: left; }
table.params td:nth-child(4) { white-space: normal; }
th.group { text-align: center; border-left: 2px solid #ccc; }
td.first, th.first { border-left: 2px solid #ccc; }
div.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 12px 0 20px; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 12px; color: #555; max-width: 900px; }
.grid { display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: flex-start; }
p.failed { background: #fff4e5; border-left: 4px solid #e08a00; padding: 6px 10px; }
dl { font-size: 12px; } dt { font-weight: bold; } dd { margin: 0 0 6px 16px; }
"""


def _prices_fact(manifest: dict[str, Any]) -> str:
    """The price table and the day its rates date from (simulator/frames.py prices_date),
    not the far-future pricing instant the manifest's `prices` names."""
    prices = str(manifest.get("prices", "prices unknown"))
    day = manifest.get("prices_date")
    if not day:
        return prices
    table = prices.split(" as of ", 1)[0]
    return f"prices: {table}, its newest rates (the latest dated change: {day})"


def render(
    requests: pl.DataFrame,
    sessions: pl.DataFrame,
    manifest: dict[str, Any],
    run_charts: dict[str, bytes],
    session_pngs: Sequence[tuple[tuple[str, int], str, bytes]],
) -> str:
    """The page, from the run's rows and its already drawn charts."""
    traces = manifest.get("traces", [])
    facts = [
        f"ctxsim {manifest.get('ctxsim_version', '?')}",
        _prices_fact(manifest),
        f"seed {manifest.get('seed', '?')}",
        f"cache model {manifest.get('cache', '?')}",
        f"{len(traces)} trace(s)",
        f"{requests.select('trace', 'session_index').unique().height} session(s)",
        f"{requests.height:,} calls",
    ]
    if manifest.get("recorded_cost") is not None:
        facts.append(f"recorded usage priced the same way: ${manifest['recorded_cost']:,.4f}")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>ctxsim report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>ctxsim report</h1>",
        f'<p class="facts">{escape(" · ".join(facts))}</p>',
        "<h2>Policies</h2>",
        _policies_table(manifest),
    ]
    summary, failed_note = _summary_table(requests, sessions)
    parts += ["<h2>Summary</h2>", summary]
    if failed_note:
        parts.append(f'<p class="failed">{escape(failed_note)}</p>')
    unpriced = int(requests["cost_total"].null_count())
    if unpriced:
        parts.append(f"<p>* dollars leave out {unpriced:,} call(s) whose model has no price.</p>")
    compared = _compared_note(sessions)
    if compared:
        parts.append(f"<p>{escape(compared)}</p>")
    if not has_loss(requests):
        parts.append("<p>This run's rows carry no loss proxies (made by an older ctxsim).</p>")
    parts.append("<h2>Charts</h2>")
    if failed_note:
        parts.append(
            f'<p class="failed">{FAILED_MARK} The bars of a policy with failed calls count '
            "those calls at $0 and their views as sent: read them as failed, not as best.</p>"
        )
    parts.append('<div class="grid">')
    for name, data in run_charts.items():
        title, caption = CAPTIONS.get(name, (name, ""))
        parts.append(_figure(data, title, caption))
    parts.append("</div>")
    table, note = _sessions_table(sessions)
    parts += ["<h2>Sessions</h2>", table]
    if note:
        parts.append(f"<p>{escape(note)}</p>")
    if session_pngs:
        parts.append("<h2>Context over the session</h2>")
        parts.append(
            "<p>The sessions where something happened (a compaction, an overflow, a breaker "
            "trip) first, then the longest. Each line is one policy's context per request; "
            "horizontal lines are the model's window and the thresholds the policy's "
            "parameters state.</p>"
        )
        for (trace, index), name, data in session_pngs:
            caption = f"{trace} #{index} ({CHARTS_DIR}/{name})"
            parts.append(_figure(data, f"session {index} of {trace}", caption))
    parts.append("<h2>Definitions</h2><dl>")
    for term, text in DEFINITIONS:
        parts.append(f"<dt>{escape(term)}</dt><dd>{escape(text)}</dd>")
    parts.append(
        "</dl><p>Every column and figure is defined, with its unit, in reports/METRICS.md.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_report(
    run_dir: Path,
    *,
    session_limit: int = SESSION_CHARTS,
    progress: Callable[[list[tuple[str, int]]], Iterable[tuple[str, int]]] | None = None,
    pool: ChartPool | None = None,
) -> dict[str, bytes]:
    """report.html and every chart of a run directory, by path relative to it.

    Reads only the run's files. `progress` wraps the list of sessions to chart (the slow
    part), so a caller can show a bar. With `pool` (reports/charts.py ChartPool: workers
    started before the run's replay), its workers draw every chart and this process does
    not import matplotlib.
    """
    from reports import charts

    requests, sessions, manifest = read_run(run_dir)
    if requests.is_empty():
        raise ReportError(f"{run_dir.name or run_dir}: the run has no request rows")
    files: dict[str, bytes] = {}
    keys = charts.session_keys(requests, session_limit)
    # The run's charts go to `pool`'s workers first, the slowest (reports/charts.py
    # `run_charts_started`); without a pool they are drawn here at `started()`, after the
    # session charts' own workers, if any, have started on those (`session_charts`).
    started = charts.run_charts_started(requests, pool)
    drawn = charts.session_charts(requests, manifest, keys, pool=pool)
    per_run = started()
    for name, data in per_run.items():
        files[f"{CHARTS_DIR}/{name}"] = data
    chosen = progress(keys) if progress is not None else keys
    pngs = []
    for key, (name, data) in zip(chosen, drawn, strict=True):
        files[f"{CHARTS_DIR}/{name}"] = data
        pngs.append((key, name, data))
    page = render(requests, sessions, manifest, per_run, pngs)
    files[REPORT_FILE] = page.encode("utf-8")
    charts_written = sorted(n for n in files if n.startswith(f"{CHARTS_DIR}/"))
    files[CHARTS_INDEX] = "".join(f"{n}\n" for n in charts_written).encode("utf-8")
    return files
