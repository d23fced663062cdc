"""Fit the synthetic session generator (traces/synthetic.py) to the real Claude Code corpus.

Regenerates ``traces/synthetic_params.json`` from the compiled Claude Code traces in
``../shared/traces/claude-code`` (run ``python -m simulator.app.measure.synth_fit``;
``--check`` compares with the committed file instead of writing it, and exits 1 when they differ).
The method is written up in traces/README.md, section "Synthetic traces", and in the file's own
``methods`` entry.

Only what a compiled trace holds in clear is read: block counts, kinds, roles, flags, tool
names, token counts, timestamps and model names. No message text exists at this level, and
the data file holds numbers, tool names and a model name only.

Which sessions: the main sessions with at least one request. Subagents are left out: the
generator makes main sessions, and a subagent's mix (mostly reads, no human) would pull the
main-session statistics towards its own. Estimates pool requests (or blocks) over all those
sessions, so a long session weighs more than a short one: the generator makes long
sessions, and a per-session average would over-weight the many two-request ones.

Which sizes: the anchored counts (`tokens`), not the raw tokenizer estimate: they are what
a block adds to the recorded context, with the API's framing and the unlogged reminders
that entered with it, and they are what replay uses. Zero-token blocks (an empty output,
or a block whose share of the recorded growth rounded to nothing) cannot enter a
log-normal fit; they are counted (``n_zero``) and left out.

The script lives with the application's measurements because a reader may not be the place
where the corpus is measured (tests/test_architecture.py keeps readers free of that).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from simulator.model import Flag, Kind, Session
from traces.load import load_all, units
from traces.synthetic import (
    FIVE_MINUTES_MS,
    MAX_CALLS,
    ONE_HOUR_MS,
    OTHER_TOOL,
    PARAMS_PATH,
    SynthParams,
)

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CORPUS = ROOT.parent / "shared" / "traces" / "claude-code"
#: How the corpus is named in the data file (never a machine path).
CORPUS_NAME = "../shared/traces/claude-code"
#: Significant digits kept for every fitted real number: the committed file must be exactly
#: reproducible, so platform-level float noise is rounded away.
DIGITS = 4
#: Tools kept by name (by number of calls); the rest are pooled as `OTHER_TOOL`.
TOP_TOOLS = 10
#: Quantiles that clip a log-normal draw: without them the tail of a fitted log-normal
#: produces sizes far beyond anything recorded (a sigma of 2 puts 1 draw in 1,000 above
#: 480x the median).
CLIP = (0.01, 0.99)

METHODS: dict[str, str] = {
    "corpus": (
        "Main sessions (not subagents) with at least one request, of every compiled Claude "
        "Code trace under the corpus, read with lenient=True. Only counts, kinds, flags, "
        "tool names, token counts, timestamps and model names are read."
    ),
    "sizes": (
        "Token sizes are anchored counts (the block's share of the recorded context growth), "
        "which is what replay uses. Zero-token blocks are counted as n_zero and left out."
    ),
    "lognormal": (
        "log_mu and log_sigma are the mean and sample standard deviation (n-1) of the logs "
        "(moments of the logs, the maximum-likelihood log-normal); median = exp(log_mu). "
        "Draws are rounded and clipped to [lo, hi], the observed 1st and 99th percentiles "
        "(inverted CDF: observed values). observed_median is for comparison only."
    ),
    "share": "share = k / n: k events among n opportunities.",
    "model": "The model of most recorded requests: the generator's default model.",
    "prefix_tokens": "Session.prefix_tokens (inferred system + tools prefix), one per session.",
    "human_turns": (
        "Requests after a session's first that carry a human message (a block with "
        "Flag.HUMAN entering there). The generator ends a turn (a response without "
        "tool_use) with this probability, so it is also its share of human-turn requests."
    ),
    "human_tokens": "Sum of the human text blocks entering at a human-turn request.",
    "calls_per_response": (
        "tool_use blocks per response (blocks whose origin is the request). p[i] is the "
        "share of i+1 calls among responses with at least one; counts above the cap are "
        "pooled into the cap (a request then adds at most 2 + 2 x cap blocks, within the "
        "API's 20-block cache lookback)."
    ),
    "text_final_tokens": "Assistant text of responses without tool_use (the turn's answer).",
    "text_with_tools": "Share of responses with tool_use that also carry assistant text.",
    "thinking": (
        "Share of responses with a thinking block, over the sessions that log thinking at "
        "all (Claude Code 1.0 transcripts do not); thinking_tokens sums a response's "
        "thinking blocks."
    ),
    "tools": (
        "Share of each tool among tool_use blocks; the top tools by count, the rest pooled "
        "as 'Other'. use and result are log-normal sizes of the tool's tool_use and "
        "tool_result blocks; error is the share of its results flagged as errors."
    ),
    "gaps_ms": (
        "Gap before request k = ts[k] - ts[k-1], split by whether request k starts a human "
        "turn. Per class: idle_share is the share of gaps of 5 minutes or more, "
        "over_1h_share the share of 1 hour or more; short is a log-normal over the gaps "
        "under 5 minutes. The generator draws an idle gap log-uniformly in [5 min, 1 h) or "
        "[1 h, idle_max] (too few idle gaps to fit a shape)."
    ),
    "summary_tokens": (
        "Compaction summary blocks (their anchored size is the whole post-compaction "
        "context less the prefix: what the sawtooth falls to)."
    ),
}


def _sig(x: float) -> float:
    """`x` to DIGITS significant digits (a float that prints the same everywhere)."""
    return 0.0 if x == 0 else float(f"{x:.{DIGITS}g}")


def share(k: int, n: int) -> dict[str, Any]:
    """A share with its counts, so the reader can judge its precision."""
    return {"share": _sig(k / n) if n else 0.0, "k": k, "n": n}


def lognormal(values: Iterable[int]) -> dict[str, Any]:
    """Log-normal by moments of the logs, clipped at the observed CLIP quantiles."""
    v = np.asarray(list(values), dtype=np.int64)
    pos = v[v > 0]
    n = len(pos)
    if n == 0:
        raise ValueError("no positive values to fit a log-normal to")
    logs = np.log(pos.astype(np.float64))
    mu = _sig(float(logs.mean()))
    sigma = _sig(float(logs.std(ddof=1))) if n > 1 else 0.0
    lo, hi = (int(q) for q in np.quantile(pos, CLIP, method="inverted_cdf"))
    return {
        "log_mu": mu,
        "log_sigma": sigma,
        "lo": lo,
        "hi": hi,
        "median": round(math.exp(mu)),
        "observed_median": round(float(np.median(pos))),
        "n": n,
        "n_zero": int(len(v) - n),
    }


@dataclass
class Sample:
    """What the fit takes from the corpus, pooled over the main sessions."""

    traces: int = 0
    sessions: int = 0
    requests: int = 0
    models: Counter[str] = field(default_factory=Counter)
    prefix: list[int] = field(default_factory=list)
    later_requests: int = 0
    human_requests: int = 0
    human_tokens: list[int] = field(default_factory=list)
    calls: Counter[int] = field(default_factory=Counter)
    text_final: list[int] = field(default_factory=list)
    tool_responses: int = 0
    text_with_tools: list[int] = field(default_factory=list)
    thinking_sessions: int = 0
    thinking_responses: int = 0
    thinking: list[int] = field(default_factory=list)
    uses: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    results: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    errors: defaultdict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))
    gaps_turn: list[int] = field(default_factory=list)
    gaps_human: list[int] = field(default_factory=list)
    summary: list[int] = field(default_factory=list)

    def add(self, s: Session) -> None:
        """Add one main session's counts."""
        n = s.n_requests
        b, r = s.blocks, s.requests
        kind, tokens, flags = b["kind"], b["tokens"].astype(np.int64), b["flags"]
        self.sessions += 1
        self.requests += n
        self.models.update(s.models[m] for m in r["model"].tolist())
        if s.prefix_tokens > 0:
            self.prefix.append(s.prefix_tokens)
        human_block = ((flags & Flag.HUMAN) != 0) & (kind == Kind.TEXT) & (b["first_request"] < n)
        human_at = b["first_request"][human_block]
        human_tokens = np.bincount(human_at, weights=tokens[human_block], minlength=n)
        is_human = np.zeros(n, dtype=np.bool_)
        is_human[human_at] = True
        self.later_requests += max(n - 1, 0)
        self.human_requests += int(is_human[1:].sum())
        self.human_tokens.extend(human_tokens[is_human].astype(np.int64).tolist())
        gaps = np.diff(r["ts"])
        self.gaps_turn.extend(gaps[~is_human[1:]].tolist())
        self.gaps_human.extend(gaps[is_human[1:]].tolist())
        self._responses(s, kind, tokens)
        for i in np.flatnonzero((kind == Kind.TOOL_USE) | (kind == Kind.TOOL_RESULT)).tolist():
            tool = s.tools[b["tool"][i]] if b["tool"][i] >= 0 else OTHER_TOOL
            if kind[i] == Kind.TOOL_USE:
                self.uses[tool].append(int(tokens[i]))
            else:
                self.results[tool].append(int(tokens[i]))
                self.errors[tool].append(bool(flags[i] & Flag.ERROR))
        self.summary.extend(tokens[kind == Kind.SUMMARY].tolist())

    def _responses(self, s: Session, kind: npt.NDArray[Any], tokens: npt.NDArray[np.int64]) -> None:
        """Per response (the blocks one request produced): calls, text and thinking."""
        origin = s.blocks["origin"]
        mine = origin >= 0
        size = s.n_requests + 1

        def per_response(k: Kind, weigh: bool) -> npt.NDArray[np.float64]:
            """Blocks of kind `k` (or their tokens) per producing request."""
            m = mine & (kind == k)
            w = tokens[m].astype(np.float64) if weigh else np.ones(int(m.sum()))
            return np.asarray(np.bincount(origin[m], weights=w, minlength=size), np.float64)

        responded = np.bincount(origin[mine], minlength=size) > 0
        calls = per_response(Kind.TOOL_USE, False)[responded].astype(np.int64)
        texts = per_response(Kind.TEXT, False)[responded]
        text_tokens = per_response(Kind.TEXT, True)[responded].astype(np.int64)
        thinks = per_response(Kind.THINKING, False)[responded]
        think_tokens = per_response(Kind.THINKING, True)[responded].astype(np.int64)
        self.calls.update(min(c, MAX_CALLS) for c in calls.tolist())
        final = calls == 0
        self.text_final.extend(text_tokens[final].tolist())
        self.tool_responses += int((~final).sum())
        self.text_with_tools.extend(text_tokens[~final & (texts > 0)].tolist())
        if (kind == Kind.THINKING).any():
            self.thinking_sessions += 1
            self.thinking_responses += int(responded.sum())
            self.thinking.extend(think_tokens[thinks > 0].tolist())


