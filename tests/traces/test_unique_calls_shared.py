"""`traces stats` counts every recorded API call of ../shared/traces once (issue 12).

The expectation is an independent pass over the raw JSON, written here without the
readers: a Claude Code call is one `message.id` (or `requestId` when the message has no id)
over every file of a folder, with its usage from the file that wrote it first (the
largest context among the copies: a resumed file's copy of a call that was still
streaming logs zeros); `<synthetic>` and API-error lines are no calls. A Codex call is a
`token_count` event whose `total_token_usage` differs from the previous one in its
rollout, with `last_token_usage` as its usage (input there includes the cached tokens).
Requests are counted too: one per call, or one per inference pass of a Claude Code call
that logs its passes (`usage.iterations`), plus the recorded compaction calls.
Files that are neither are not counted (the readers pass them over).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reports.trace_stats import session_stats
from simulator.model import Trace
from simulator.pricing import PriceBook

Totals = dict[str, int]
KEYS = ("input", "cache_read", "cache_write")


def _objects(path: Path) -> Iterator[dict[str, Any]]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    for raw in data.split(b"\n"):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def _n(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _claude_calls(files: list[Path]) -> dict[str, tuple[int, int, int, int]]:
    """(input, cache read, cache write, passes) per call id."""
    calls: dict[str, tuple[int, int, int, int]] = {}
    for path in files:
        first: dict[str, tuple[int, int, int, int]] = {}
        for obj in _objects(path):
            msg = obj.get("message")
            if obj.get("type") != "assistant" or not isinstance(msg, dict):
                continue
            if msg.get("model") == "<synthetic>" or obj.get("isApiErrorMessage"):
                continue
            mid = msg.get("id") or obj.get("requestId")
            usage = msg.get("usage")
            if not isinstance(mid, str) or not isinstance(usage, dict) or mid in first:
                continue
            first[mid] = (
                _n(usage.get("input_tokens")),
                _n(usage.get("cache_read_input_tokens")),
                _n(usage.get("cache_creation_input_tokens")),
                _passes(usage),
            )
        for mid, usage in first.items():
            if mid not in calls or sum(usage[:3]) > sum(calls[mid][:3]):
                calls[mid] = usage
    return calls


def _passes(usage: dict[str, Any]) -> int:
    """Inference passes of one call: a call with a server tool (2.1.2xx `usage.iterations`,
    entries of type "message" that sum to the call's figures) is one request per pass."""
    items = usage.get("iterations")
    if not isinstance(items, list):
        return 1
    passes = [x for x in items if isinstance(x, dict) and x.get("type") == "message"]
    names = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    sums = all(sum(_n(x.get(k)) for x in passes) == _n(usage.get(k)) for k in names)
    return len(passes) if len(passes) >= 2 and sums else 1


def _codex_calls(files: list[Path]) -> dict[tuple[Any, ...], tuple[int, int, int, int]]:
    calls: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}
    for path in files:
        previous = None
        for obj in _objects(path):
            payload = obj.get("payload")
            if obj.get("type") != "event_msg" or not isinstance(payload, dict):
                continue
            info = payload.get("info")
            if payload.get("type") != "token_count" or not isinstance(info, dict):
                continue
            total, last = info.get("total_token_usage"), info.get("last_token_usage")
            if not isinstance(total, dict) or not isinstance(last, dict):
                continue
            key = tuple(sorted((k, _n(v)) for k, v in total.items()))
            if key == previous:
                continue
            previous = key
            cached = _n(last.get("cached_input_tokens"))
            calls.setdefault(key, (_n(last.get("input_tokens")) - cached, cached, 0, 1))
    return calls


def _format(path: Path) -> str:
    for obj in _objects(path):
        if "payload" in obj and isinstance(obj.get("type"), str):
            return "codex"
        if "parentUuid" in obj or "leafUuid" in obj:
            return "claude-code"
    return ""


def raw_totals(folder: Path) -> dict[str, Totals]:
    """The independent count, per format, of every call under `folder`."""
    files: dict[str, list[Path]] = {"claude-code": [], "codex": []}
    for path in sorted(folder.rglob("*")):
        name = path.name.removesuffix(".gz")
        if path.is_file() and name.endswith(".jsonl"):
            fmt = _format(path)
            if fmt in files:
                files[fmt].append(path)
    out: dict[str, Totals] = {}
    counts: dict[str, dict[Any, tuple[int, int, int, int]]] = {
        "claude-code": dict(_claude_calls(files["claude-code"])),
        "codex": dict(_codex_calls(files["codex"])),
    }
    for fmt, calls in counts.items():
        out[fmt] = {k: sum(c[i] for c in calls.values()) for i, k in enumerate(KEYS)}
        out[fmt]["calls"] = sum(c[3] for c in calls.values())
    return out


def stats_totals(named: list[tuple[str, Trace]]) -> dict[str, Totals]:
    """What `traces stats` sums (reports/trace_stats.py), per format."""
    df = session_stats(named, PriceBook())
    out: dict[str, Totals] = {}
    for fmt in ("claude-code", "codex"):
        rows = df.filter(df["format"] == fmt)
        out[fmt] = {
            "input": int(rows["input"].sum()),
            "cache_read": int(rows["cache_read"].sum()),
            "cache_write": int(rows["cache_write_5m"].sum() + rows["cache_write_1h"].sum()),
            "calls": int(rows["requests_with_usage"].sum() + rows["compaction_calls"].sum()),
        }
    return out


def folders(shared: Path) -> list[str]:
    return [
        f"{fmt}/{d.name}"
        for fmt in ("claude-code", "codex", "fixtures")
        for d in sorted((shared / fmt).iterdir())
        if d.is_dir()
    ]


def test_stats_count_every_claude_code_call_once(
    shared: Path, shared_corpus: Callable[[str], list[tuple[str, Trace]]]
) -> None:
    """Per source folder of ../shared/traces (claude-code and the fixtures): input, cache
    read and cache write of `traces stats` equal the unique-call count of the raw files."""
    for folder in [f for f in folders(shared) if not f.startswith("codex/")]:
        got = stats_totals(shared_corpus(folder))["claude-code"]
        want = raw_totals(shared / folder)["claude-code"]
        assert got == want, folder


def test_stats_count_every_codex_call_once(
    shared: Path, shared_corpus: Callable[[str], list[tuple[str, Trace]]]
) -> None:
    """The same over the Codex rollouts (and the Codex fixtures)."""
    for folder in [f for f in folders(shared) if not f.startswith("claude-code/")]:
        got = stats_totals(shared_corpus(folder))["codex"]
        want = raw_totals(shared / folder)["codex"]
        assert {k: got[k] for k in KEYS} == {k: want[k] for k in KEYS}, folder
