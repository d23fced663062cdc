"""Every parameter of Claude Code's pipeline (the BASE dict of policies/claude_code/policy.py),
declared once: its type, unit, allowed range, a one-line meaning and where its default
comes from (simulator/params.py).

How to add one (the style of this file):

* one entry per BASE key, grouped by stage in BASE's order: `"stage.name": kind(meaning,
  source, ...)`, where kind is `tokens`, `chars`, `count`, `minutes`, `fraction`, `flag`,
  `choice`, `names` or `limits` and the range is a keyword (`low=`, `high=`,
  `optional=True` when null is a value);
* the meaning is one line, says what the value does, and says what null means when null is
  allowed;
* the source is the fact the BASE default models with its citation ("DESIGN.md 4", a
  Claude Code setting or constant by name, an issue number "claude-code#NNNN"), or starts
  with "ours" when the default is a modelling choice;
* a preset that changes a value changes it in its `defaults` (policy.py), not here: the
  source shown for it is the preset (its docstring holds the citation).

tests/simulator/test_params.py fails when a key of any registered policy's defaults has no entry
here (or an entry has no key), and when a default does not parse to itself.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, TypeAdapter

from policies.base import CACHE_TTL, PREFIX_RESETS, WARM_START
from simulator.params import (
    Param,
    chars,
    choice,
    count,
    flag,
    fraction,
    limits,
    minutes,
    names,
    tokens,
)


def _null_word(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("none", "null"):
        return None
    return value


def _env(meaning: str, source: str) -> Param:
    """A Claude Code setting as a settings.json env block writes it: a string, a number or
    a boolean, read the way the client reads it (policies/claude_code/settings.py)."""
    value = Annotated[
        Annotated[str, Field(strict=True)]
        | Annotated[bool, Field(strict=True)]
        | Annotated[int, Field(strict=True)]
        | Annotated[float, Field(strict=True)]
        | None,
        BeforeValidator(_null_word),
    ]
    accepts = 'a setting\'s value as settings.json writes it (e.g. "60", 1, true), or null'
    return Param(
        "str | int | float | bool | None",
        "",
        meaning,
        source,
        accepts,
        adapter=TypeAdapter(value),
        optional=True,
    )


def _optional_flag(meaning: str, source: str) -> Param:
    """true, false, or null (decided from the recording)."""
    value = Annotated[Annotated[bool, Field(strict=True)] | None, BeforeValidator(_null_word)]
    return Param(
        "bool | None",
        "",
        meaning,
        source,
        "true, false, or null / none",
        optional=True,
        adapter=TypeAdapter(value),
    )


def _text(meaning: str, source: str) -> Param:
    """A free string (a regex)."""
    return Param(
        "str",
        "",
        meaning,
        source,
        "a string",
        adapter=TypeAdapter(Annotated[str, Field(strict=True)]),
    )


PARAMS: dict[str, Param] = {
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
    "warm_start": WARM_START,
    "prompt_suggestion": flag(
        "keep the cache entry the prompt-suggestion fork writes when a turn ends, where the"
        " recording shows one (the fork itself is not priced)",
        "Claude Code 2.0.71+ promptSuggestion.ts, skipCacheWrite (policies/prompt_suggestion.py)",
    ),
    # -- stage 0, the tool-result budget (policies/claude_code/budget.py) -----------------
    "budget.enabled": flag(
        "persist large tool results to disk and send a preview instead",
        "Claude Code 2.1.88 tool-result budget (DESIGN.md 4, stage 0)",
    ),
    "budget.max_result_chars": chars(
        "a tool result above min(its tool's limit, this) is persisted",
        "Claude Code 2.1.88: 50,000 chars (DESIGN.md 4, stage 0)",
    ),
    "budget.tool_limits": limits(
        "per-tool limit on a result's size; null: that tool's results are never persisted",
        "Claude Code 2.1.88: Bash 30,000, Grep 20,000, Read never (DESIGN.md 4, stage 0)",
    ),
    "budget.preview_chars": chars(
        "size of the preview a persisted result is replaced by",
        "Claude Code 2.1.88: ~2,000 chars in <persisted-output> (DESIGN.md 4, stage 0)",
    ),
    "budget.per_message.enabled": flag(
        "also cap the fresh tool results of one user message (largest replaced first)",
        "Claude Code 2.1.88: gated off by default (DESIGN.md 4, stage 0)",
    ),
    "budget.per_message.max_chars": chars(
        "most chars of fresh tool results one user message may carry",
        "Claude Code 2.1.88: 200,000 chars (DESIGN.md 4, stage 0)",
    ),
    # -- stage 1, snip (policies/claude_code/snip.py) -------------------------------------
    "snip.enabled": flag(
        "remove middle API-round groups when the estimate passes the trigger",
        "Claude Code: internal builds only, so off (DESIGN.md 4, stage 1)",
    ),
    "snip.trigger_fraction": fraction(
        "snip when the estimate passes this share of the effective window",
        "ours: the thresholds are not public (DESIGN.md 4, stage 1)",
        open_low=True,
    ),
    "snip.target_fraction": fraction(
        "snip until the estimate is under this share of the effective window",
        "ours: the thresholds are not public (DESIGN.md 4, stage 1)",
        open_low=True,
    ),
    "snip.keep_head_groups": count(
        "API-round groups at the start that snip never removes",
        "ours: the selection is not public (DESIGN.md 4, stage 1)",
        unit="groups",
    ),
    "snip.keep_tail_groups": count(
        "API-round groups at the end that snip never removes",
        "ours: the selection is not public (DESIGN.md 4, stage 1)",
        unit="groups",
    ),
    # -- stage 2, microcompact (policies/claude_code/microcompact.py) ---------------------
    "microcompact.tools": names(
        "tools whose old results microcompact clears",
        "Claude Code 2.1.88: Read, Bash, PowerShell, Grep, Glob, WebSearch, WebFetch, Edit,"
        " Write (DESIGN.md 4, stage 2)",
    ),
    "microcompact.time_based.enabled": flag(
        "clear old tool results after a long idle gap (the cache has expired anyway)",
        "Claude Code 2.1.88: gated off by default (DESIGN.md 4, stage 2)",
    ),
    "microcompact.time_based.gap_minutes": minutes(
        "idle time since the last assistant message that triggers the clearing",
        "Claude Code 2.1.88: 60 minutes (DESIGN.md 4, stage 2)",
    ),
    "microcompact.time_based.keep": count(
        "most recent compactable results the time-based clearing keeps",
        "Claude Code 2.1.88: 5 (DESIGN.md 4, stage 2)",
        unit="results",
    ),
    "microcompact.cached.enabled": flag(
        "delete old tool results by reference (cache_edits) without breaking the prefix",
        "Claude Code: internal builds only, so off (DESIGN.md 4, stage 2)",
    ),
    "microcompact.cached.trigger_count": count(
        "compactable results in the context that trigger the cached deletion",
        "a count trigger of about 12 results has been reported (DESIGN.md 4, stage 2)",
        low=1,
        unit="results",
    ),
    "microcompact.cached.keep": count(
        "most recent compactable results the cached deletion keeps",
        "ours: as the time-based variant's 5 (DESIGN.md 4, stage 2)",
        unit="results",
    ),
    # -- stage 3, context collapse (policies/claude_code/collapse.py) ---------------------
    "collapse.enabled": flag(
        "commit staged span summaries as the context grows; proactive autocompact is off",
        "Claude Code: internal builds only, so off (DESIGN.md 4, stage 3)",
    ),
    "collapse.commit_fraction": fraction(
        "commit staged summaries from this share of the effective window",
        "Claude Code: 90% (DESIGN.md 4, stage 3)",
        open_low=True,
    ),
    "collapse.block_fraction": fraction(
        "block the request (an overflow) from this share of the effective window",
        "Claude Code: 95% (DESIGN.md 4, stage 3)",
        open_low=True,
    ),
    "collapse.span_groups": count(
        "API-round groups one collapsed span holds",
        "ours: the span size is not public (DESIGN.md 4, stage 3)",
        low=1,
        unit="groups",
    ),
    "collapse.summary_ratio": fraction(
        "a span's summary size as a share of the span's tokens",
        "ours: the summary ratio is not public (DESIGN.md 4, stage 3)",
    ),
    "collapse.keep_tail_groups": count(
        "API-round groups at the end that collapse never commits",
        "ours: not public (DESIGN.md 4, stage 3)",
        unit="groups",
    ),
    "collapse.prompt_tokens": tokens(
        "prompt of each background span-summary request",
        "ours: an estimate; the prompt is not public",
    ),
    # -- stage 4, autocompact (policies/claude_code/autocompact.py) -----------------------
    "autocompact.enabled": flag(
        "compact the conversation into a summary when the estimate passes the threshold",
        "Claude Code: on by default (DESIGN.md 4, stage 4)",
    ),
    "autocompact.buffer_tokens": tokens(
        "threshold = effective window - this buffer",
        "Claude Code 2.1.88: 13,000 (DESIGN.md 4, stage 4: 167,000 on a 200k window)",
    ),
    "autocompact.threshold_fraction": fraction(
        "threshold as a share of the effective window instead; null: use the buffer",
        "Claude Code 2.1.88 uses the buffer; 1.0.x used 92% (preset claude-code@1.0)",
        open_low=True,
        optional=True,
    ),
    "autocompact.max_output_tokens": tokens(
        "the model's max output, when the model facts do not give one",
        "Claude Code: 32,000 max output (DESIGN.md 4, stage 4)",
        low=1,
    ),
    "autocompact.reserve_cap_tokens": tokens(
        "reserve = min(max output, this cap); null: the whole max output is reserved",
        "Claude Code 2.1.88: 20,000, p99.99 of summaries is 17,387 (DESIGN.md 4, stage 4)",
        optional=True,
    ),
    "autocompact.warning_offset_tokens": tokens(
        "warning = threshold - this offset",
        "Claude Code 2.1.88: 20,000 (DESIGN.md 4, stage 4)",
    ),
    "autocompact.blocking_offset_tokens": tokens(
        "blocking limit = effective window - this offset (above it: an overflow)",
        "Claude Code 2.1.88: 3,000, 177,000 on a 200k window (DESIGN.md 4, stage 4)",
    ),
    "autocompact.summary_prompt_tokens": tokens(
        "the compaction prompt appended to the conversation (nine sections)",
        "ours: an estimate of the no-tools summary prompt (DESIGN.md 4, stage 4)",
    ),
    "autocompact.summary_tokens": tokens(
        "fixed summary size; null: drawn from the calibration with the session's rng",
        "ours: policies/calibration/summary.py, fitted to recorded summaries",
        optional=True,
    ),
    "autocompact.analysis_stripped": flag(
        "the summary's <analysis> section is dropped from what is kept",
        "2.1.29 summaries have none; 1.0.53 kept it (policies/calibration/summary.py)",
    ),
    "autocompact.ptl_retries": count(
        "retries of a prompt-too-long compaction, each dropping the oldest groups",
        "Claude Code 2.1.88: up to 3 (DESIGN.md 4, stage 4)",
        unit="retries",
    ),
    "autocompact.ptl_drop_fraction": fraction(
        "share of the API-round groups a retry drops when the overshoot is unknown",
        "Claude Code 2.1.88: 20% (DESIGN.md 4, stage 4)",
        open_low=True,
    ),
    "autocompact.breaker_failures": count(
        "consecutive failed compactions after which autocompact is off for the session",
        "Claude Code 2.1.88: 3 (DESIGN.md 4, stage 4)",
        low=1,
        unit="failures",
    ),
    "autocompact.failure_probability": fraction(
        "chance that a compaction fails for another reason (seeded)",
        "ours: 0, no such failure is recorded in ../shared/traces",
        unit="probability",
    ),
    "autocompact.restore_files": count(
        "recently touched files re-attached after a compaction",
        "Claude Code 2.1.88: up to 5 (DESIGN.md 4, stage 4)",
        unit="files",
    ),
    "autocompact.restore_file_tokens": tokens(
        "most tokens one re-attached file may take",
        "Claude Code 2.1.88: 5,000 each (DESIGN.md 4, stage 4)",
    ),
    "autocompact.restore_total_tokens": tokens(
        "most tokens all re-attached files may take",
        "Claude Code 2.1.88: 50,000 in all (DESIGN.md 4, stage 4)",
    ),
    "autocompact.restore_reference_tokens": tokens(
        "a file over the per-file cap comes back as a reference of this size; null: cut to it",
        "null: 1.0.53 cut files (calibration README); 2.1.2xx references (autocompact.py)",
        optional=True,
    ),
    "autocompact.restore_extra_tokens": tokens(
        "what the recordings show after a compaction beyond the file rule",
        "the median measured (BEYOND_FILE_RULE, policies/calibration/README.md)",
    ),
    "autocompact.reattach_first_message": flag(
        "the first message's context is attached again after a compaction",
        "2.1.x recordings; 1.0.53 did not (preset claude-code@1.0)",
    ),
    "autocompact.estimate_recounts_response": flag(
        "the trigger's estimate counts the last response's blocks after its first line again",
        "2.1.226 preTokens (flutter-docker 390ab778, 3 of 3); 2.1.29 did not (autocompact.py)",
    ),
    "autocompact.estimate_padding": fraction(
        "the trigger's estimate of what the last usage does not hold is multiplied by this",
        "2.1.2xx: 4/3 (flutter-docker 390ab778, 5 of 5 decisions; autocompact.py); else 1",
        high=4.0,
        open_low=True,
        unit="factor",
    ),
    "autocompact.estimate_logged_output": flag(
        "the trigger adds the last usage's output_tokens as logged, a snapshot in some clients",
        "2.1.29 preTokens = input + logged output (promptgrimoire, 2 of 2); 1.0: off (policy.py)",
    ),
    "autocompact.preserve_tail_groups": count(
        "newest API-round groups kept verbatim after the summary (a full compaction's)",
        "0 before 2.1.200; 2.1.2xx logs compactMetadata.preservedSegment (preset)",
        unit="groups",
    ),
    "autocompact.as_recorded_before": count(
        "replay the recording's compactions before this request exactly; null: none",
        "ours: a check of the trigger one compaction at a time (recorded.py)",
        optional=True,
        unit="request index",
    ),
    "autocompact.skills_tokens": tokens(
        "tokens of invoked skills re-attached after a compaction",
        "ours: 0, a fixed amount; the Skill tool's loads: autocompact.invoked_skills (2.1.2xx)",
    ),
    "autocompact.invoked_skills": flag(
        "the skills the Skill tool loaded so far are attached again after a compaction",
        "2.1.2xx: invoked_skills attachments (flutter-docker 390ab778, autocompact.py); off before",
    ),
    "autocompact.skill_cap_tokens": tokens(
        "most of one invoked skill attached again (the client's length/4 units)",
        "Claude Code: 5,000 per skill (claude-code#96168)",
    ),
    "autocompact.skills_budget_tokens": tokens(
        "most of all invoked skills attached again; older ones beyond it are left out",
        "Claude Code: 25,000 in all (claude-code#96168, DESIGN.md 4)",
    ),
    "autocompact.restore_session_tokens": flag(
        "calibrated sizes (summary, files, rest) in the session's own tokens per cl100k token",
        "2.1.2xx: Opus 4.6 and 5 count 1.31-1.59 per cl100k, the fit 1.207 (autocompact.py)",
    ),
    "autocompact.skill_listing_tokens": tokens(
        "the first message's skill listing, not sent again after a compaction; null: it is",
        "2.1.2xx: about 4,000 (claude-code#76161; autocompact.py); null before (preset)",
        optional=True,
    ),
    "autocompact.skill_listing_recorded": flag(
        "the listing that leaves is the size the recording's client logged for it, in the"
        " session's tokens, where it logged one (else skill_listing_tokens)",
        "2.1.2xx logs the listing it announces (skill_listing attachment; autocompact.py)",
    ),
    "autocompact.session_memory.enabled": flag(
        "try session-memory compaction (no summary request) before a full compaction",
        "Claude Code 2.1.88: gated off by default (DESIGN.md 4, stage 4)",
    ),
    "autocompact.session_memory.min_tail_tokens": tokens(
        "session memory keeps a tail of at least this many tokens",
        "Claude Code 2.1.88: 10,000 (DESIGN.md 4, stage 4)",
    ),
    "autocompact.session_memory.min_tail_text_messages": count(
        "session memory keeps a tail of at least this many text messages",
        "Claude Code 2.1.88: 5 (DESIGN.md 4, stage 4)",
        unit="messages",
    ),
    "autocompact.session_memory.max_tail_tokens": tokens(
        "session memory keeps a tail of at most this many tokens",
        "Claude Code 2.1.88: 40,000 (DESIGN.md 4, stage 4)",
    ),
    "autocompact.session_memory.memory_tokens": tokens(
        "size of the session memory that replaces the rest (its extraction's output)",
        "ours: an estimate; the memory's size is not public",
    ),
    # -- the window autocompact computes on (policies/claude_code/settings.py) ------------
    "window_1m": _optional_flag(
        "the model's 1M window on (true) or off (false); null: as the recording shows",
        "a recorded context above 200k or a [1m] model (simulator/models.py session_facts)",
    ),
    "autocompact.window_cap_tokens": tokens(
        "autocompact computes on at most this window; null: no cap",
        "2.1.x before 2.1.92: 200,000 (claude-code#34202, #36014)",
        optional=True,
    ),
    "autocompact.window_cap_models": _text(
        "regex of the models the window cap applies to; empty: every model",
        "2.1.92: Opus 4.6 only (claude-code#43989)",
    ),
    "autocompact.model_windows": limits(
        "model regex -> that model's own autocompact window (the first match applies)",
        "2.1.221: claude-sonnet-5 967,000 (BaseInfinity/claude-sdlc-harness#520)",
        unit="tokens",
    ),
    "autocompact.env_window_min_tokens": tokens(
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW is clamped to at least this",
        "2.1.221: 100,000 (BaseInfinity/claude-sdlc-harness#520)",
    ),
    "autocompact.env_window_max_tokens": tokens(
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW is clamped to at most this",
        "2.1.221: 1,000,000 (BaseInfinity/claude-sdlc-harness#520)",
    ),
    "autocompact.env_window_disables_below": tokens(
        "a CLAUDE_CODE_AUTO_COMPACT_WINDOW below this turns autocompact off; null: never",
        "2.1.221: 200,000, so 100k-199,999 disables (BaseInfinity/claude-sdlc-harness#520)",
        optional=True,
    ),
    "autocompact.pct_format": choice(
        ("percent", "fraction"),
        "how CLAUDE_AUTOCOMPACT_PCT_OVERRIDE is read: 60 is 60%, or a value <= 1 is the share",
        "percent in every public decompile (claude-code#31806; 2.1.221)",
    ),
    "autocompact.thrashing.enabled": flag(
        "turn autocompact off after repeated rapid compactions",
        "from 2.1.144 (claude-code#60485, #60600, #82131)",
    ),
    "autocompact.thrashing.requests": count(
        "a compaction this many requests or fewer after the previous one is rapid",
        "the client's message: within 3 turns of the previous compact (claude-code#82131)",
        low=1,
        unit="requests",
    ),
    "autocompact.thrashing.times": count(
        "rapid compactions in a row that turn autocompact off",
        "the client's message: 3 times in a row (claude-code#82131)",
        low=1,
        unit="compactions",
    ),
    "autocompact.call_ttl": choice(
        ("request", "5m", "1h"),
        "TTL of the summary call's cache writes; request: the TTL its request uses",
        "every recorded compaction call wrote 5-minute entries (presets from 2.1.92)",
        unit="duration",
    ),
    # -- Claude Code's settings under their real names (policies/claude_code/settings.py) -
    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": _env(
        "compact at this share of the effective window (can only lower the threshold)",
        "Claude Code env var; unset by default (claude-code#31806, #64773)",
    ),
    "CLAUDE_CODE_AUTO_COMPACT_WINDOW": tokens(
        "the window autocompact computes on (or the autoCompactWindow setting); null: unset",
        "Claude Code env var; unset by default (BaseInfinity/claude-sdlc-harness#520)",
        optional=True,
    ),
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": tokens(
        "the output limit, which sizes the summary's reserve; null: unset",
        "Claude Code env var; unset by default (the reserve is min(it, 20,000))",
        optional=True,
    ),
    "DISABLE_AUTO_COMPACT": _env(
        "on (1, true, yes, on): no auto-compaction; /compact still works",
        "Claude Code env var; unset by default",
    ),
    "DISABLE_COMPACT": _env(
        "on (1, true, yes, on): no compaction at all, the user's /compact included",
        "Claude Code env var; unset by default",
    ),
    "autoCompactEnabled": _env(
        "the settings.json switch for auto-compaction",
        "Claude Code setting; true by default",
    ),
}
