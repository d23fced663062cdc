"""The recording's own compactions, replayed by the Claude Code policy where they happened.

A user's /compact is a recorded action, not a policy decision: every preset performs it at
the recorded request, with the summary the recording logged, and models what the client
attached after it. For checking the policy's own trigger one compaction at a time, the
compactions before a given request can also be replayed exactly as recorded (summary and
unlogged attachments), so the check starts from the recorded state instead of from the
policy's own, possibly different, earlier compactions.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model import Session


@dataclass(frozen=True)
class RecordedCompaction:
    """A compaction of the recording that the policy performs where it happened."""

    stage: str  # "manual" (the user's /compact) or "as-recorded"
    summary: int | None  # the summary block's tokens (None: not logged, drawn)
    attached: int | None  # tokens the client put back after it (None: modelled)
    summary_block: int  # blocks logged after it came after the compaction (-1: none logged)
    #: When its call went out and ended (`Session.compaction_call_ms`): a /compact is the
    #: user's action at a recorded time, and the next request may come hours after it.
    at_ms: tuple[int, int] | None = None


def recorded_compactions(session: Session, before: int | None) -> dict[int, RecordedCompaction]:
    """Request -> compaction to replay. The user's /compact commands are recorded actions,
    replayed with the summary the recording logged (the attachments are modelled). With
    `before`, every recorded compaction before that request is replayed exactly as
    recorded: the summary plus the unlogged attachments the builder inferred from the
    usage (INJECTED artifacts), so the context after it is the recorded one; a check of
    the policy's own trigger can then start from the recorded state rather than from its
    own earlier compactions."""
    b = session.blocks
    n = session.n_requests
    out: dict[int, RecordedCompaction] = {}
    for e in session.events:
        if e.request >= n:
            continue  # after the last request: nothing to compact for
        # At request 0 there is no response before the call to time it by: the request's.
        at_ms = session.compaction_call_ms(e) if e.request else None
        if e.summary_block < 0:
            if e.trigger == "manual":
                out[e.request] = RecordedCompaction("manual", None, None, -1, at_ms)
            continue
        summary = int(b["tokens"][e.summary_block])
        if before is not None and e.request < before:
            attached = session.injected_at(e.request)
            out[e.request] = RecordedCompaction(
                "as-recorded", summary, attached, e.summary_block, at_ms
            )
        elif e.trigger == "manual":
            out[e.request] = RecordedCompaction("manual", summary, None, e.summary_block, at_ms)
    return out
