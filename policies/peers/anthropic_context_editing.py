"""Anthropic's API context editing: the `clear_tool_uses_20250919` edit, applied server-side.

Facts (Anthropic, "Context editing", platform.claude.com/docs/en/build-with-claude/
context-editing, beta header `context-management-2025-06-27`; DESIGN.md section 5):

* The edit is sent with each request (`context_management.edits`) and applied on the
  server before the prompt reaches the model. The client keeps and sends its full,
  unmodified history; nothing needs to be synchronised with the edited version.
* `trigger`: the edit activates once the prompt's input tokens exceed the threshold
  (default 100,000 input tokens).
* `keep`: how many of the most recent tool use/result pairs are kept (default 3 tool
  uses); the API clears the oldest tool results first, in chronological order, and
  replaces each with a short placeholder telling the model the result was removed.
* `clear_at_least`: a minimum number of tokens each activation must clear; if the API
  cannot clear that much, the edit is not applied (default: none).
* `exclude_tools`: tool names whose uses and results are never cleared.
* `clear_tool_inputs`: also clear the tool-call parameters (default false: results only).
* Prompt caching: clearing invalidates the cached prompt prefix from the cleared content
  on, because the prompt changes there. The documentation advises clearing enough tokens
  (`clear_at_least`) for the invalidation to be worth it: each clearing pays a cache
  write, and later requests read the newly cached prefix.

Modelling choices (ours):

* The edit is a pure function of each request as the client sends it (the server keeps
  no state between requests): the trigger compares the full, unedited prompt (system and
  tools included); when it fires, every tool result but those of the `keep` most recent
  tool uses is replaced by a placeholder of `placeholder_tokens` (the placeholder's text
  is not published) and, with `clear_tool_inputs`, its tool_use too. `keep` counts every
  tool use; `exclude_tools` then spares the excluded ones among the rest. With
  `clear_at_least_tokens` > 0 nothing is cleared unless that many tokens would be freed.
  A rewind that brings the prompt back under the trigger restores the cleared blocks.
* The cache is priced on the edited prompt, as it reaches the model (simulator/
  prompt_cache.py): a request reads the longest cached prefix that is still identical,
  i.e. one that ends before the first block it clears differently from the cached
  request. Once the trigger is passed, each new tool use pushes one more result out of
  the kept 3, so the prompt changes a few blocks from its end on every request: with the
  harness's single message marker at the end of each request, no earlier request's
  entry ends before that point, so each such request reads little beyond the system
  prefix and writes the rest again. That cost is the edit's, and is what this policy
  measures.
* Cache markers are the recorded harness's: the system prefix and the last item
  (`cache.message_marks`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from policies.base import CACHE_TTL, MESSAGE_MARKS, PREFIX_RESETS, ConversationSession
from simulator.params import Declarations, Param, count, flag, names, tokens
from simulator.policy import (
    Emitter,
    Limits,
    Policy,
    PolicyError,
    SessionContext,
    SessionPolicy,
    register,
)

#: Salt of a cleared block's hash: the same block is always cleared to the same item, so a
#: prompt cleared the same way twice has the same prefix hashes.
CLEARED_SALT = 0xC1EA


class ContextEditingSession(ConversationSession):
    """One session's edit state. The edit is a pure function of each request, but
    recomputing it from the whole conversation every request made this policy quadratic
    in the session's length (419 to 4,277 us a request from 1k- to 10k-request sessions,
    issue 16). So it keeps running indices: the tool results in conversation order, the
    blocks the edit clears once it fires (`candidates`, in the order it clears them) with
    what each frees, and the running sums the trigger and `clear_at_least` compare.
    Between rewinds items only append (policies/conversation.py `epoch`), so the
    candidates only grow and, after each request, what is cleared is either all of them
    (the edit fired) or none; the indices are rebuilt from the conversation when that
    does not hold: items left or moved, a candidate stopped counting (a block leaving by
    cache_edits frees nothing more), or a tool use entered after its result."""

    def __init__(self, ctx: SessionContext, params: dict[str, Any]) -> None:
        super().__init__(ctx, params, message_marks=params["cache.message_marks"])
        self.trigger: int = params["trigger_tokens"]
        self.keep = params["keep_tool_uses"]
        self.at_least = params["clear_at_least_tokens"]
        self.exclude = {str(t) for t in params["exclude_tools"]}
        self.clear_inputs = params["clear_tool_inputs"]
        self.placeholder: int = params["placeholder_tokens"]
        #: Blocks shown cleared now -> tokens their placeholder saves, and their sum.
        self.cleared: dict[int, int] = {}
        self.cleared_sum = 0
        #: How many requests the edit was applied to.
        self.applied = 0
        #: The running indices, over `conv.items[:seen]` as of `conv.epoch` `epoch`: the
        #: items (a set), the tool results in order, how many of those are older than the
        #: kept ones already, the blocks the edit clears -> what each frees (and the sum),
        #: and tool uses awaited by an older result (a use entering later: a rebuild).
        self.epoch = -1
        self.seen = 0
        self.present: set[int] = set()
        self.results: list[int] = []
        self.scanned = 0
        self.candidates: dict[int, int] = {}
        self.order: list[int] = []  # the candidates' keys, in order (sliced, not iterated)
        self.candidate_sum = 0
        self.awaited: set[int] = set()

    def raw_tokens(self, key: int) -> int:
        """Tokens of a block as the client sends it (0 once the API stopped counting it)."""
        conv = self.conv
        return 0 if key in conv.edited else conv.tokens[key]

    def threshold_tokens(self) -> int:
        """The smallest unedited prompt the edit clears: it activates once the input
        tokens exceed `trigger_tokens`, so that + 1."""
        return self.trigger + 1

    def limits(self) -> Limits:
        """Clearing at `threshold_tokens` of the unedited prompt (system and tools
        included); the edit refuses nothing (the window)."""
        return Limits(threshold=self.threshold_tokens())

    def saving(self, key: int) -> int:
        raw = self.raw_tokens(key)
        return raw - min(self.placeholder, raw)

    def _stale(self, k: int) -> bool:
        """Whether the running indices no longer describe the conversation."""
        conv = self.conv
        if conv.epoch != self.epoch:
            return True
        candidates, cleared = self.candidates, self.cleared
        if any(b in candidates or b in cleared for b in self.schedule.leave[k]):
            return True  # it stopped counting (cache_edits): it frees less now
        awaited = self.awaited
        return bool(awaited) and not awaited.isdisjoint(conv.items[self.seen :])

    def _rebuild(self) -> None:
        """The indices from the whole conversation; cleared blocks that left it (a
        rewind) are forgotten."""
        conv = self.conv
        self.epoch = conv.epoch
        self.present = set(conv.items)
        for key in [key for key in self.cleared if key not in self.present]:
            self.cleared_sum -= self.cleared.pop(key)
        self.seen = 0
        self.results = []
        self.scanned = 0
        self.candidates = {}
        self.order = []
        self.candidate_sum = 0
        self.awaited = set()
        self._extend()

    def _extend(self) -> None:
        """Take in the items that entered since, and the results that became older than
        the kept ones (in conversation order, each followed by its use)."""
        conv = self.conv
        items = conv.items
        if self.seen < len(items):
            new = items[self.seen :]
            self.present.update(new)
            self.results += [key for key in new if conv.is_tool_result(key)]
            self.seen = len(items)
        older = max(0, len(self.results) - self.keep)
        if self.scanned >= older:
            return
        candidates, order, present = self.candidates, self.order, self.present
        added = 0
        for key in self.results[self.scanned : older]:
            if conv.tool(key) in self.exclude:
                continue
            if key not in candidates:
                candidates[key] = self.saving(key)
                order.append(key)
                added += candidates[key]
            if self.clear_inputs:
                use = conv.link[key]
                if use not in present:
                    self.awaited.add(use)
                elif use not in candidates:
                    candidates[use] = self.saving(use)
                    order.append(use)
                    added += candidates[use]
        self.candidate_sum += added
        self.scanned = older

    def transform(self, k: int, out: Emitter) -> None:
        """The edit of request k: above the trigger (and `clear_at_least`, if set), every
        candidate is cleared; else every cleared block is sent unedited again."""
        conv = self.conv
        rebuilt = self._stale(k)
        if rebuilt:
            self._rebuild()
        else:
            self._extend()
        unedited = conv.total() + self.cleared_sum
        fires = unedited >= self.threshold_tokens() and bool(self.candidates)
        if fires and self.at_least > 0 and self.candidate_sum < self.at_least:
            fires = False
        if not fires:
            self.restore(list(self.cleared))
            return
        candidates, cleared = self.candidates, self.cleared
        if rebuilt:
            self.restore([key for key in cleared if key not in candidates])
        # Cleared blocks are candidates cleared before, so only the rest are new.
        fresh = self.order if rebuilt else self.order[len(cleared) :]
        for key in fresh:
            if key not in cleared:
                raw = self.raw_tokens(key)
                conv.mask(key, min(self.placeholder, raw), CLEARED_SALT, edit="clear_tool_uses")
                saved = candidates[key]
                cleared[key] = saved
                self.cleared_sum += saved
        self.applied += 1

    def restore(self, keys: Iterable[int]) -> None:
        """Send blocks unedited again (the trigger no longer fires)."""
        conv = self.conv
        for key in list(keys):
            conv.clear_override(key)  # a cleared block is in the conversation
            self.cleared_sum -= self.cleared.pop(key)


#: The edit's parameters (simulator/params.py); values in `AnthropicContextEditing.defaults`.
PARAMS: dict[str, Param] = {
    "trigger_tokens": tokens(
        "the edit activates once the prompt's input tokens exceed this",
        "Anthropic context editing: trigger default 100,000 input tokens",
    ),
    "keep_tool_uses": count(
        "most recent tool uses whose results are kept",
        "Anthropic context editing: keep default 3 tool uses",
        unit="tool uses",
    ),
    "clear_at_least_tokens": tokens(
        "the edit is applied only if it clears this many tokens (0: not set)",
        "Anthropic context editing: clear_at_least unset by default",
    ),
    "exclude_tools": names(
        "tools whose uses and results are never cleared",
        "Anthropic context editing: exclude_tools unset by default",
    ),
    "clear_tool_inputs": flag(
        "also clear the tool-call parameters",
        "Anthropic context editing: clear_tool_inputs default false",
    ),
    "placeholder_tokens": tokens(
        "size of the placeholder a cleared result becomes",
        "ours: the placeholder's text is not published",
    ),
    "cache.message_marks": MESSAGE_MARKS,
    "cache.ttl": CACHE_TTL,
    "prefix_resets": PREFIX_RESETS,
}


@register
class AnthropicContextEditing(Policy):
    """`clear_tool_uses_20250919` (module docstring: facts and choices)."""

    name = "anthropic-context-editing"
    version = "1"
    defaults: ClassVar[dict[str, Any]] = {
        "trigger_tokens": 100_000,  # trigger: input_tokens
        "keep_tool_uses": 3,  # keep: tool_uses
        "clear_at_least_tokens": 0,  # clear_at_least: input_tokens (0: not set)
        "exclude_tools": [],
        "clear_tool_inputs": False,
        "placeholder_tokens": 10,  # the placeholder's text is not published
        "cache.message_marks": 1,
        "cache.ttl": "recorded",
        "prefix_resets": True,
    }
    declared: ClassVar[Declarations] = PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p["keep_tool_uses"] < 0 or p["clear_at_least_tokens"] < 0:
            raise PolicyError(
                "anthropic-context-editing: keep_tool_uses and clear_at_least_tokens must be >= 0"
            )
        if isinstance(p["exclude_tools"], str):
            raise PolicyError("anthropic-context-editing: exclude_tools must be a list of names")

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return ContextEditingSession(ctx, self.params)
