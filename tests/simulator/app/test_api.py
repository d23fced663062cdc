"""The Python API (simulator/app/api.py) is `ctxsim run` without the shell: same rows and
bytes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from simulator.app import api
from simulator.app.cli import main
from simulator.policy import PolicyError
from tests.support import SAMPLES


def test_the_api_writes_the_bytes_ctxsim_run_writes(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(SAMPLES),
            "--policy",
            "as-recorded",
            "--policy",
            "claude-code@2.1.88",
            "-P",
            "claude-code@2.1.88:autocompact.buffer_tokens=8k",
            "--seed",
            "3",
            "--strict",  # the API's default; the CLI skips damaged lines unless told
            "--no-report",
            "--out",
            str(tmp_path / "cli"),
        ],
    )
    assert result.exit_code == 0, result.output
    traces = api.load([SAMPLES])
    run = api.replay(
        traces,
        ["as-recorded", ("claude-code@2.1.88", {"autocompact.buffer_tokens": "8k"})],
        seed=3,
    )
    written = api.write(run, tmp_path / "api")
    names = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert names == ["edits.parquet", "manifest.json", "requests.parquet", "sessions.parquet"]
    assert sorted(p.name for p in written.iterdir()) == names
    for name in names:
        assert (written / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_frames_and_summary(tmp_path: Path) -> None:
    run = api.replay(api.load([SAMPLES]), ["as-recorded", "none"])
    assert set(run.requests["policy"].unique()) == {"as-recorded", "none"}
    assert run.summary.height == 2
    # one row per recorded request under as-recorded: every request of every session
    recorded = run.requests.filter(
        (pl.col("policy") == "as-recorded") & (pl.col("kind") == "request")
    )
    total = sum(s.n_requests for _, t in api.load([SAMPLES]) for s in t.sessions)
    assert recorded.height == total
    assert run.manifest["policies"][0]["name"] == "as-recorded"


def test_a_bad_parameter_is_refused_when_the_policy_is_built() -> None:
    with pytest.raises(PolicyError, match=r"snip\.enabled"):
        api.policy(("claude-code", {"snip.enabled": "no"}))
    with pytest.raises(PolicyError, match="unknown policy"):
        api.policy("no-such-policy")


def test_traces_are_named_once_and_a_clash_is_refused() -> None:
    from simulator.model import Trace
    from traces.load import Loaded, NameClash, named_traces

    a, b = Trace("claude-code", "a" * 64, []), Trace("claude-code", "b" * 64, [])
    same = [Loaded("x", "s-1.ctxt", trace=a), Loaded("y", "s-1.ctxt", trace=a)]
    assert named_traces(same) == [("s-1", a)]
    with pytest.raises(NameClash, match="two different traces are named 's-1'"):
        named_traces([Loaded("x", "s-1.ctxt", trace=a), Loaded("y", "s-1", trace=b)])
