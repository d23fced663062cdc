"""Context edits on the record: what a policy changes in its view without a call of its own
is counted on the row of the call it precedes and listed in edits.parquet (simulator/policy.py
`Edit`), with hand-computed sizes on hand-built sessions."""

from __future__ import annotations

import io

import polars as pl

from simulator import policy as registry
from simulator import run as service
from simulator.frames import EDITS_FILE
from tests.support.scripted import Script


def _masked_session() -> Script:
    """A 100-token prompt, then 4 rounds of a 100-token call and a 1,000-token result."""
    s = Script()
    s.user(100)
    s.request()
    s.rounds(4, 1_000)
    return s


def test_masking_puts_each_masked_observation_on_the_record() -> None:
    trace = _masked_session().trace()
    policy = registry.build("masking", {"keep_observations": 2, "keep_first_observation": False})
    outputs = service.run([("t", trace)], [policy])
    requests = outputs.requests.filter(pl.col("kind") == "request").sort("request")
    # results enter at requests 1-4; from request 3 on, the oldest beyond the newest two
    # becomes a 12-token placeholder: 1,000 - 12 = 988 tokens removed, once each
    assert requests["edits"].to_list() == [0, 0, 0, 1, 1]
    assert requests["edit_tokens"].to_list() == [0, 0, 0, 988, 988]
    edits = pl.read_parquet(io.BytesIO(outputs.files[EDITS_FILE]))
    assert edits.select("request", "call", "stage", "kind", "tokens_removed").rows() == [
        (3, 0, "mask", "mask", 988),
        (4, 0, "mask", "mask", 988),
    ]
    # the masked results had been sent by earlier requests: the cached prefix breaks there
    assert edits["breaks_prefix"].to_list() == [True, True]
    assert outputs.sessions["edits"].to_list() == [2]
    assert outputs.sessions["edit_tokens"].to_list() == [1_976]
    assert outputs.manifest["rows"]["edits"] == 2
    assert outputs.sessions["compactions"].to_list() == [0]  # edits, not compactions


def test_cache_edits_are_on_the_record_without_breaking_the_prefix() -> None:
    """Claude Code's cached microcompact: at 12 live Read results it deletes all but the
    newest 5 through cache_edits, by reference: 7 edits of 500 tokens, the prefix kept."""
    s = Script(tool="Read")
    s.user(100)
    s.request()
    s.rounds(12, 500)
    policy = registry.build("claude-code@2.1.88", {"microcompact.cached.enabled": True})
    outputs = service.run([("t", s.trace())], [policy])
    edits = pl.read_parquet(io.BytesIO(outputs.files[EDITS_FILE]))
    assert edits.height == 7
    assert set(edits["request"].to_list()) == {12}
    assert set(edits["kind"].to_list()) == {"clear"}
    assert set(edits["stage"].to_list()) == {"microcompact"}
    assert edits["tokens_removed"].sum() == 7 * 500
    assert not edits["breaks_prefix"].any()
    row = outputs.requests.filter((pl.col("request") == 12) & (pl.col("kind") == "request"))
    assert row["edits"].to_list() == [7] and row["edit_tokens"].to_list() == [3_500]


def test_a_policy_without_edits_writes_an_empty_table() -> None:
    outputs = service.run([("t", _masked_session().trace())], [registry.build("none")])
    edits = pl.read_parquet(io.BytesIO(outputs.files[EDITS_FILE]))
    assert edits.height == 0
    assert edits.columns[:4] == ["trace", "session", "session_index", "request"]
    assert outputs.requests["edits"].sum() == 0