def _gap_class(gaps: Sequence[int]) -> dict[str, Any]:
    g = np.asarray(gaps, dtype=np.int64)
    return {
        "short": lognormal(g[g < FIVE_MINUTES_MS].tolist()),
        "idle_share": share(int((g >= FIVE_MINUTES_MS).sum()), len(g)),
        "over_1h_share": share(int((g >= ONE_HOUR_MS).sum()), len(g)),
    }


def _tools(sample: Sample) -> dict[str, Any]:
    counts = Counter({tool: len(sizes) for tool, sizes in sample.uses.items()})
    total = sum(counts.values())
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    top, rest = ranked[:TOP_TOOLS], ranked[TOP_TOOLS:]
    rows: list[dict[str, Any]] = []
    for name, members in [*((t, [t]) for t in top), (OTHER_TOOL, rest)]:
        uses = [v for t in members for v in sample.uses[t]]
        results = [v for t in members for v in sample.results[t]]
        errors = [e for t in members for e in sample.errors[t]]
        row: dict[str, Any] = {
            "name": name,
            "share": share(len(uses), total),
            "use": lognormal(uses),
            "result": lognormal(results),
            "error": share(sum(errors), len(errors)),
        }
        if name == OTHER_TOOL:
            row["pooled_tools"] = len(members)
        rows.append(row)
    return {"n": total, "top": rows}


