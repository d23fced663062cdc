"""The re-fetch loop (simulator/refetch.py) on hand-built sessions with hand-computed usage
and dollars, its calibration (simulator/app/measure/refetch_measure.py) by hand and against the
committed data, and the open loop unchanged when it is off.

Sessions follow tests/support/scripted.py: a 10,000-token prefix, blocks exactly the tokens written,
no recorded usage (5-minute TTL), requests one minute apart, one marker on the last item.
Claude Sonnet 4.5: $3 / M input, $3.75 / M 5-minute cache write, $0.30 / M cache read,
$15 / M output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import ConversationSession
from simulator import policy as registry
from simulator.app import api
from simulator.app.cli import main
from simulator.app.measure import refetch_measure
from simulator.frames import bill_failed
from simulator.loss import replay_with_loss
from simulator.model import CompactionEvent, Flag, Kind, Role
from simulator.policy import Emitter, Policy, SessionContext, SessionPolicy
from simulator.refetch import FITTED, RefetchParams
from simulator.replay import REFETCH_SCHEMA, ReplayOptions, replay
from tests.support import ROOT, SAMPLES, Named, source_folders
from tests.support.scripted import Script, usage

DATA = ROOT / "policies" / "calibration" / "refetch.json"
ALWAYS = RefetchParams(refetch=1.0, skip=1.0, window=50)
NEVER_DRAW = RefetchParams(refetch=0.0, skip=0.0, window=50)


def _file_call(s: Script, path: str, result: int, *, read: bool, use: int = 50) -> tuple[int, int]:
    """A Read (or Edit) of `path`: the response to the previous request and its result."""
    tool, flag = ("Read", Flag.PATH_READ) if read else ("Edit", Flag.PATH_WRITE)
    uid = f"u{s.n}"
    u = s._add(
        Kind.TOOL_USE,
        Role.ASSISTANT,
        use,
        origin=s.k - 1,
        tool=tool,
        use_id=uid,
        flags=flag,
        path=path,
    )
    r = s._add(
        Kind.TOOL_RESULT, Role.USER, result, tool=tool, result_for=uid, flags=flag, path=path
    )
    return u, r


class _Drop(Policy):
    """Sends the whole history except the blocks it is told to remove before request k."""

    name = "test-drop"

    def __init__(self, drops: dict[int, set[int]]) -> None:
        super().__init__()
        self.drops = drops

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return _DropSession(ctx, self.drops)


class _DropSession(ConversationSession):
    def __init__(self, ctx: SessionContext, drops: dict[int, set[int]]) -> None:
        super().__init__(ctx, {"cache.ttl": "5m"})
        self.drops = drops

    def transform(self, k: int, out: Emitter) -> None:
        if k in self.drops:
            self.conv.remove_blocks(self.drops[k])


def _edit_after_drop() -> tuple[Any, dict[int, set[int]]]:
    """request 0: the human's 100; response 0 reads f (50 + 2,000); response 1 runs a
    command (50 + 300); response 2 edits f (50 + 100). The policy drops the read (call and
    result) before request 2, while the recording still holds it."""
    s = Script()
    s.user(100)
    s.request()
    read = _file_call(s, "f", 2_000, read=True)
    s.request()
    s.tool(300, use=50)
    s.request()
    _file_call(s, "f", 100, read=False)
    s.request()
    return s.trace(), {2: set(read)}


def _rows(trace: Any, pol: Policy, params: RefetchParams | None, *, loss: bool = False) -> Any:
    options = ReplayOptions(refetch=params is not None, refetch_params=params)
    if loss:
        return replay_with_loss([("t", trace)], pol, options)
    return replay([("t", trace)], pol, options)


def _by_kind(frame: pl.DataFrame) -> list[tuple[int, str, tuple[int, int, int, int, int]]]:
    ordered = frame.sort(["request", "call"])
    return [(r["request"], r["kind"], usage(r)) for r in ordered.iter_rows(named=True)]


def test_a_dropped_file_the_agent_edits_is_fetched_back_in_a_priced_round() -> None:
    trace, drops = _edit_after_drop()
    open_loop = _rows(trace, _Drop(drops), None)
    loop = _rows(trace, _Drop(drops), ALWAYS)
    # Open loop: request 2 sends 10,000 + 100 + 350 and request 3 adds the edit's 150.
    assert _by_kind(open_loop)[2:] == [
        (2, "request", (10_450, 0, 10_100, 350, 50)),
        (3, "request", (10_600, 0, 10_450, 150, 0)),
    ]
    # Re-fetch: after request 2, the read again (call 50, result 2,000 as last seen) is one
    # inserted round reading request 2's 10,450 and writing 2,050, outputting the read call;
    # it joins the view before the edit, so request 3 reads 12,500 and writes the edit's 150.
    assert _by_kind(loop)[2:] == [
        (2, "request", (10_450, 0, 10_100, 350, 50)),
        (2, "refetch", (12_500, 0, 10_450, 2_050, 50)),
        (3, "request", (12_650, 0, 12_500, 150, 0)),
    ]
    inserted = loop.filter(pl.col("kind") == "refetch").row(0, named=True)
    assert (inserted["refetch_calls"], inserted["refetch_tokens"]) == (1, 2_000)
    dollars = 10_450 * 0.30e-6 + 2_050 * 3.75e-6 + 50 * 15e-6
    assert inserted["refetch_cost"] == pytest.approx(dollars)
    assert inserted["cost_total"] == pytest.approx(dollars)
    assert loop["refetch_cost"].sum() == pytest.approx(dollars)
    extra = 2_050 * 0.30e-6  # request 3 reads the fetched 2,050 from the cache
    assert loop["cost_total"].sum() - open_loop["cost_total"].sum() == pytest.approx(
        dollars + extra
    )


def test_the_fetched_file_is_not_stale_and_the_open_loop_counts_it() -> None:
    trace, drops = _edit_after_drop()
    open_loop = _rows(trace, _Drop(drops), None, loss=True)
    loop = _rows(trace, _Drop(drops), ALWAYS, loss=True)
    stale = lambda f: f.filter(pl.col("kind") == "request").sort("request")["stale_file_refs"]  # noqa: E731
    assert stale(open_loop).to_list() == [0, 0, 1, 0]
    assert stale(loop).to_list() == [0, 0, 0, 0]


def test_a_zero_chance_or_a_held_file_changes_nothing() -> None:
    trace, drops = _edit_after_drop()
    base = _rows(trace, _Drop(drops), None)
    never = _rows(trace, _Drop(drops), NEVER_DRAW)
    held = _rows(trace, _Drop({}), ALWAYS)
    assert never.select(base.columns).equals(base)
    assert never["refetch_calls"].sum() == 0
    assert held.select(base.columns).equals(_rows(trace, _Drop({}), None))
    assert held["refetch_calls"].sum() == 0


def _reread_after_compaction() -> Any:
    """request 0: the human's 100; response 0 reads f (50 + 2,000); the recording compacts
    before request 2 (dropping those three blocks: a 500-token summary enters, an
    artifact); response 2 reads f again (50 + 2,000); response 3 edits it (50 + 100)."""
    s = Script()
    first = [s.user(100)]
    s.request()
    first += _file_call(s, "f", 2_000, read=True)
    s.request()
    s.say(20)
    s.request()
    s.k = 2  # the summary enters at request 2 as the recording's artifact
    summary = s._add(Kind.SUMMARY, Role.USER, 500, flags=Flag.ARTIFACT)
    for b in [*first, summary - 1]:
        s.b.compact_away(b, 2)
    s.b.add_event(CompactionEvent(2, "auto", -1, summary, s.ts))
    s.k = 3
    _file_call(s, "f", 2_000, read=True)
    s.request()
    _file_call(s, "f", 100, read=False)
    s.request()
    return s.trace()


def test_a_reread_the_recordings_compaction_caused_is_left_out_where_the_file_is_held() -> None:
    trace = _reread_after_compaction()
    none = registry.build("none")
    open_loop = _rows(trace, none, None)
    loop = _rows(trace, none, ALWAYS)
    req = lambda f: f.filter(pl.col("kind") == "request").sort("request")  # noqa: E731
    o, c = req(open_loop), req(loop)
    # Request 2's response is the re-read: its call's 50 tokens leave the output.
    assert o["output"].to_list()[2] == 50
    assert c["output"].to_list()[2] == 0
    assert c["skipped_rereads"].to_list() == [0, 0, 1, 0, 0]
    assert c["skipped_tokens"].to_list() == [0, 0, 2_050, 0, 0]
    # Request 3 no longer sends the re-read (50 + 2,000): 10,000 + 100 + 2,050 + 20 + 50
    # + 100 is request 4's view, against 2,050 more in the open loop.
    assert o["context_tokens"].to_list()[3:] == [14_220, 14_370]
    assert c["context_tokens"].to_list()[3:] == [12_170, 12_320]
    assert loop["refetch_calls"].sum() == 0


def test_as_recorded_replays_as_in_the_open_loop() -> None:
    """The recording holds exactly what as-recorded sends: no difference, no change."""
    for trace in (_reread_after_compaction(), _edit_after_drop()[0]):
        pol = registry.build("as-recorded")
        base = _rows(trace, pol, None)
        loop = _rows(trace, pol, ALWAYS)
        assert loop.select(base.columns).equals(base)
        assert loop.select(list(REFETCH_SCHEMA)).sum().row(0) == (0, 0, 0, 0)


def test_the_loop_adds_its_columns_only_when_on() -> None:
    trace, drops = _edit_after_drop()
    assert not set(REFETCH_SCHEMA) & set(_rows(trace, _Drop(drops), None).columns)
    assert {*REFETCH_SCHEMA, "refetch_cost"} <= set(_rows(trace, _Drop(drops), ALWAYS).columns)


def test_an_inserted_round_beyond_the_window_is_a_failed_call() -> None:
    """Sonnet 4.5's window is 200,000: a 190,000-token read fetched back into a 10,450-token
    view makes a 200,500-token round, which overflows (and is billed $0, METRICS.md)."""
    s = Script()
    s.user(100)
    s.request()
    read = _file_call(s, "f", 190_000, read=True)
    s.request()
    s.tool(300, use=50)
    s.request()
    _file_call(s, "f", 100, read=False)
    s.request()
    frame = bill_failed(_rows(s.trace(), _Drop({2: set(read)}), ALWAYS))
    inserted = frame.filter(pl.col("kind") == "refetch").row(0, named=True)
    assert (inserted["context_tokens"], inserted["overflow"]) == (200_500, True)
    assert (inserted["cost_total"], inserted["refetch_cost"]) == (0, 0)


def test_the_cli_and_the_api_record_the_setting(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", str(SAMPLES), "--policy", "as-recorded", "--policy", "masking"]
    result = CliRunner().invoke(main, [*argv, "--refetch", "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["refetch"] is True
    written = pl.read_parquet(out / "requests.parquet")
    assert {*REFETCH_SCHEMA, "refetch_cost"} <= set(written.columns)
    traces = api.load([SAMPLES])
    on, off = api.replay(traces, ["as-recorded"], refetch=True), api.replay(traces, ["as-recorded"])
    assert (on.manifest["refetch"], off.manifest["refetch"]) == (True, False)
    assert on.requests.select(off.requests.columns).equals(off.requests)
    plain = tmp_path / "plain"
    result = CliRunner().invoke(main, [*argv, "--out", str(plain), "--no-report"])
    assert result.exit_code == 0, result.output
    assert json.loads((plain / "manifest.json").read_text())["refetch"] is False
    assert not set(REFETCH_SCHEMA) & set(pl.read_parquet(plain / "requests.parquet").columns)


@st.composite
def _sessions(draw: st.DrawFn) -> tuple[Any, dict[int, set[int]]]:
    """Rounds that read, edit or run on three files, and blocks a policy drops at random."""
    s = Script()
    s.user(100)
    s.request()
    drops: dict[int, set[int]] = {}
    for _ in range(draw(st.integers(2, 12))):
        action = draw(st.sampled_from(["read", "edit", "run"]))
        size = draw(st.integers(1, 3_000))
        if action == "run":
            blocks = s.tool(size, use=40)
        else:
            blocks = _file_call(s, draw(st.sampled_from("abc")), size, read=action == "read")
        s.request()
        if draw(st.booleans()):
            drops.setdefault(draw(st.integers(s.k, s.k + 3)), set()).update(blocks)
    return s.trace(), drops


@settings(max_examples=40, deadline=None)
@given(_sessions())
def test_each_inserted_round_is_its_request_plus_the_reads_and_chance_zero_is_open_loop(
    case: tuple[Any, dict[int, set[int]]],
) -> None:
    trace, drops = case
    base = _rows(trace, _Drop(drops), None)
    assert _rows(trace, _Drop(drops), NEVER_DRAW).select(base.columns).equals(base)
    loop = _rows(trace, _Drop(drops), ALWAYS).sort(["request", "call"])
    previous: dict[str, Any] | None = None
    for r in loop.iter_rows(named=True):
        if r["kind"] == "refetch":
            assert previous is not None and previous["kind"] == "request"
            assert previous["request"] == r["request"]
            grown = r["context_tokens"] - previous["context_tokens"]
            assert grown == r["refetch_tokens"] + r["output"] > 0
            # The request's marker on its last item wrote its whole view a moment before.
            assert r["cache_read"] == previous["context_tokens"]
        previous = r
    # The loop's rounds are exactly the rows of kind refetch, each counted once.
    assert loop["refetch_calls"].sum() == loop.filter(pl.col("kind") == "refetch").height


# -- the calibration --------------------------------------------------------------------


def test_point_counts_by_hand() -> None:
    """At the compaction (request 2) the one dropped file is read again (at response 3)
    and then edited (at 4) after that read: 1 file, 1 re-read of 2,000, 1 use read first."""
    trace = _reread_after_compaction()
    sf = refetch_measure.session_files(trace.sessions[0])
    got = refetch_measure.point_counts(sf, 2, compaction=True, window=50)
    assert (got.files, got.reread, got.reread_tokens, got.used, got.used_reread) == (
        1,
        1,
        2_000,
        1,
        1,
    )
    # A control point needs the read held through the window: here it was dropped.
    assert refetch_measure.point_counts(sf, 2, compaction=False, window=50).files == 0


def test_fit_by_hand() -> None:
    comp = refetch_measure.Counts(points=1, files=10, reread=4, used=5, used_reread=3)
    ctrl = refetch_measure.Counts(points=2, files=20, reread=2, used=10, used_reread=2)
    # refetch: (0.6 - 0.2) / (1 - 0.2) = 0.5; skip: (0.4 - 0.1) / 0.4 = 0.75.
    assert refetch_measure.fit(comp, ctrl) == {"refetch": 0.5, "skip": 0.75}


def test_the_fitted_constants_are_the_committed_fit() -> None:
    data = json.loads(DATA.read_text())
    for fmt, params in FITTED.items():
        f = data["formats"][fmt]["fit"]
        assert (params.refetch, params.skip, params.window) == (
            f["refetch"] or 0.0,
            f["skip"] or 0.0,
            f["window"],
        )


@pytest.mark.shared
def test_measurement_of_the_shared_traces_equals_the_committed_data(
    shared: Path, shared_corpus: Callable[[str], Named]
) -> None:
    """Regenerate from ../shared/traces (compiled once per test session, shared with the
    other tests that read it): fix drift by rerunning
    `python -m simulator.app.measure.refetch_measure` and updating simulator/refetch.py FITTED."""
    folders = [f for fmt in refetch_measure.FORMATS for f in source_folders(shared, fmt)]
    traces = [(f.split("/", 1)[1], t) for f in folders for _, t in shared_corpus(f)]
    data = refetch_measure.measure(refetch_measure.by_format(traces))
    assert refetch_measure.render(data) == DATA.read_text()
    assert refetch_measure.table(data) == DATA.with_suffix(".md").read_text()
