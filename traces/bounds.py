"""Bounds that every recorded number must meet before it enters a Trace.

A reader that accepts any integer lets a damaged or crafted file price a $15M call, wrap an
int32 block column to a negative size, or date a request in year 0001 (issue 17: R02-R07,
R10). The bounds below are facts about the providers and the recordings, not fits:

* MAX_CONTEXT_TOKENS = 10,000,000: the largest context window any provider offers for one
  request (Llama 4 Scout, 10M; Gemini 1.5 Pro 2M; Claude 1M with the long-context beta; GPT-4.1
  and GPT-5 1M or less). A recorded input side (uncached + cache read + cache writes) larger
  than that cannot have been sent. The bound also keeps every block's anchored size, which
  never exceeds its request's context, within the int32 `tokens` column of the compiled layout
  (2^31 - 1 is 214 times the bound), and a corpus sum within int64 for 9e11 requests.
* MAX_OUTPUT_TOKENS = 1,000,000: ten times the largest output cap documented (128K: GPT-5,
  Claude 3.7 Sonnet with the output beta; 64K for Claude Sonnet 4.x and Opus 4.5).
* MIN_TS_MS = 2020-01-01T00:00Z, MAX_TS_MS = 2100-01-01T00:00Z: no agent CLI that ctxsim
  reads existed before 2024 (SWE-agent, April 2024; Claude Code, February 2025; Codex CLI,
  April 2025), and a fixed upper bound (never the wall clock: ctxsim is deterministic and
  the same file must read the same way next year) far enough ahead to never refuse a real
  recording, yet refusing year 3000 or 9999.
"""

from __future__ import annotations

from datetime import UTC, datetime

MAX_CONTEXT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
MIN_TS_MS = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp() * 1000)
MAX_TS_MS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)

#: Longest shell line handed to shlex, whose time grows with the square of a token's length
#: (1.6 MB: 30 s; 256 KB: 1.4 s; 16 KB: 0.02 s): a longer line is no simple command whose
#: file a reader could name, and is passed over as an unbalanced one is.
MAX_SHLEX_CHARS = 16_384

#: Longest quoted value an error message carries: a 100 KB value must not make a 100 KB line.
MAX_QUOTED_CHARS = 80


def clip(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """`text` cut to `limit` characters, marked with an ellipsis and its full length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def quoted(value: object) -> str:
    """repr of a value for an error message, clipped."""
    return clip(repr(value))


def usage_problem(
    input_: int, cache_read: int, write_5m: int, write_1h: int, output: int
) -> str | None:
    """Why a recorded usage is impossible (negative, context or output above the bounds),
    or None when it is plausible."""
    parts = (input_, cache_read, write_5m, write_1h, output)
    if any(v < 0 for v in parts):
        return "usage holds a negative token count"
    context = input_ + cache_read + write_5m + write_1h
    if context > MAX_CONTEXT_TOKENS:
        return (
            f"usage context of {context} tokens exceeds {MAX_CONTEXT_TOKENS} (no provider takes it)"
        )
    if output > MAX_OUTPUT_TOKENS:
        return f"usage output of {output} tokens exceeds {MAX_OUTPUT_TOKENS} (none emits it)"
    return None


def ts_in_range(ms: int) -> bool:
    """Whether a trace time (ms since the epoch) lies in the plausible recording range."""
    return MIN_TS_MS <= ms < MAX_TS_MS