def fit(sample: Sample) -> dict[str, Any]:
    """The data file's content (see METHODS for what each entry is)."""
    model, model_n = sample.models.most_common(1)[0]
    tool_calls = sum(c for k, c in sample.calls.items() if k > 0)
    gaps = [*sample.gaps_turn, *sample.gaps_human]
    thinking_total = sample.thinking_responses
    return {
        "schema": 1,
        "about": (
            "Parameters of traces/synthetic.py, fitted by "
            "`python -m simulator.app.measure.synth_fit` to "
            "the compiled Claude Code main sessions of the corpus; see traces/README.md, "
            "section 'Synthetic traces'. Counts only: no text, no paths."
        ),
        "corpus": {
            "name": CORPUS_NAME,
            "traces": sample.traces,
            "main_sessions": sample.sessions,
            "requests": sample.requests,
        },
        "methods": METHODS,
        "model": {"name": model, **share(model_n, sample.requests)},
        "prefix_tokens": lognormal(sample.prefix),
        "human_turns": share(sample.human_requests, sample.later_requests),
        "human_tokens": lognormal(sample.human_tokens),
        "calls_per_response": {
            "p": [_sig(sample.calls[k] / tool_calls) for k in range(1, MAX_CALLS + 1)],
            "n": tool_calls,
            "no_calls": share(sample.calls[0], tool_calls + sample.calls[0]),
        },
        "text_final_tokens": lognormal(sample.text_final),
        "text_with_tools": share(len(sample.text_with_tools), sample.tool_responses),
        "text_with_tools_tokens": lognormal(sample.text_with_tools),
        "thinking": {
            **share(len(sample.thinking), thinking_total),
            "sessions": sample.thinking_sessions,
        },
        "thinking_tokens": lognormal(sample.thinking),
        "tools": _tools(sample),
        "gaps_ms": {
            "turn": _gap_class(sample.gaps_turn),
            "human": _gap_class(sample.gaps_human),
            "idle_max": int(max(gaps)),
        },
        "summary_tokens": lognormal(sample.summary),
    }


