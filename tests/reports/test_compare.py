"""`ctxsim compare`: the markdown table, the limits and the exit codes (0 hold, 1 crossed,
2 unusable input).

The runs replay tests/support/report_helpers.py's two traces: the baseline under as-recorded, the
candidate under the toy policy, made with the `ctxsim_replay` fixture
(simulator/app/pytest_plugin.py) as a project's own tests would. Hand-computed dollars (see
tests/simulator/test_metrics.py for the
rows): baseline 0.02174625 (trace a) + 0.01026 (trace b) = $0.03200625; candidate
0.04761375 + 0.0094875 = $0.05710125, +$0.025095 (+78.4%). Overflows 0 -> 1, compactions
0 -> 2, breaker trips 0 -> 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result

from reports.compare import METRICS, Limit, parse_limit
from simulator import policy as registry
from simulator.app.cli import main
from simulator.app.pytest_plugin import Replay
from simulator.model import Flag, Kind, Role, Trace
from tests.support.report_helpers import MINUTE, T0, Toy, trace_a, trace_b
from traces.builder import Hasher, SessionBuilder

TRACES = [("a", trace_a()), ("b", trace_b())]
HEADER = "| policy | metric | baseline | candidate | change | limit | status |"


@pytest.fixture(autouse=True)
def _toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, Toy.name, Toy)


@pytest.fixture
def runs(tmp_path: Path, ctxsim_replay: Callable[..., Replay]) -> Iterator[tuple[Path, Path]]:
    base = ctxsim_replay(TRACES, policy="as-recorded").write(tmp_path / "base")
    cand = ctxsim_replay(TRACES, policy="toy").write(tmp_path / "cand")
    yield base, cand


def compare(*args: Any, markdown: bool = True) -> Result:
    """`ctxsim compare`, printing markdown (the CI job summary) unless `markdown` is off."""
    argv = ["compare", *(str(a) for a in args), *(["--markdown"] if markdown else [])]
    return CliRunner().invoke(main, argv)


def _row(output: str, metric: str) -> str:
    rows = [line for line in output.splitlines() if f"| {metric} |" in line]
    assert rows, (metric, output)
    return rows[0]


def test_the_fixture_gives_what_run_writes(runs: tuple[Path, Path]) -> None:
    base, _ = runs
    assert {p.name for p in base.iterdir()} == {
        "requests.parquet",
        "sessions.parquet",
        "edits.parquet",
        "manifest.json",
    }
    assert pl.read_parquet(base / "requests.parquet")["stale_file_refs"].sum() == 0


def test_a_run_against_itself_holds(runs: tuple[Path, Path]) -> None:
    base, _ = runs
    result = compare(base, base, "--max-cost-increase", "0%", "--max-overflow-increase", "0")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "## ctxsim compare"
    assert HEADER in lines
    assert _row(result.output, "cost") == (
        "| **as-recorded** | cost | $0.0320 | $0.0320 | +$0.0000 (+0.0%) | increase ≤ 0% | ✅ ok |"
    )
    assert _row(result.output, "cache hit ratio").endswith("| +0.0 pp |  |  |")
    assert lines[-1] == "**All 2 limit check(s) hold.**"
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 2 + len(METRICS)  # header, rule, one row per figure


def test_a_crossed_limit_exits_1_and_is_named(runs: tuple[Path, Path]) -> None:
    base, cand = runs
    result = compare(base, cand, "--max-cost-increase", "100%", "--max-overflow-increase", "0")
    assert result.exit_code == 1, result.output
    out = result.output
    assert "Baseline: `as-recorded`" in out and "Candidate: `toy`" in out
    # the toy's overflowing call is a failed call, billed $0 (reports/METRICS.md)
    assert _row(out, "cost") == (
        "| **as-recorded → toy** | cost | $0.0320 | $0.0525 | +$0.0205 (+64.1%) "
        "| increase ≤ 100% | ✅ ok |"
    )
    assert _row(out, "overflows") == "|  | overflows | 0 | 1 ! | +1 | increase ≤ 0 | ❌ crossed |"
    assert "! overflowed: candidate as-recorded → toy (1) request(s) larger than" in out
    assert _row(out, "compactions") == "|  | compactions | 0 | 2 | +2 |  |  |"
    assert _row(out, "breaker trips") == "|  | breaker trips | 0 | 1 | +1 |  |  |"
    assert "**1 limit(s) crossed:**" in out
    assert "- as-recorded → toy: overflows +1 (allowed: increase ≤ 0)" in out


def test_relative_limits_from_zero_and_demanded_improvements(runs: tuple[Path, Path]) -> None:
    base, cand = runs
    # from a baseline of 0 any worsening crosses a relative limit
    assert compare(base, cand, "--max-overflow-increase", "50%").exit_code == 1
    # a negative limit demands an improvement: the same run does not improve
    assert compare(base, base, "--max-cost-increase", "-1%").exit_code == 1
    # the candidate loses the human's words: kept share falls, so a decrease limit crosses
    result = compare(base, cand, "--max-human-kept-decrease", "1pp")
    assert result.exit_code == 1, result.output
    assert "human words kept" in _row(result.output, "human words kept")
    assert compare(cand, base, "--max-human-kept-decrease", "0pp").exit_code == 0


def test_several_pairs_and_overall(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Specs pair by name (a changed parameter hash is shown); overall is both together."""
    base, _ = runs
    two_base = tmp_path / "two-base"
    two_cand = tmp_path / "two-cand"
    _merge([base, _run(tmp_path / "t1", "toy")], two_base)
    _merge([base, _run(tmp_path / "t2", "toy", window=4_000)], two_cand)
    result = compare(two_base, two_cand, "--max-overflow-increase", "0")
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith("| ")]
    scopes = [line.split("|")[1].strip() for line in table]
    named = [s for s in scopes if s.startswith("**")]
    toy_hash = Toy().spec().param_hash[:6]
    other = registry.build("toy", {"window": 4_000}).spec().param_hash[:6]
    assert named == ["**as-recorded**", f"**toy ({toy_hash} → {other})**", "**overall**"]
    assert "|  | overflows | 1 ! | 0 | -1 (-100.0%) | increase ≤ 0 | ✅ ok |" in result.output


