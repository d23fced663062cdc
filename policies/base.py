"""What every conversation-keeping policy shares, so a peer harness's policy is only its rule.

A `ConversationSession` keeps the policy's conversation (policies/conversation.py) in step
with the session's history, warms the shared system prefix as the recording found it,
marks the cache the way its harness does, sends one request per recorded request, and
records an overflow when the view no longer fits the model's window. A policy overrides
`transform` (what it does to the conversation before request k) and calls
`summary_call` for the LLM requests it makes itself (summaries, condensations).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from policies.calibration.summary import SUMMARY_CAP, summary_tokens
from policies.conversation import Conversation
from simulator.model import Flag, Kind, Session
from simulator.params import Param, choice, count, flag, tokens
from simulator.policy import Call, Emitter, Policy, PolicySpec, SessionContext, SessionPolicy
from simulator.view import FIVE_MINUTES, ONE_HOUR, Breakpoint, View, chain

#: A shared prefix warmed by other sessions is taken to stay warm: far longer than any TTL.
KEPT_WARM_MS = 10 * 365 * 24 * 3600 * 1000


# -- the parameters every conversation-keeping policy shares (simulator/params.py) -------

CACHE_TTL: Param = choice(
    ("5m", "1h", "recorded"),
    "TTL of the cache entries the policy's requests write",
    "ours: each request's recorded TTL, so the harness's own choice (5m or 1h) is kept",
    unit="duration",
)
PREFIX_RESETS: Param = flag(
    "replay the recording's unlogged rewrites of the system prefix (resets)",
    "the recorded usage shows them (simulator/prefix.py)",
)
WARM_START: Param = flag(
    "the shared system prefix is cached at the first request, as the recording found it",
    "the first recorded request's cache read (simulator/prefix.py `shared`)",
)
SUMMARY_TOKENS: Param = tokens(
    "fixed size of every summary; null: drawn from the calibration with the session's rng",
    "ours: the calibration (policies/calibration/summary.py) fitted to recorded summaries",
    optional=True,
)
SUMMARY_CAP_TOKENS: Param = tokens(
    "largest summary the calibration may draw",
    "Claude Code 2.1.88 reserves min(max output, 20,000) for the summary (DESIGN.md 4)",
    optional=True,
)
MESSAGE_MARKS: Param = count(
    "conversation items at the end of each request that carry a cache marker",
    "the harness's cache_control placement (module docstring)",
    high=4,
    unit="markers",
)


def ttl_ms(setting: str, recorded: int) -> int:
    """ "5m", "1h", or "recorded" (the TTL the recorded request wrote with)."""
    if setting == "5m":
        return FIVE_MINUTES
    if setting == "1h":
        return ONE_HOUR
    if setting == "recorded":
        return recorded
    raise ValueError(f"cache.ttl must be 5m, 1h or recorded, not {setting!r}")


def previous_message_end(ids: list[int], n_prefix: int, roles: list[int], kinds: list[int]) -> int:
    """The view position of the last block of the message before the view's last one, or -1
    where there is none to mark: the walk back over the last message's blocks (the run of
    one role) stops at the prefix and at an item that is no history block, and a thinking
    block is never marked. Where Claude Code's second message marker goes (it marks the
    last two messages: policies/as_recorded.py `_previous_message_mark`)."""
    q = len(ids) - 1
    if q < n_prefix or ids[q] < 0:
        return -1
    role = roles[ids[q]]
    while q >= n_prefix and ids[q] >= 0 and roles[ids[q]] == role:
        q -= 1
    if q < n_prefix or ids[q] < 0 or kinds[ids[q]] == Kind.THINKING:
        return -1
    return q


class MatchedVersion(Policy):
    """A harness's policy that replays each session under the preset of the version it was
    recorded with (`claude-code`, `codex`): version "matched"; parameters given to it
    apply over each session's preset, and its spec names only those (the rest comes from
    each session's preset, so a rebuilt spec must not pin them to the base defaults)."""

    version = "matched"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.given = {key: self.params[key] for key in params}

    def spec(self) -> PolicySpec:
        return PolicySpec(self.name, self.version, tuple(sorted(self.given.items())), self.variant)

    def session(self, ctx: SessionContext) -> SessionPolicy:
        return self.preset_session(ctx, {**self.preset_defaults(ctx.session), **self.given})

    def preset_defaults(self, session: Session) -> dict[str, Any]:
        """Every parameter of the preset that `session`'s recorded version matches."""
        raise NotImplementedError

    def preset_session(self, ctx: SessionContext, params: dict[str, Any]) -> SessionPolicy:
        """The policy's session under `params`."""
        raise NotImplementedError