def measure(corpus: Path) -> dict[str, Any]:
    """Load every Claude Code trace under `corpus` and fit the generator's parameters."""
    found = [u for u in units([corpus]) if u.format == "claude-code"]
    sample = Sample()
    for loaded in load_all(found, lenient=True):
        sample.traces += 1
        for s in loaded.trace.sessions:
            if s.kind == "main" and s.n_requests > 0:
                sample.add(s)
    data = fit(sample)
    SynthParams.from_dict(data)  # what is written must be what the generator can read
    return data


def render(data: dict[str, Any]) -> str:
    """The committed text form: sorted keys, one field per line, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """Where two data files differ; numbers within one unit of the last kept digit agree
    (a float summed in another order may round the other way)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(old.keys() | new.keys()):
            if key not in old or key not in new:
                out.append(f"{where}/{key}: only in {'new' if key in new else 'committed'}")
            else:
                out.extend(differences(old[key], new[key], f"{where}/{key}"))
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} items committed, {len(new)} measured"]
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in differences(a, b, f"{where}[{i}]")
        ]
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        tolerance = 10.0 ** (math.floor(math.log10(abs(old))) - DIGITS + 1) if old else 0.0
        if isinstance(old, float) and abs(old - new) <= tolerance * 1.0001:
            return []
    return [] if old == new else [f"{where}: committed {old!r}, measured {new!r}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.app.measure.synth_fit")
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="Claude Code traces to fit"
    )
    parser.add_argument("--out", type=Path, default=PARAMS_PATH, help="data file to write")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if --out differs instead of writing it"
    )
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        print(f"no traces at {args.corpus}", file=sys.stderr)
        return 2
    data = measure(args.corpus)
    if args.check:
        if not args.out.is_file():
            print(f"{args.out.name} is missing")
            return 1
        diff = differences(json.loads(args.out.read_text()), data)
        for line in diff:
            print(line)
        print("up to date" if not diff else f"{args.out.name} differs from the measurement")
        return 0 if not diff else 1
    args.out.write_text(render(data))
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