def _run(out: Path, policy: str, **params: Any) -> Path:
    from simulator.app.pytest_plugin import replay_run

    return replay_run(TRACES, policy, params).write(out)


def _merge(dirs: list[Path], out: Path) -> None:
    """One run directory holding the specs of several (as `ctxsim run --policy ...` would)."""
    import json

    out.mkdir()
    frames = [pl.read_parquet(d / "requests.parquet") for d in dirs]
    pl.concat(frames).write_parquet(out / "requests.parquet")
    sessions = [pl.read_parquet(d / "sessions.parquet") for d in dirs]
    pl.concat(sessions).write_parquet(out / "sessions.parquet")
    manifests = [json.loads((d / "manifest.json").read_text()) for d in dirs]
    merged = manifests[0] | {"policies": [p for m in manifests for p in m["policies"]]}
    (out / "manifest.json").write_text(json.dumps(merged))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-cost-increase", "2x"], "--max-cost-increase: '2x': expected a number"),
        (["--max-overflow-increase", "1pp"], "pp (percentage points) is for shares only"),
        (["--max-overflow-increase", "$1"], "$ is for cost only"),
    ],
)
def test_malformed_limits_exit_2(runs: tuple[Path, Path], args: list[str], message: str) -> None:
    base, cand = runs
    result = compare(base, cand, *args)
    assert result.exit_code == 2
    assert message in result.output


