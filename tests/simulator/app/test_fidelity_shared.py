"""The cache model against every real Claude Code session's recorded usage.

Acceptance of the engine issue, on the folders of ../shared/traces/claude-code it was
written for (vsla, m-claude, promptgrimoire, denubis): replayed `as-recorded`, the median
per-session cost error is at most 1%, the whole corpus's cost is within 1%, and at least
98% of requests match (simulated cache read and cache write each within 1% of the
request's context size).

Issue 12's bars (at least 98% matched, median session error at most 0.5%, p90 at most 2%,
corpus within 1%) are asserted per source folder, each bar where it holds (nothing is
fitted to these folders: the compiled context follows causes, traces/builder.py; the one
choice of the cache model, when an entry's TTL restarts, is the same leave-one-source-out,
simulator/prompt_cache.py `ANTHROPIC_REFRESH_AT_END`), with the mechanism each folder
needs switched off to show it is what makes it hold.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from simulator import policy, prefix, prompt_cache
from simulator.app.fidelity import compare, summarize
from simulator.model import Trace
from simulator.replay import replay
from tests.support import Named
from traces import builder
from traces.claude_code import read
from traces.errors import Problems
from traces.load import units

OLD_FOLDERS = ("vsla", "m-claude", "promptgrimoire", "denubis")
#: Folders that meet all of issue 12's bars (git-sync's p90 is 2.25% when a first request
#: whose recording cached no more than the prefix is marked at the prefix's end instead
#: of its nearest prefix mark: policies/as_recorded.py `_message_mark`).
HOLDING = (
    "denubis",
    "entirecontext",
    "flutter-docker",
    "git-sync",
    "m-claude",
    "nomos",
    "promptgrimoire",
    "starcar",
    "technocore",
    "wakil",
)
#: The bars the other folders meet, and (comment) the one they miss, by what mechanism.
PARTIAL = {
    # corpus +1.33%: two reads 301-303 s after a response's end (no grace is modelled).
    "vsla": ("matched", "median", "p90"),
}


def _folder(shared: Path, path: Path) -> str:
    return path.relative_to(shared / "claude-code").parts[0]


@pytest.fixture
def folders(shared_corpus: Callable[[str], Named]) -> Callable[[tuple[str, ...]], Named]:
    """The traces of these Claude Code source folders, in the given order, compiled once per
    test session (`shared_corpus`, which the other modules read too)."""

    def load(names: tuple[str, ...]) -> Named:
        return [t for name in names for t in shared_corpus(f"claude-code/{name}")]

    return load


def _overall(traces: list[tuple[str, Trace]], **params: object) -> dict[str, Any]:
    frame = replay(traces, policy.build("as-recorded", dict(params)))
    sessions, overall = summarize(compare(frame, traces))
    shares = sessions["err_cost_share"].drop_nulls().abs().to_numpy()
    overall["p90_abs_session_cost_error"] = float(np.quantile(shares, 0.9))
    return overall


def test_as_recorded_reproduces_recorded_cost(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    overall = _overall(folders(OLD_FOLDERS))
    assert overall["requests"] == 3248  # 3,266 before the 18 calls a resumed file repeats
    assert overall["median_abs_session_cost_error"] <= 0.01
    assert abs(overall["corpus_cost_error"]) <= 0.01
    assert overall["matched_share"] >= 0.98


def test_unlogged_prefix_resets_are_what_closes_the_gap(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """Without the inferred prefix resets the model is measurably worse (so the inference
    is doing real work, and a regression in it shows here)."""
    traces = folders(OLD_FOLDERS)
    without = _overall(traces, prefix_resets=False)
    assert without["matched_share"] < 0.98  # issue 12's bar, missed
    assert _overall(traces)["matched_share"] - without["matched_share"] > 0.015
    assert abs(without["corpus_cost_error"]) > 0.05


def _bars(overall: dict[str, Any]) -> dict[str, bool]:
    """Issue 12's four bars, each met or not."""
    return {
        "matched": overall["matched_share"] >= 0.98,
        "median": overall["median_abs_session_cost_error"] <= 0.005,
        "p90": overall["p90_abs_session_cost_error"] <= 0.02,
        "corpus": abs(overall["corpus_cost_error"]) <= 0.01,
    }


def _meets_issue_12(overall: dict[str, Any]) -> bool:
    return all(_bars(overall).values())