class ConversationSession(SessionPolicy):
    """Shared mechanics; subclasses implement `transform`.

    `message_marks` is how many of the last items carry a cache marker (Claude Code: 1,
    SWE-agent: 2); `cache` False sends every request uncached (a harness that does not use
    prompt caching).
    """

    def __init__(
        self,
        ctx: SessionContext,
        params: dict[str, Any],
        *,
        message_marks: int = 1,
        cache: bool = True,
    ) -> None:
        self.ctx = ctx
        self.p = params
        self.conv = Conversation(ctx, prefix_resets=bool(params.get("prefix_resets", True)))
        self.schedule = ctx.history.logical
        stripped = (ctx.session.blocks["flags"] & Flag.STRIPPED) != 0
        self.stripped: set[int] = set(np.flatnonzero(stripped).tolist())
        self.hidden: list[int] = ctx.session.blocks["hidden_from"].tolist()
        self.ttl_setting = str(params.get("cache.ttl", "recorded"))
        #: The TTL every request writes with, or None: each its recorded one (`ttl`, read
        #: once here: it is asked twice a request).
        self._ttl_fixed: int | None = (
            ttl_ms(self.ttl_setting, 0) if self.ttl_setting in ("5m", "1h") else None
        )
        self._recorded_ttl = ctx.recorded_ttl
        self.message_marks = message_marks
        self.cache = cache
        self.window = ctx.facts.window
        self.last_total: int | None = None
        self.last_output = 0
        self.since_last: list[int] = []
        self.call = Call("request", "", [], 0)
        #: The system markers with TTL `_marks_ttl`, made once per TTL (`breakpoints`)
        #: until a prefix reset gives the conversation new marks.
        self._system_of: list[int] | None = None
        self._marks_ttl = 0
        self._system: list[Breakpoint] = []
        self._system_last = -1
        self.warm_start = bool(params.get("warm_start", True))
        self.warm_done = not self.warm_start
        fixed = params.get("summary_tokens")
        #: A fixed summary size (the `summary_tokens` parameter), else drawn (summary_size).
        self.fixed_summary: int | None = None if fixed is None else int(fixed)
        cap = params.get("summary_cap_tokens")
        self.summary_cap = SUMMARY_CAP if cap is None else int(cap)

    # -- the request ------------------------------------------------------------------

    def ttl(self, k: int) -> int:
        fixed = self._ttl_fixed
        if fixed is not None:
            return fixed
        if self.ttl_setting != "recorded":
            return ttl_ms(self.ttl_setting, 0)  # an unknown setting: its error
        return self._recorded_ttl[k]

    def breakpoints(self, view: View, ttl: int, *, fork: bool = False) -> list[Breakpoint]:
        """The system markers, then markers on the last `message_marks` items (a fork,
        such as a summary request, marks the item before its own prompt)."""
        last = len(view.ids) - (2 if fork else 1)
        conv = self.conv
        if conv.marks is not self._system_of or ttl != self._marks_ttl:
            self._system_of, self._marks_ttl = conv.marks, ttl
            self._system = [Breakpoint(p, ttl) for p in conv.marks]
            self._system_last = max(conv.marks, default=-1)
        system = self._system
        if self._system_last > last:
            marks = [m for m in system if m.position <= last]
        else:
            marks = list(system)
        for p in range(max(last - self.message_marks + 1, conv.n_prefix), last + 1):
            if not marks or marks[-1].position < p:
                marks.append(Breakpoint(p, ttl))
        return marks[-4:]

    def sync(self, k: int) -> list[int]:
        """Bring the conversation up to request k; returns the blocks that entered."""
        conv = self.conv
        conv.reset_prefix(k)
        leaving = self.schedule.leave[k]
        if leaving:  # most requests only append
            rewound: set[int] = set()
            for b in leaving:
                if b in self.stripped and self.hidden[b] == k:
                    if conv.index_of(b) is not None:
                        conv.edit_out(b)  # still sent, no longer counted: prefix unchanged
                else:
                    rewound.add(b)
            conv.remove_blocks(rewound)
        entering: list[int] = self.schedule.enter[k]
        self.on_enter(entering)
        conv.append(entering)
        self.since_last += entering
        return entering

    def on_enter(self, blocks: list[int]) -> None:
        """Hook: decide about blocks before they join the conversation (default: none)."""

    def transform(self, k: int, out: Emitter) -> dict[str, bool] | None:
        """Hook: the policy's rule, applied before request k is sent (default: none); may
        return flags for the request's row (e.g. a breaker trip)."""

    def blocking_limit(self) -> int:
        """The view above which request k is an overflow (default: the model's window; a
        policy whose client refuses to send earlier states its own)."""
        return self.window

    def estimate(self, k: int) -> int:
        """The harness-side token estimate most agents use: the last request's usage
        (input + output) plus length/4 of what was added since (the previous response is
        in that output already)."""
        conv = self.conv
        if self.last_total is None:
            return conv.total()
        newer = 0
        origin = conv.origin
        for key in self.since_last:
            if key < 0 or origin[key] != k - 1:
                newer += conv.estimate_chars(key) // 4
        return self.last_total + self.last_output + newer

    def step(self, k: int, out: Emitter) -> None:
        """The one step every conversation policy takes: bring the conversation up to
        request k, warm the shared prefix, apply the policy's rule, send the view (an
        overflow above the blocking limit)."""
        self.sync(k)
        if not self.warm_done or (self.warm_start and self.conv.prefix.warm_now):
            self.warm_once(out, k)
        flags = self.transform(k, out) or {}
        view = self.conv.sync()
        if view.total > self.blocking_limit():
            flags["overflow"] = True
        self.send(k, out, view, flags)

    def warm_once(self, out: Emitter, k: int) -> None:
        """Before the first request: the shared prefix is cached as the recording found it,
        and a fork's context as its parent's last call wrote it (`Session.fork`).
        After an idle gap longer than the TTL: the part of it other sessions kept warm, as
        the recording's read showed (simulator/prefix.py `PrefixState.warm_now`): a fact
        about other sessions, so every policy sees it as as-recorded does."""
        if not self.warm_done:
            view = self.conv.sync()
            for position in self.conv.warm:
                out.warm(view, position, KEPT_WARM_MS)
            fork = self.ctx.session.fork
            at = None if fork is None else self.conv.index_of(fork.block)
            if fork is not None and at is not None:  # a fork: its parent's cache
                position = self.conv.n_prefix + at
                out.written(view, position, fork.sent_ms, fork.ttl_ms, fork.end_ms)
            self.warm_done = True
        if self.warm_start and self.conv.prefix.warm_now:
            view = self.conv.sync()
            ttl = self.ttl(k)
            for position in self.conv.prefix.warm_now:
                out.warm(view, position, ttl)

    def send(self, k: int, out: Emitter, view: View, flags: dict[str, bool]) -> None:
        """Emit recorded request k with `view`; its usage is what the next estimate
        starts from."""
        call = self.call
        call.breakpoints = self.breakpoints(view, self.ttl(k)) if self.cache else []
        output = self.ctx.output[k]
        call.output_tokens = output
        call.flags = flags
        call.cached = self.cache
        conv = self.conv
        if conv.pending_edits:  # what the stages changed without a call, on the record
            for edit in conv.pending_edits:
                out.edit(edit)
            conv.pending_edits = []
        out.call(view, call)
        conv.sent_items = len(conv.items)
        self.last_total = view.total
        self.last_output = output
        self.since_last = []

    # -- the policy's own LLM calls ---------------------------------------------------

    def summary_call(
        self,
        out: Emitter,
        k: int,
        items: Iterable[int],
        output_tokens: int,
        *,
        stage: str,
        prompt_tokens: int = 500,
        with_prefix: bool = True,
        cached: bool = True,
    ) -> View:
        """Send an LLM request over `items` (plus the policy's prompt) and price it.

        `with_prefix` False sends neither tools nor system prompt (opencode's compaction):
        a different prefix, so a full cache miss. `cached` False marks nothing (OpenHands'
        condenser does not use the prompt cache).
        """
        conv = self.conv
        if with_prefix:
            view = conv.sync().copy()
            view.truncate(conv.n_prefix)
        else:
            view = View(chain(self.ctx.root, 0xA11E))
        view.extend((key if key >= 0 else -1, *conv.sent(key)) for key in items)
        view.append(-1, chain(self.ctx.root, zlib.crc32(stage.encode())), prompt_tokens)
        marks = self.breakpoints(view, self.ttl(k), fork=True) if cached and with_prefix else []
        if cached and not with_prefix and len(view.ids) > 1:
            marks = [Breakpoint(len(view.ids) - 2, self.ttl(k))]
        out.call(view, Call("compaction", stage, marks, output_tokens, cached=cached))
        return view

    def summary_size(self, pre_tokens: int) -> int:
        """Tokens of a summary of `pre_tokens`: the fixed size if one is set, else a draw
        from the calibration (policies/calibration) with the session's seeded rng."""
        if self.fixed_summary is not None:
            return self.fixed_summary
        return summary_tokens(pre_tokens, self.ctx.rng, cap=self.summary_cap)

    def tokens(self, keys: Iterable[int]) -> int:
        conv = self.conv
        return sum(conv.sent(key)[1] for key in keys)

    def user_turn_starts(self) -> list[int]:
        """Indexes of items that start a human turn (a user text block, not a tool
        result): the turn boundaries most harnesses count and cut at."""
        conv = self.conv
        return [
            i for i, key in enumerate(conv.items) if key >= 0 and conv.flags[key] & int(Flag.HUMAN)
        ]