def test_unusable_runs_exit_2(runs: tuple[Path, Path], tmp_path: Path) -> None:
    base, _ = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    result = compare(base, empty)
    assert result.exit_code == 2
    assert result.output.startswith("error: empty: no requests.parquet")
    assert compare(base, tmp_path / "missing").exit_code == 2

    fewer = _run_of(tmp_path / "fewer", [TRACES[0]], "toy")
    result = compare(base, fewer)
    assert result.exit_code == 2
    assert "different traces (1 only in the baseline, 0 only in the candidate)" in result.output

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("requests.parquet", "sessions.parquet"):
        (broken / name).write_bytes(b"not parquet")
    (broken / "manifest.json").write_text("{}")
    result = compare(base, broken)
    assert result.exit_code == 2 and "unreadable run" in result.output


def _run_of(out: Path, traces: list[Any], policy: str) -> Path:
    from simulator.app.pytest_plugin import replay_run

    return replay_run(traces, policy).write(out)


def test_nothing_to_pair_exits_2(runs: tuple[Path, Path], tmp_path: Path) -> None:
    base, cand = runs
    two = tmp_path / "two"
    _merge([base, _run(tmp_path / "t", "toy")], two)
    other = tmp_path / "other"
    _merge([_run(tmp_path / "x", "toy", window=1), _run(tmp_path / "y", "toy", window=2)], other)
    result = compare(base, other)
    assert result.exit_code == 2
    assert "no policy spec to compare" in result.output
    # one spec on one side, two on the other, sharing a name: that pair, the rest listed
    result = compare(two, cand)
    assert result.exit_code == 0, result.output
    assert "Not compared (no counterpart): baseline as-recorded #" in result.output