def test_folders_that_meet_issue_12s_bars(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    for folder in HOLDING:
        overall = _overall(folders((folder,)))
        assert _meets_issue_12(overall), (folder, overall)


def test_bars_each_other_folder_meets(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    for folder, bars in PARTIAL.items():
        met = _bars(_overall(folders((folder,))))
        assert all(met[bar] for bar in bars), (folder, met)


def test_send_time_refresh_is_what_makes_starcar_hold(
    shared: Path, monkeypatch: pytest.MonkeyPatch, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """starcar 548526c8 missed its cache 300.04 s after the previous request was sent
    (278.9 s after its response ended) and again 308.2 s after (285.6 s): with entries
    refreshed until the response's end, as for the 2025 models, it reads them instead, and
    the session is 14% short."""
    traces = folders(("starcar",))
    by_send = _overall(traces)
    assert by_send["p90_abs_session_cost_error"] <= 0.02
    assert abs(by_send["corpus_cost_error"]) <= 0.01
    monkeypatch.setattr(prompt_cache, "anthropic_refresh_at_send", lambda model: False)
    at_end = _overall(traces)
    assert at_end["p90_abs_session_cost_error"] > 0.05
    assert at_end["corpus_cost_error"] < -0.015


def test_end_refresh_is_what_keeps_m_claude_exact(
    shared: Path, monkeypatch: pytest.MonkeyPatch, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """m-claude (Opus and Sonnet 4.5, 2026-01) read its cache 306.9 s after a send that took
    12.5 s, and right after a 313 s response: refreshed at the send, it misses both."""
    traces = folders(("m-claude",))
    monkeypatch.setattr(prompt_cache, "anthropic_refresh_at_send", lambda model: True)
    at_send = _overall(traces)
    assert not _meets_issue_12(at_send)
    assert at_send["corpus_cost_error"] > 0.01


def test_thinking_mode_returns_are_what_make_promptgrimoire_hold(
    shared: Path, monkeypatch: pytest.MonkeyPatch, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """promptgrimoire (2.1.29) switches thinking off and back on twice within the TTL and
    reads the last prompt of the thinking mode each time (requests 150 and 229): without
    the key per mode it reads the other mode's newer prompt, and its session is -0.58%."""
    traces = folders(("promptgrimoire",))
    assert _meets_issue_12(_overall(traces))
    monkeypatch.setattr(prefix, "_mode_returns", lambda *args: {})
    without = _overall(traces)
    assert without["median_abs_session_cost_error"] > 0.005


def test_server_tool_passes_are_what_makes_technocore_hold(shared: Path) -> None:
    """technocore's session calls the advisor server tool twice: read as one request per
    call (its usage the sum of two passes: a context twice the size, then an unlogged
    drop) it misses the bars (+61% before the compiled context followed the recording,
    +3.8% with the unlogged edit alone)."""
    found = [
        u
        for u in units([shared / "claude-code"])
        if _folder(shared, u.files[0].path) == "technocore"
    ]
    original = builder.SessionBuilder._split_iterations
    try:
        builder.SessionBuilder._split_iterations = lambda self: None  # type: ignore[method-assign]
        merged = [
            (u.label, read(u, [f.read() for f in u.files], Problems(lenient=True))) for u in found
        ]
    finally:
        builder.SessionBuilder._split_iterations = original  # type: ignore[method-assign]
    overall = _overall(merged)
    assert not _meets_issue_12(overall)
    assert overall["corpus_cost_error"] > 0.02


def test_model_prefixes_are_what_keeps_a_model_switch_exact(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """Every request where the model changes to one not seen before is matched, because it
    gets that model's own prefix (with one prefix per session, starcar's switch from Fable
    5 to Opus 4.8 is a 10k drop the old builder froze)."""
    traces = folders(
        tuple(sorted({_folder(shared, u.files[0].path) for u in units([shared / "claude-code"])})),
    )
    frame = replay(traces, policy.build("as-recorded", {}))
    per = compare(frame, traces)
    switches = []
    for name, t in traces:
        for i, s in enumerate(t.sessions):
            m = s.requests["model"]
            prefix = s.prefix_at()
            for k in range(1, s.n_requests):
                if m[k] not in m[:k] and prefix[k] != prefix[k - 1]:
                    switches.append((name, i, k))
    assert switches
    keys = pl.DataFrame(
        switches,
        schema={"trace": pl.String, "session_index": pl.Int32, "request": pl.Int32},
        orient="row",
    )
    rows = per.join(keys, on=["trace", "session_index", "request"])
    assert rows.height == len(switches)
    assert rows["sim_context"].to_list() == rows["recorded_context"].to_list()


def test_warm_from_elsewhere_is_what_makes_starcar_hold(
    shared: Path, monkeypatch: pytest.MonkeyPatch, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """starcar 548526c8 found nothing warm at its start, and after its own entries expired
    (5.0 minutes on a 5-minute TTL) read 30,582 of its 79,600-token prefix, warm from other
    sessions (simulator/prefix.py `Prefix.warm_more`): without seeding that, the session
    is +1.28% and starcar's median 0.56%."""
    traces = folders(("starcar",))
    assert _meets_issue_12(_overall(traces))
    original = prefix.PrefixState.reset

    def without_more(self: prefix.PrefixState, request: int) -> bool:
        changed = original(self, request)
        self.warm_now = []
        return changed

    monkeypatch.setattr(prefix.PrefixState, "reset", without_more)
    assert _overall(traces)["median_abs_session_cost_error"] > 0.005


def test_every_read_of_more_of_the_prefix_after_a_gap_is_matched(
    shared: Path, folders: Callable[[tuple[str, ...]], Named]
) -> None:
    """Every request of ../shared/traces/claude-code that, after an idle gap, read more of
    the prefix than its session found warm at the start, and no more than the prefix, is
    simulated with exactly its recorded read."""
    traces = folders(
        tuple(sorted({_folder(shared, u.files[0].path) for u in units([shared / "claude-code"])})),
    )
    wanted = [
        (name, i, k)
        for name, t in traces
        for i, s in enumerate(t.sessions)
        for k in prefix.infer(s, recorded=True).warm_more
    ]
    assert len(wanted) >= 20
    keys = pl.DataFrame(
        wanted,
        schema={"trace": pl.String, "session_index": pl.Int32, "request": pl.Int32},
        orient="row",
    )
    rows = compare(replay(traces, policy.build("as-recorded", {})), traces).join(
        keys, on=["trace", "session_index", "request"]
    )
    assert rows.height == len(wanted)
    assert rows["sim_cache_read"].to_list() == rows["rec_cache_read"].to_list()
