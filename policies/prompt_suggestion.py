"""Claude Code's prompt suggestion: an unlogged request that writes the cache when a turn
ends, found in the recording (`post_turn_writes`).

Both the `as-recorded` replay and the claude-code pipeline keep the entry it writes
(policies/as_recorded.py; policies/claude_code/policy.py `_suggestion_write`): the client
sends the fork whatever its context policy, so a policy replaying the same turns gets the
same read where its conversation still holds the response the fork wrote through. Neither
prices the fork itself: it is not in the recording.
"""

from __future__ import annotations

from simulator.model import Kind, Session, version_tuple

#: The first Claude Code version with prompt suggestions (its changelog: 2.0.71 added the
#: `/config` toggle for them); `post_turn_writes` finds none before it.
POST_TURN_SINCE = (2, 0, 71)


def post_turn_writes(session: Session) -> dict[int, int]:
    """Request k -> the last block of request k-1's response, where the client wrote the
    cache through the end of that response with a request it does not log, sent when the
    turn ended (so at k-1's response end, with k-1's TTL).

    The mechanism: Claude Code's prompt suggestion (`promptSuggestion.ts` of the 2.1.88
    sources, services/PromptSuggestion). When a turn ends (a response without tool use)
    the client forks the conversation and asks the model to predict the user's next prompt
    (`runForkedAgent` with `skipCacheWrite: true`, `skipTranscript: true`). skipCacheWrite
    moves the request's one message marker from its last message (the suggestion prompt) to
    the one before (`addCacheBreakpoints`: `markerIndex = skipCacheWrite ? messages.length
    - 2 : messages.length - 1`), which is the response that ended the turn: the fork writes
    the conversation through that response, which no logged request wrote (each wrote its
    own prompt), and the user's next prompt reads it. The feature is gated per user
    (a GrowthBook experiment, `promptSuggestionEnabled`, off in non-interactive sessions:
    the SDK and Claude Desktop), so no version says whether a session has it; the
    recording does: the next request reads past what the previous one could have written.

    In ../shared/traces/claude-code, of the user prompts after an end of turn (a response
    without tool use; the next request adds a human prompt and no tool result; same model,
    no compaction, usage on both): 824 came within the previous request's TTL after its
    response's end, and 202 of those read past the previous request's whole context. By
    folder (such reads / such prompts): git-sync 2.1.121-2.1.146 3 / 169, 2.1.150-2.1.199
    50 / 90; wakil 2.1.204-2.1.233 69 / 170; flutter-docker 49 / 115; starcar 3 / 32;
    m-claude 2.1.6-2.1.9 22 / 112; denubis 4 / 15; promptgrimoire 2 / 30; none in
    entirecontext (0 / 24: 40 of its 43 files are `sdk-cli`), technocore and nomos (0 / 21:
    Claude Desktop), m-claude 2.0.x (0 / 6), vsla 1.0.x (0 / 40). Prompts with
    `promptSource: "suggestion_accepted"` are logged in wakil (9), starcar and
    entirecontext (1 each). How far: on 2.1.100+, 160 of the 174 reads are exactly the
    previous context plus the previous response's logged output less 2 tokens (10 less 4,
    2 less 3); 141 of the 202 read 90-110% of the response's tokens as the compiled trace
    has them, 16 less than half (the compiled response holds tokens the fork did not
    write), 1 beyond the response into the new prompt: both kinds not taken, the other 185
    are. When: none of the 121 prompts later than the TTL read into the response; the 73
    reads more than 5 minutes after the end are all in sessions writing 1-hour entries (up
    to 3,521 s), the 5-minute ones all within 300 s (m-claude 43391f62 at 264 and 266 s):
    the fork writes with the session's TTL, right after the turn ends. Not every turn has
    one: in the 2.1.150+ sessions with any such read, 52 of 162 prompts 1-5 minutes after
    the end read into the response, 42 of 56 at 5-15 minutes, 28 of 34 at 15-60 (a
    suggestion suppressed, or aborted by a prompt typed first); no rule here says which
    turns, so the recording's read does. The source skips the fork when the previous
    response's input + cache write + output exceeds 10,000 tokens (`cache_cold`); 5 reads
    here follow such a response (wakil 537e8445 request 138, after a 309k write), so that
    gate is not modelled, nor needed: the read decides."""
    version = version_tuple(session.client)
    r = session.requests
    n = len(r)
    if n < 2 or not version or version < POST_TURN_SINCE:
        return {}
    blocks = session.blocks
    origin = blocks["origin"].tolist()
    kinds = blocks["kind"].tolist()
    tokens = blocks["tokens"].tolist()
    last = [-1] * n
    size = [0] * n
    tool_use = [False] * n
    for b, k in enumerate(origin):
        if 0 <= k < n:
            size[k] += tokens[b]
            if kinds[b] == Kind.TOOL_USE:
                tool_use[k] = True
            elif kinds[b] != Kind.THINKING:
                last[k] = max(last[k], b)
    has = r["has_usage"].tolist()
    read = r["cache_read"].tolist()
    model = r["model"].tolist()
    output = r["output"].tolist()
    context = session.recorded_context().tolist()
    compactions = {e.request for e in session.events}
    out: dict[int, int] = {}
    for k in range(1, n):
        j = k - 1
        if not (has[k] and has[j]) or model[k] != model[j] or k in compactions:
            continue
        if tool_use[j] or last[j] < 0 or size[j] <= 0:
            continue
        reach = read[k] - context[j]  # how far the read goes past what k-1 could write
        if 2 * reach >= size[j] and reach <= max(size[j], output[j]):
            out[k] = last[j]
    return out