def test_a_limit_on_a_figure_an_old_run_lacks_exits_2(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    base, cand = runs
    old = tmp_path / "old"
    old.mkdir()
    requests = pl.read_parquet(cand / "requests.parquet")
    keep = [c for c in requests.columns if c not in ("human_tokens", "stale_file_refs")]
    requests.select(keep).write_parquet(old / "requests.parquet")
    for name in ("sessions.parquet", "manifest.json"):
        (old / name).write_bytes((cand / name).read_bytes())
    result = compare(base, old)
    assert result.exit_code == 0
    assert _row(result.output, "stale file refs").split("|")[4].strip() == "-"
    result = compare(base, old, "--max-stale-ref-increase", "0")
    assert result.exit_code == 2
    assert "the candidate run has no stale file refs" in result.output


def test_out_writes_the_table_and_the_side_by_side_chart(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    base, cand = runs
    out = tmp_path / "cmp"
    result = compare(base, cand, "--out", out)
    assert result.exit_code == 0
    assert (out / "compare.md").read_text() == result.output
    png = (out / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    again = tmp_path / "cmp2"
    assert compare(base, cand, "--out", again).exit_code == 0
    assert (again / "compare.png").read_bytes() == png


@pytest.mark.parametrize(
    ("text", "metric", "limit"),
    [
        ("2%", "cost_total", Limit("2%", 0.02, True)),
        ("0", "overflows", Limit("0", 0.0, False)),
        ("$0.10", "cost_total", Limit("$0.10", 0.10, False)),
        ("0.5pp", "cache_hit_ratio", Limit("0.5pp", 0.005, False)),
        ("-5%", "cost_total", Limit("-5%", -0.05, True)),
        (" 3 ", "stale_file_refs", Limit("3", 3.0, False)),
    ],
)
def test_parse_limit(text: str, metric: str, limit: Limit) -> None:
    assert parse_limit(text, next(m for m in METRICS if m.key == metric)) == limit


def test_limit_directions() -> None:
    up = Limit("2%", 0.02, True)
    assert not up.crossed(100.0, 102.0, +1)
    assert up.crossed(100.0, 102.1, +1)
    assert not up.crossed(0.0, 0.0, +1) and up.crossed(0.0, 1.0, +1)
    points = Limit("1pp", 0.01, False)  # a share may fall by at most one point
    assert not points.crossed(0.90, 0.89, -1)
    assert points.crossed(0.90, 0.885, -1)
    assert not points.crossed(0.90, 0.99, -1)  # a rise is no worsening


def test_a_policy_that_edits_its_context_is_seen_and_gated(tmp_path: Path) -> None:
    """A policy that rewrites its context without any compaction call (masking) shows in
    compare's edit rows, and --max-edit-increase gates on them."""
    from tests.support.scripted import Script

    s = Script()
    s.user(100)
    s.request()
    s.rounds(4, 1_000)
    traces = [("t", s.trace())]
    from simulator.app.pytest_plugin import replay_run

    base = _run_of(tmp_path / "base", traces, "none")
    keep_two = {"keep_observations": 2, "keep_first_observation": False}
    cand = replay_run(traces, "masking", keep_two).write(tmp_path / "cand")
    result = compare(base, cand, "--max-edit-increase", "0")
    assert result.exit_code == 1, result.output
    # two observations masked (requests 3 and 4), 1,000 - 12 tokens each
    assert _row(result.output, "context edits").startswith("|  | context edits | 0 | 2 | +2 |")
    assert "| tokens edited out | 0 | 1,976 |" in _row(result.output, "tokens edited out")
    assert _row(result.output, "compactions").startswith("|  | compactions | 0 | 0 |")


@pytest.mark.parametrize("width", [80, 200])
def test_the_terminal_table_fits_and_flags_the_overflowing_policy(
    runs: tuple[Path, Path], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --markdown the same figures come as a table no wider than COLUMNS; the toy
    policy's one overflow is marked in its cell and named under the table."""
    base, cand = runs
    monkeypatch.setenv("COLUMNS", str(width))
    result = compare(base, cand, "--max-overflow-increase", "0", markdown=False)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= width
    assert not any(line.startswith("|") for line in lines)  # no markdown
    (overflows,) = [line for line in lines if line.split()[:1] == ["overflows"]]
    assert overflows.split()[1:5] == ["0", "1", "!", "+1"]
    text = " ".join(lines)
    assert "! overflowed: candidate as-recorded → toy (1)" in text
    assert "1 limit(s) crossed:" in text


def _unpriced_trace(model: str, requests: int) -> Trace:
    """`requests` requests of `model`, a minute apart, each adding 500 tokens."""
    b = SessionBuilder(Hasher(b"unpriced"), id="s-u", kind="main", client="test")
    b.prefix_tokens = 2_000
    for k in range(requests):
        b.add_block(
            msg=k, kind=Kind.TEXT, role=Role.USER, text=f"t{k}", ts=T0 + k * MINUTE - 1,
            first_request=k, tokens=500, flags=Flag.HUMAN,
        )  # fmt: skip
        b.add_request(ts=T0 + k * MINUTE, model=model, usage=None)
    return Trace("claude-code", "u", [b.finish()])


def test_dollars_that_leave_out_unpriced_calls_are_marked(
    tmp_path: Path, ctxsim_replay: Callable[..., Replay]
) -> None:
    """A session on a model with no price adds nothing to either side's dollars: the cost
    row says so, with how many calls each side leaves out."""
    traces = [*TRACES, ("u", _unpriced_trace("no-such-model-7", 3))]
    base = ctxsim_replay(traces, policy="as-recorded").write(tmp_path / "base")
    cand = ctxsim_replay(traces, policy="as-recorded").write(tmp_path / "cand")
    for markdown in (True, False):
        result = compare(base, cand, markdown=markdown)
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert "$0.0320* | $0.0320*" in text if markdown else "$0.0320* $0.0320*" in text
        assert (
            "* dollars leave out calls whose model has no price (baseline 3, candidate 3); a "
            "change there is not in the dollars." in text
        )
    plain = compare(*runs_of(tmp_path, ctxsim_replay), markdown=False)
    assert "*" not in plain.output


def runs_of(tmp_path: Path, ctxsim_replay: Callable[..., Replay]) -> tuple[Path, Path]:
    """Two runs on traces whose every model has a price."""
    base = ctxsim_replay(TRACES, policy="as-recorded").write(tmp_path / "p-base")
    cand = ctxsim_replay(TRACES, policy="as-recorded").write(tmp_path / "p-cand")
    return base, cand
