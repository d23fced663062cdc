"""Claude Code's own settings, read the way the client reads them, and the autocompact
window they give on a recorded session.

The settings keep their real names as parameters (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE,
CLAUDE_CODE_AUTO_COMPACT_WINDOW, CLAUDE_CODE_MAX_OUTPUT_TOKENS, DISABLE_AUTO_COMPACT,
DISABLE_COMPACT, autoCompactEnabled), so the `env` block of a settings.json maps onto a
what-if one key at a time, with the value as written there ("60", "1", "true").

Window (the 2.1.221 decompile, BaseInfinity/claude-sdlc-harness#520, functions EX/CCo/ZJu):
window = min(model window, CLAUDE_CODE_AUTO_COMPACT_WINDOW clamped to 100k-1M); a window
set to 100k-199,999 turns autocompact off (ZJu returns false below 200,000 for a window
that is not the model's own); claude-sonnet-5's own autocompact window is 967,000 (VJu).
Older clients: 2.1.2x-2.1.8x computed on at most 200,000 even on a 1M model
(claude-code#34202: ~150k trigger on 1M in 2.1.75; #36014: "effectiveWindow likely capped at
200k"); 2.1.92 capped Opus 4.6's 1M autocompact window at 400,000 (claude-code#43989,
rollback to 2.1.91 restored 1M).

The model window is the one the session ran with (simulator/models.py `session_facts`: the
1M window when the recording shows a context above 200k or a `[1m]` model), unless the
recording's own auto-compactions say the client computed on the standard window: an
auto-compaction logged below 200,000 tokens cannot come from a 1M window (whose trigger is
967k in 2.1.2xx, 367k under 2.1.92's cap). In ../shared/traces/claude-code/flutter-docker
one Opus 5 session (2.1.226) reached 204,665 tokens and then auto-compacted three times at
166.6k-167.0k (200,000 - 20,000 - 13,000): its API window was 1M, its autocompact window
200k. `window_1m` true/false overrides both readings.

A context between the standard window's blocking limit and 200,000 says the larger window
too (`sent_past_blocking`): on 200k the client compacts from 167,000 or, with autocompact
off, refuses to send from 177,000 (effective window - 3,000, the blocking check of the
2.1.88 query loop, DESIGN.md 4). ../shared/traces/claude-code/entirecontext f70db4c5
(2.1.232, Opus 4.6 without `[1m]` in its model string) sent up to 190,683 tokens and never
compacted; read as 200k, the replay compacted it at request 69 where the client did not.
Only the 1M-capable models are read so, and the preset's own blocking limit is used; a
client whose estimate ran under the recorded input could pass it by that much
(flutter-docker 390ab778's request 146: estimate 166,135, input 166,408).

One window per client process, not per session (`standard_window_from`): the autocompact
window is what the process read at start (the model's default window "can be tuned on our
side without a Claude Code release", claude-code#86863), and a recording can span
processes (a resumed file copies the earlier process's calls). Where the recording shows
both windows, a context above 200,000 sent without compacting and an auto-compaction
below it, the longer window holds up to the first auto-compaction after the last request
above 200,000: a process on the standard window compacts at once when it resumes a context
above its threshold. In ../shared/traces/claude-code/flutter-docker, 390ab778's requests
0-93 were sent by 2.1.224 (up to 204,665 tokens, no compaction); aba9151e (2.1.226)
resumed it and compacted at once (request 94, preTokens 213,002), then at 167,009, 166,612
and 166,907: requests 0-93 on 1M, the rest on 200k.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from simulator.model import Session
from simulator.models import STANDARD_WINDOW, facts

#: Claude Code's isEnvTruthy: these words (any case) are true, anything else false.
_TRUTHY = ("1", "true", "yes", "on")


def env_truthy(value: Any) -> bool:
    """A setting as Claude Code reads an environment variable or a settings.json value:
    true, 1, "1", "true", "yes", "on" are on; null, false, 0, "" and other words are off."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    return str(value).strip().lower() in _TRUTHY


def pct_share(value: Any, fmt: str) -> float | None:
    """CLAUDE_AUTOCOMPACT_PCT_OVERRIDE as a share of the effective window, or None when the
    client ignores it. "percent" (every version whose code is public: parseFloat, accepted
    when 0 < v <= 100, divided by 100; claude-code#31806 for 2.1.x, the 2.1.221 decompile):
    "60" is 0.60 and "0.8" is 0.8%, which makes every request compact (what
    jundot/omlx#2400 saw as "0.8 works" on 2.1.2xx: 36 compactions in 28 turns). "fraction"
    reads a value <= 1 as the share itself ("0.6" is 0.60) and larger ones as a percent."""
    if value is None or value == "":
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    if not 0 < number <= 100:
        return None
    if fmt == "fraction" and number <= 1:
        return number
    return number / 100


def recorded_auto_below(session: Session, window: int) -> bool:
    """Whether the recording holds an auto-compaction that fired below `window` tokens
    (its logged preTokens, else the recorded context just before it)."""
    ctx = session.recorded_context() if session.n_requests else None
    for e in session.events:
        if e.trigger == "manual":
            continue
        pre = e.pre_tokens
        if pre < 0 and ctx is not None and 0 < e.request <= len(ctx):
            pre = int(ctx[e.request - 1])
        if 0 < pre < window:
            return True
    return False


def sent_past_blocking(session: Session, blocking: int) -> bool:
    """Whether the recording sent a context above `blocking` (the standard window's
    blocking limit) with no auto-compaction below the standard window: on that window
    the client compacts from the threshold or, autocompact off, refuses to send from the
    blocking limit (effective - 3,000, 177,000 on 200k), so it ran on the larger one."""
    if not session.n_requests or recorded_auto_below(session, STANDARD_WINDOW):
        return False
    return bool((session.recorded_context() > blocking).any())


def standard_window_from(session: Session) -> int:
    """The first request computed on the standard window after a longer one (see the module
    docstring), or 0 when the recording shows no such change: the first auto-compaction
    after the last request whose recorded context exceeded the standard window."""
    if not session.n_requests:
        return 0
    above = np.nonzero(session.recorded_context() > STANDARD_WINDOW)[0]
    if not len(above):
        return 0
    last = int(above[-1])
    after = [e.request for e in session.events if e.trigger == "auto" and e.request > last]
    return min(after) if after else 0


def _matches(pattern: str, model: str) -> bool:
    return bool(pattern) and re.search(pattern, model) is not None


def client_window(
    session: Session,
    model: str,
    window: int,
    p: dict[str, Any],
    *,
    as_sent: bool = False,
    blocking: int | None = None,
) -> tuple[int, bool]:
    """(autocompact window, whether autocompact may run on it) for a session whose model
    runs on `window` tokens (simulator/models.py `session_facts`); see the module
    docstring for each step. `as_sent`: the window of the requests before
    `standard_window_from`, which the recorded auto-compactions below 200,000 do not
    describe. `blocking`: the blocking limit the preset computes on the standard window
    (`sent_past_blocking`)."""
    one_m = p["window_1m"]
    own = facts(model)
    if one_m is True:
        window = own.largest_window
    elif one_m is False:
        window = min(own.window, STANDARD_WINDOW)
    elif not as_sent and window > STANDARD_WINDOW and recorded_auto_below(session, STANDARD_WINDOW):
        window = STANDARD_WINDOW
    elif (
        blocking is not None
        and window <= STANDARD_WINDOW < own.largest_window
        and sent_past_blocking(session, blocking)
    ):
        window = own.largest_window
    for pattern, size in (p["autocompact.model_windows"] or {}).items():
        if size is not None and _matches(pattern, model):
            window = min(window, int(size))
            break
    cap = p["autocompact.window_cap_tokens"]
    if cap is not None and (
        not p["autocompact.window_cap_models"]
        or _matches(p["autocompact.window_cap_models"], model)
    ):
        window = min(window, int(cap))
    allowed = True
    env = p["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]
    if env is not None:
        low = int(p["autocompact.env_window_min_tokens"])
        high = int(p["autocompact.env_window_max_tokens"])
        asked = max(low, min(high, int(env)))
        window = min(window, asked)
        small = p["autocompact.env_window_disables_below"]
        if small is not None and asked < int(small):
            allowed = False
    return window, allowed
