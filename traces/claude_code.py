"""Reader for Claude Code transcripts (JSONL, versions 1.0.x to 2.1.x).

Facts this reader relies on (DESIGN.md section 2):

* One API call is one ``message.id``, written as one line per content block, each line
  repeating the usage. Lines are deduplicated by id; input-side usage is taken from the
  first line, ``output_tokens`` is the maximum over the lines (2.1.x logs a streaming
  snapshot) and is replaced by the tokenizer's count of the response when implausibly
  small (see traces/builder.py).
* ``message.model == "<synthetic>"`` lines are client-made errors: no request, no blocks.
* The conversation is a tree (``uuid`` / ``parentUuid``). The context of a request is the
  path from the root to the request's first line. A rewind moves to another branch: the
  blocks of the abandoned branch are tombstoned (``hidden_from``) from that request on.
* Parallel tool calls: one response's tool_use lines and their results form a small tree
  (each result hangs from its own tool_use line), so the chain from a leaf can miss some;
  they are spliced back in as Claude Code's own loader does, and each response's results
  are laid in the order of its tool_use blocks, as the request lists them
  (`_SessionAssembler._with_parallel_calls`).
* Compaction roots: 2.x writes a ``system`` line with ``subtype: compact_boundary``
  (``parentUuid`` null, ``logicalParentUuid`` set) followed by an ``isCompactSummary``
  user line; 1.0.x writes only the summary line, with a null ``parentUuid``. The logical
  history runs on through the root (to ``logicalParentUuid``, or in 1.0.x to the previous
  main-chain line); what the recording really sent stops at the root, so blocks before it
  get ``compacted_at`` and the summary is an ARTIFACT block. A compaction event is at the
  first request sent after the root: when a file writes the root before the last turn it
  preserves (a compaction made on resuming another process's session), that turn's request
  keeps the context it was sent with (`_SessionAssembler._relinked_segments`).
* Triggers: 2.x names them in ``compactMetadata``; 1.0.x does not, but a manual /compact
  leaves a ``<command-name>/compact</command-name>`` user line right after the summary, so
  a 1.0.x compaction is "manual" with that line and "unknown" (in practice auto) without.
* Subagents: inline ``isSidechain`` lines (1.0.x) grouped by their sidechain root,
  ``agent-*.jsonl`` files beside the session (2.0.x) or under ``<session>/subagents/``
  (2.1.x) become sessions of their own whose parent is the main session.
* Copies: every call is counted once over the import unit (`_Unit`). Fork files
  (``agent-acompact-*``, ``agent-aside_question-*``) and resumed session files begin with a
  copy of calls another file holds; a copy lays its blocks as context, never a request. An
  acompact file's own call is the parent's compaction call (``CompactionEvent.call_usage``);
  a resumed file continues the file it copied as one session.
* Entry types are not a gate: an entry that carries no message is metadata, whatever its
  type (`_FileReader._entry`).
* Restarts: a request sent by another client process than the request before it is in
  `Session.restarted_at` (`_FileReader._process_evidence`, `_restarts`).
* A line that cannot be parsed (under --lenient) becomes a placeholder node in the tree, so
  a child whose parent was on that line still finds its place: an unknown ``parentUuid``
  resolves to the latest placeholder before the child, else to the previous line.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from simulator.model import CompactionEvent, Flag, ForkContext, Kind, Role, Session, Trace
from simulator.view import FIVE_MINUTES, ONE_HOUR
from traces.bounds import quoted, ts_in_range, usage_problem
from traces.builder import (
    IMAGE_TOKENS,
    Hasher,
    RecordedUsage,
    SessionBuilder,
    add_counts,
    hasher_for,
    unit_trace,
    usage_iterations,
)
from traces.errors import Problems
from traces.jsonl import UNREADABLE, json_lines
from traces.source import ImportUnit
from traces.tokens import count_tokens

#: The line a /compact command leaves in the transcript (both 1.0.x and 2.x).
COMPACT_COMMAND = "<command-name>/compact</command-name>"

#: Entry types known to carry nothing the API was sent (metadata, UI state). Not a gate:
#: any other type without a message is metadata too (counted as `lines_metadata_unlisted`).
METADATA_TYPES = frozenset(
    {
        "summary",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "content-replacement",
        "custom-title",
        "tag",
        "agent-name",
        "pr-link",
        "last-prompt",
        "attachment",
        "x-ai-title",
        "mode",
    }
)
TREE_TYPES = frozenset({"user", "assistant", "system"})
#: The hook names a `SessionStart` hook's attachment line carries when a new client process
#: started on the session or on a copy of it (`_FileReader._process_evidence`).
START_HOOKS = frozenset({"SessionStart:resume", "SessionStart:fork"})

#: Tools whose results could be produced again by running the tool again.
REGENERABLE_TOOLS = frozenset(
    {
        "Read",
        "Grep",
        "Glob",
        "LS",
        "Bash",
        "BashOutput",
        "WebFetch",
        "WebSearch",
        "NotebookRead",
        "PowerShell",
    }
)
READ_TOOLS = frozenset({"Read", "NotebookRead"})
WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})

#: Characters per cl100k token of a file as the Read tool shows it (each line behind a
#: 6-wide number and an arrow): 3.02 over the 425 Read results of ../shared/traces.
NUMBERED_CHARS_PER_TOKEN = 3.02
#: The characters the Read tool puts before each line.
LINE_PREFIX_CHARS = 7

#: Models that keep earlier turns' thinking in the context. For the others the API drops
#: thinking blocks of previous assistant turns once a new user turn starts; the recorded
#: usage shows it (Sonnet 4.5 sessions shrink by their last turn's thinking at a new human
#: message, Opus 4.5 sessions do not).
PRESERVES_THINKING = re.compile(r"claude-(opus-4-[5-9]|opus-[5-9]|sonnet-[5-9]|haiku-[5-9])")

#: The counts of an Anthropic usage object, in the order they are checked.
_USAGE_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)
_PATH_READ = int(Flag.PATH_READ)
_PATH_WRITE = int(Flag.PATH_WRITE)
_REGENERABLE = int(Flag.REGENERABLE)
_ERROR = int(Flag.ERROR)

_PARENT_RE = re.compile(rb'"parentUuid"\s*:\s*"([^"]+)"')
_SIDECHAIN_RE = re.compile(rb'"isSidechain"\s*:\s*true')


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_ts(value: Any) -> int | None:
    """ISO-8601 timestamp to milliseconds since the epoch (None when absent, invalid or
    outside the plausible range of traces/bounds.py). A time without a zone is UTC, never the
    machine's zone: the compiled bytes must not change with TZ (issue 17, R12)."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ms = int(dt.timestamp() * 1000)
    except (ValueError, OverflowError):
        return None
    return ms if ts_in_range(ms) else None


@dataclass(slots=True)
class _Node:
    """One line of the conversation tree (slots: one per line, tens of thousands a file)."""

    uuid: str
    parent: str | None
    line: int
    kind: str  # entry type, or "broken"
    sidechain: bool
    entry: dict[str, Any] | None
    logical_parent: str | None = None
    compaction_root: bool = False
    summary: bool = False  # isCompactSummary
    message_id: str | None = None
    ts: int | None = None
    #: `_content_blocks(entry)`, once asked for (`_content_of`; `content_read` then set).
    content: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    content_read: bool = field(default=False, repr=False, compare=False)


def _content_of(node: _Node) -> list[dict[str, Any]] | None:
    """The node's content blocks, worked out once: the assembler asks for them up to four
    times per line (parallel-call index, tool-result ranks, blocks)."""
    if not node.content_read:
        node.content = _content_blocks(node.entry) if node.entry is not None else None
        node.content_read = True
    return node.content


@dataclass(slots=True)
class _Request:
    message_id: str
    first_node: str
    ts: int
    model: str
    usage: RecordedUsage | None
    output: int
    nodes: list[str] = field(default_factory=list)
    #: When the response's first line was written (`ts` is when the request left).
    line_ts: int = 0
    #: When its last line was written: the response was complete.
    end_ts: int = 0


class _FileReader:
    """Parses one JSONL file into tree nodes and requests."""

    def __init__(self, label: str, data: bytes, problems: Problems, *, whole_sidechain: bool):
        self.label = label
        self.problems = problems
        self.whole_sidechain = whole_sidechain
        self.nodes: dict[str, _Node] = {}
        self.order: list[str] = []
        self.requests: dict[str, _Request] = {}
        self.request_order: list[str] = []
        self.stats: dict[str, int] = {"lines": 0, "lines_metadata": 0}
        self.version = ""
        self.session_id = ""
        #: The session id of the last conversation line: a resumed file's own id (its copied
        #: lines may still carry the id of the session it resumes).
        self.last_session_id = ""
        #: Lines at which a client process other than the one before wrote the file
        #: (`_process_evidence`), ascending.
        self.process_starts: list[int] = []
        self._process_version = ""
        #: cl100k tokens of the first whole skill listing the client announced (`_listing`),
        #: -1 before any.
        self.skill_listing = -1
        self._parse(data)

    def _report(self, line: int, category: str, message: str) -> None:
        self.problems.report(self.label, line, category, message)

    def _parse(self, data: bytes) -> None:
        for lineno, raw, obj in json_lines(data, self._report):
            self.stats["lines"] += 1
            if obj is UNREADABLE:
                self._placeholder(lineno, raw)
            elif not isinstance(obj, dict):
                self._report(lineno, "wrong-type", "line is not a JSON object")
            else:
                self._entry(lineno, obj)

    def _placeholder(self, lineno: int, raw: bytes) -> None:
        m = _PARENT_RE.search(raw[:4096])
        parent = m.group(1).decode("ascii", "replace") if m else None
        uuid = f"<line {lineno}>"
        node = _Node(uuid, parent, lineno, "broken", bool(_SIDECHAIN_RE.search(raw[:4096])), None)
        self.nodes[uuid] = node
        self.order.append(uuid)

    def _entry(self, lineno: int, obj: dict[str, Any]) -> None:
        """One parsed line: a conversation line, or metadata decided by its structure.

        Claude Code adds entry types with nearly every release (2.1.8x+ writes `ai-title`,
        `permission-mode`, `file-history-delta`, `worktree-state`, `atis-latch`,
        `bridge-session` and more: 10 types, 5,379 lines in ../shared/traces/claude-code that
        no list of ours named; each resume appends `mode` and `permission-mode` lines again,
        anthropics/claude-code#69013). A list of known types is therefore not the gate: an
        entry of another type that holds no `message` has no bearing on the context and is
        counted as metadata (`lines_metadata`, and `lines_metadata_unlisted` for types not in
        METADATA_TYPES);
        one with a `uuid` stays in the tree as a pass-through node, so that a child naming it
        as parent keeps its place. Only an unknown type that carries a `message` (context
        this reader cannot place) is a problem (`unknown-type`).
        """
        kind = obj.get("type")
        if not isinstance(kind, str):  # a list or object is no type (and is unhashable: R01)
            kind = None
        self._process_evidence(lineno, obj, kind)
        if kind in TREE_TYPES:
            self._tree_node(lineno, obj, str(kind), pass_through=False)
            return
        listed = kind in METADATA_TYPES
        if not listed and isinstance(obj.get("message"), dict):
            if not isinstance(kind, str):
                self._report(lineno, "missing-field", "entry has no string 'type'")
            else:
                self._report(lineno, "unknown-type", f"unknown entry type {quoted(kind)}")
            return
        self.stats["lines_metadata"] += 1
        if not listed:
            self.stats["lines_metadata_unlisted"] = self.stats.get("lines_metadata_unlisted", 0) + 1
        if isinstance(obj.get("uuid"), str):
            self._tree_node(lineno, obj, str(kind or "metadata"), pass_through=True)

    def _process_evidence(self, lineno: int, obj: dict[str, Any], kind: str | None) -> None:
        """Note the line if a new client process wrote it (`process_starts`).

        A process writes its own version on every line it writes, so a line whose `version`
        differs from the previous versioned line's was written by another process: certain
        (../shared/traces/claude-code: 5 changes in 4 files, flutter-docker 5e12a303 2.1.226
        -> 2.1.228 -> 2.1.232, wakil 0062da63 and 5bea7345, git-sync ec48fae0). A process
        started on the same version shows itself only by the `SessionStart` hooks it runs,
        when the user has any: their attachment lines are named `SessionStart:<source>`,
        and the documented sources are startup, resume, clear, compact and fork
        (thedotmack/claude-mem#3950, Gentleman-Programming/engram#75). `resume` fires when a
        process starts on an existing session (`claude --resume`/`--continue`), `fork`
        when it starts on a copy of one (`--fork-session`: a new file; in ../shared both
        forks, flutter-docker aba9151e and wakil 31220796, log it exactly where the file's
        own calls begin after the copied ones); `startup` is a new session, `clear` and
        `compact` fire inside a running process. ../shared holds 19 resume hook lines in 5
        files, 3 of them on one version throughout (git-sync 124cf89f, c6533991, ff0a7d3f).
        Nothing else a resumed process writes first tells it apart: the `last-prompt`,
        `mode` and `permission-mode` lines it writes (anthropics/claude-code#69013) a
        running process writes too (5e12a303: 98 `mode` lines, 2 resumes).
        """
        version = obj.get("version")
        if isinstance(version, str) and version:
            if self._process_version and version != self._process_version:
                self.process_starts.append(lineno)
            self._process_version = version
        if kind == "attachment":
            attachment = obj.get("attachment")
            self._listing(attachment)
            hook = attachment.get("hookName") if isinstance(attachment, dict) else None
            started = isinstance(hook, str) and hook in START_HOOKS
            if started and self.process_starts[-1:] != [lineno]:
                self.process_starts.append(lineno)

    def _listing(self, attachment: Any) -> None:
        """The size of the first whole skill listing the file logs (`Session.skill_listing`).

        2.1.2xx announces the skills in an attachment of the first prompt (type
        `skill_listing`, `isInitial` true, its text in `content`; later ones with
        `isInitial` false are deltas), and after a compaction does not send it again
        (policies/claude_code/autocompact.py). Its size is the user's: the skills they have
        installed, their descriptions cut by the client to 1% of the window
        (claude-code#68135). In ../shared/traces/claude-code 124 files log one, 679-9,415
        cl100k tokens (entirecontext's 141 skills: 9,415, about 13k in Opus 4.6's tokens).
        Only the count is kept, never the text."""
        if self.skill_listing >= 0 or not isinstance(attachment, dict):
            return
        content = attachment.get("content")
        initial = attachment.get("isInitial") is True
        if attachment.get("type") == "skill_listing" and initial and isinstance(content, str):
            self.skill_listing = count_tokens(content)

    def _tree_node(
        self, lineno: int, obj: dict[str, Any], kind: str, *, pass_through: bool
    ) -> None:
        uuid = obj.get("uuid")
        parent = obj.get("parentUuid")
        if not isinstance(uuid, str) or not (parent is None or isinstance(parent, str)):
            if pass_through:
                return
            self._report(lineno, "missing-field", "entry has no valid 'uuid'/'parentUuid'")
            return
        if uuid in self.nodes:
            if not pass_through:
                self._report(lineno, "duplicate-id", f"uuid {uuid[:8]}… appears twice")
            return
        get = obj.get
        version = get("version")
        if isinstance(version, str):
            self.version = version
        session_id = get("sessionId")
        if isinstance(session_id, str):
            self.session_id = self.session_id or session_id
            self.last_session_id = session_id
        sidechain = bool(get("isSidechain")) or self.whole_sidechain
        node = _Node(uuid, parent, lineno, kind, sidechain, None if pass_through else obj)
        stamp = get("timestamp")
        node.ts = parse_ts(stamp)
        bad_time = node.ts is None and isinstance(stamp, str)
        if bad_time and not pass_through and kind != "assistant":  # (assistant: below)
            self._report(lineno, "bad-timestamp", "timestamp is not an ISO-8601 time in 2020-2100")
        if kind == "system" and obj.get("subtype") == "compact_boundary":
            node.compaction_root = True
            lp = obj.get("logicalParentUuid")
            node.logical_parent = lp if isinstance(lp, str) else None
            node.entry = obj
        elif kind == "user" and obj.get("isCompactSummary"):
            node.summary = True
            if parent is None:  # 1.0.x: the summary is the root
                node.compaction_root = True
        elif kind == "assistant" and not self._assistant(lineno, obj, node):
            node.entry = None  # synthetic or unusable: a pass-through node
        self.nodes[uuid] = node
        self.order.append(uuid)

    def _assistant(self, lineno: int, obj: dict[str, Any], node: _Node) -> bool:
        msg = obj.get("message")
        if not isinstance(msg, dict):
            self._report(lineno, "wrong-type", "assistant 'message' is not an object")
            return False
        model = msg.get("model")
        if model == "<synthetic>" or obj.get("isApiErrorMessage"):
            self.stats["lines_synthetic"] = self.stats.get("lines_synthetic", 0) + 1
            return False
        mid = msg.get("id") or obj.get("requestId")
        if not isinstance(mid, str) or not isinstance(model, str):
            self._report(lineno, "missing-field", "assistant line has no message id or model")
            return False
        usage = self._usage(lineno, msg.get("usage"))
        output = 0
        if usage is not None:
            output = usage.output
        node.message_id = mid
        req = self.requests.get(mid)
        if req is None:
            line_ts = node.ts
            if line_ts is None:
                self._report(
                    lineno, "bad-timestamp", "assistant line has no timestamp in 2020-2100"
                )
                return False
            # The line is written as the response streams; the request left when the line
            # before it (the prompt or tool result it answers) was written.
            parent = self.nodes.get(node.parent) if node.parent else None
            sent = parent.ts if parent is not None else None
            ts = sent if sent is not None and sent <= line_ts else line_ts
            req = _Request(mid, node.uuid, ts, model, usage, output, line_ts=line_ts)
            self.requests[mid] = req
            self.request_order.append(mid)
        else:
            req.output = max(req.output, output)
            if req.usage is None and usage is not None:
                req.usage = usage
        if node.ts is not None:
            req.end_ts = max(req.end_ts, node.ts)
        req.nodes.append(node.uuid)
        return True

    def _usage(self, lineno: int, usage: Any) -> RecordedUsage | None:
        if usage is None:
            self._report(lineno, "missing-usage", "assistant line has no usage")
            return None
        if not isinstance(usage, dict):
            self._report(lineno, "wrong-type", "usage is not an object")
            return None
        get = usage.get
        values: list[int] = []
        for name in _USAGE_FIELDS:
            v = get(name, 0)
            if v is None:
                v = 0
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                self._report(lineno, "wrong-type", f"usage.{name} is not a count: {quoted(v)}")
                return None
            values.append(v)
        inp, read, created, out = values
        w5, w1 = created, 0
        split = get("cache_creation")
        if isinstance(split, dict):
            a = split.get("ephemeral_5m_input_tokens", 0) or 0
            b = split.get("ephemeral_1h_input_tokens", 0) or 0
            if not _is_count(a) or not _is_count(b):
                self._report(lineno, "wrong-type", "usage.cache_creation split is not two counts")
                return None
            if a + b == created:
                w5, w1 = a, b
        problem = usage_problem(inp, read, w5, w1, out)
        if problem is not None:
            self._report(lineno, "implausible-usage", problem)
            return None
        return RecordedUsage(
            inp,
            read,
            w5,
            w1,
            out,
            iterations=usage_iterations(usage),
        )


def _content_blocks(entry: dict[str, Any]) -> list[dict[str, Any]] | None:
    msg = entry.get("message")
    if not isinstance(msg, dict):
        return None
    content = msg.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [c for c in content if isinstance(c, dict)]
    return None


def _text_of(value: Any) -> tuple[str, int]:
    """Text of a tool_result content, and the number of images inside it."""
    if isinstance(value, str):
        return value, 0
    if isinstance(value, list):
        texts, images = [], 0
        for part in value:
            if isinstance(part, dict):
                if part.get("type") == "image":
                    images += 1
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
        return "\n".join(texts), images
    if value is None:
        return "", 0
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode(), 0


def _tool_path(tool_input: Any) -> str | None:
    if not isinstance(tool_input, dict):
        return None
    for key in ("file_path", "notebook_path", "path"):
        v = tool_input.get(key)
        if isinstance(v, str) and v:
            return v
    return None


class _SessionAssembler:
    """Walks requests in order and lays the blocks of their context paths into a builder."""

    def __init__(
        self,
        reader: _FileReader,
        builder: SessionBuilder,
        node_ids: set[str],
        request_index: dict[str, int],
        copied_roots: frozenset[str] = frozenset(),
    ):
        self.r = reader
        self._request_index = request_index
        #: Compaction roots copied from an earlier file of the unit: that file records them.
        self.copied_roots = copied_roots
        self._pending: tuple[int, str, int, int] | None = None
        self.thinking: list[int] = []  # thinking blocks in the current context
        self.strip_thinking = False
        self.b = builder
        self.node_ids = node_ids
        self.path: list[str] = []
        self.path_pos: dict[str, int] = {}
        self.node_blocks: dict[str, list[int]] = {}
        self.msg_index: dict[str, int] = {}
        self.uses: dict[str, tuple[str, str | None]] = {}  # tool_use id -> (tool, path)
        #: The first line of the response of the last call a fork copied (`fork_from`):
        #: the blocks laid before it are that call's input, which its cache marker wrote.
        self.fork_node: str | None = None
        self._resolve_parents()
        self._index_parallel_calls()

    def _resolve_parents(self) -> None:
        """Parent of each node in the logical tree (see the module docstring)."""
        last_placeholder: str | None = None
        previous: str | None = None
        parents: dict[str, str | None] = {}
        #: Each compaction root's fallback parent: the line before it in the file.
        before_root: dict[str, str | None] = {}
        for uuid in self.r.order:
            if uuid not in self.node_ids:
                continue
            node = self.r.nodes[uuid]
            parent = node.parent
            if node.compaction_root:
                lp = node.logical_parent
                parent = lp if lp in self.node_ids else previous
                before_root[uuid] = previous
            elif parent is not None and parent not in self.r.nodes:
                parent = last_placeholder or previous
            elif parent is not None and parent not in self.node_ids:
                parent = None  # parent is in another session (a sidechain's root)
            parents[uuid] = parent
            if node.kind == "broken":
                last_placeholder = uuid
            previous = uuid
        self.parents = parents
        #: Parents as they were when a request sent before a compaction left, for the
        #: requests whose first line is in `sent_before` (see `_relinked_segments`).
        self.sent_parents = dict(parents)
        self.sent_before: set[str] = set()
        self._relinked_segments(before_root)

    def _relinked_segments(self, before_root: dict[str, str | None]) -> None:
        """Undo the loop a compaction written after the messages it preserves makes.

        From 2.1.2xx a compaction keeps the last turn verbatim after the summary
        (`compactMetadata.preservedSegment`: head, the last pre-compaction request's
        response, to tail) and the boundary's `logicalParentUuid` is that tail. In a live
        session the segment is written before the boundary, so the tail does precede it.
        A file that compacts as it resumes another process's session (../shared
        flutter-docker aba9151e, 2.1.226, resuming 390ab778 of 2.1.224, preTokens 213,002)
        writes the boundary first and re-links the copied segment under the summary: the
        logical parent then descends from the boundary itself. Read as written, the head's
        request (390ab778's last call, 204,665 tokens sent at 11:48, 6 minutes before the
        boundary) became the first compacted request, and the segment a loop. The original
        shows what happened: the head's parent there is the line before the boundary, and
        the next call (61,596 tokens) is the first sent after the compaction. So such a root
        hangs from the line before it, like one whose logical parent is absent, and a
        request whose first line lies in the segment keeps the context it was sent with:
        the segment hangs from that same line for it (`sent_parents`), without the summary.
        """
        for root, fallback in before_root.items():
            segment: list[str] = []
            uuid = self.parents[root]
            seen = {root}
            while uuid is not None and uuid not in seen:
                seen.add(uuid)
                segment.append(uuid)
                uuid = self.parents.get(uuid)
            if uuid != root:
                continue  # the logical parent precedes the root: the live-session layout
            self.parents[root] = fallback
            self.sent_parents[root] = fallback
            for node in segment:
                if self.r.nodes[node].summary:
                    continue
                self.sent_before.add(node)
                parent = self.parents.get(node)
                n = self.r.nodes.get(parent) if parent is not None else None
                if n is not None and (n.summary or n.compaction_root):
                    self.sent_parents[node] = fallback
            self.r.stats["compactions_relinked"] = self.r.stats.get("compactions_relinked", 0) + 1

    def _index_parallel_calls(self) -> None:
        """What `_with_parallel_calls` needs: each message id's assistant lines, each
        assistant line's tool-result lines, and the order the tool_use blocks were written."""
        self.siblings: dict[str, list[str]] = {}
        self.results_of: dict[str, list[str]] = {}
        self.use_order: dict[str, int] = {}
        self._ranks: dict[str, int] = {}
        for uuid in self.r.order:
            if uuid not in self.node_ids:
                continue
            node = self.r.nodes[uuid]
            content = _content_of(node)
            if node.kind == "assistant" and node.message_id:
                self.siblings.setdefault(node.message_id, []).append(uuid)
                for c in content or []:
                    use_id = c.get("id")
                    if c.get("type") in ("tool_use", "server_tool_use") and isinstance(use_id, str):
                        self.use_order.setdefault(use_id, len(self.use_order))
            elif node.kind == "user" and any(c.get("type") == "tool_result" for c in content or []):
                parent = self.parents.get(uuid)
                if parent is not None:
                    self.results_of.setdefault(parent, []).append(uuid)

    def _with_parallel_calls(self, added: list[str], before_line: int | None) -> list[str]:
        """`added` with the lines of parallel tool calls that the parent chain misses, and
        each response's tool results in the order of its tool_use blocks.

        The client streams one assistant line per content block, all with the response's
        message id; each tool result's parent is the line of its own tool_use, so N parallel
        calls make a tree and the chain from a leaf keeps one branch (a Task call's progress
        lines split it too: ../shared denubis a0adff31, 2.1.31, lost one of two Task calls and
        its 6k-character result, whose tokens the anchoring then gave to the other). The API
        was sent all of them: Claude Code's own loader splices the missing siblings and their
        results back in after the chain's last line of that message id, each sorted by time
        (`recoverOrphanedParallelToolResults`, sessionStorage.ts, in the 2.1.x decompiles),
        and so does this reader, taking only lines written before the request.

        Order: results are written as their tools finish, but the request lists them in the
        order of their tool_use blocks, and the message cache marker stays on the one that
        finished last. Over ../shared/traces/claude-code, of 74 requests whose results came
        back out of tool_use order, 45 sent more than 50 uncached input tokens (37 of 931
        with results in order, 220 of 8,762 with one result); where the last to finish is
        also the last tool_use the uncached input is 0-14 tokens, elsewhere it is about the
        results that follow the last to finish in tool_use order (their JSON characters /
        1.5-3.5 in 52 of the 61 cases with any). So results are laid in tool_use order, and
        as-recorded's marker (policies/as_recorded.py) lands where the recorded uncached
        input puts it: after the last to finish.
        """
        laid = self.path_pos
        chosen = set(added)
        anchors: dict[str, str] = {}
        for uuid in added:
            node = self.r.nodes[uuid]
            if node.kind == "assistant" and node.message_id:
                anchors[node.message_id] = uuid

        def missing(uuid: str) -> bool:
            line = self.r.nodes[uuid].line
            if before_line is not None and line >= before_line:
                return False
            return uuid not in laid and uuid not in chosen

        inserts: dict[str, list[str]] = {}
        for mid, anchor in anchors.items():
            group = self.siblings.get(mid, [])
            orphans = [u for u in group if missing(u)]
            results = [t for u in group for t in self.results_of.get(u, []) if missing(t)]
            if not orphans and not results:
                continue
            orphans.sort(key=self._line_time)
            results.sort(key=self._line_time)
            inserts[anchor] = [*orphans, *results]
            chosen.update(inserts[anchor])
            self.r.stats["parallel_lines_recovered"] = self.r.stats.get(
                "parallel_lines_recovered", 0
            ) + len(inserts[anchor])
        if inserts:
            spliced: list[str] = []
            for uuid in added:
                spliced.append(uuid)
                spliced.extend(inserts.get(uuid, []))
            added = spliced
        return self._results_in_use_order(added)

    def _turn_end(self, pos: int) -> int:
        """The end of the parallel calls the path line at `pos` belongs to: a request that
        hangs from one tool_use or result of a response holds all of them (the lines
        `_with_parallel_calls` laid after it are no rewind)."""
        path = self.path
        node = self.r.nodes[path[pos]]
        mid = node.message_id if node.kind == "assistant" else None
        while pos + 1 < len(path):
            after = self.r.nodes[path[pos + 1]]
            same = mid is not None and after.kind == "assistant" and after.message_id == mid
            if not same and self._use_rank(path[pos + 1]) < 0:
                break
            pos += 1
        return pos

    def _line_time(self, uuid: str) -> tuple[int, int]:
        node = self.r.nodes[uuid]
        return (node.ts or 0, node.line)

    def _use_rank(self, uuid: str) -> int:
        """Where the tool_use a tool-result line answers was written (-1: not a result).
        Fixed once the index is built, so worked out once per line."""
        rank = self._ranks.get(uuid)
        if rank is not None:
            return rank
        node = self.r.nodes[uuid]
        rank = -1
        if node.kind == "user" and node.entry is not None:
            ranks = [
                self.use_order.get(str(c.get("tool_use_id")), -1)
                for c in _content_of(node) or []
                if c.get("type") == "tool_result"
            ]
            known = [r for r in ranks if r >= 0]
            rank = min(known) if known and len(known) == len(ranks) else -1
        self._ranks[uuid] = rank
        return rank

    def _results_in_use_order(self, added: list[str]) -> list[str]:
        """Each run of consecutive tool-result lines sorted by the order of their
        tool_use blocks (a run holding a line of anything else is left as it is)."""
        out = list(added)
        ranks = [self._use_rank(u) for u in out]
        i = 0
        while i < len(out):
            j = i
            while j < len(out) and ranks[j] >= 0:
                j += 1
            if j - i > 1:
                out[i:j] = sorted(out[i:j], key=self._use_rank)
                if out[i:j] != added[i:j]:
                    self.r.stats["parallel_results_reordered"] = (
                        self.r.stats.get("parallel_results_reordered", 0) + 1
                    )
            i = j + 1 if j == i else j
        return out

    def _logical_path_from(
        self, uuid: str | None, parents: dict[str, str | None] | None = None
    ) -> tuple[int, list[str]]:
        """How much of the current path the context of `uuid` keeps, and what it adds.

        Walks up (by `parents`, default the logical tree) only until it meets the current
        path, so an append-only step costs O(new nodes), not O(path).
        """
        parents = self.parents if parents is None else parents
        out: list[str] = []
        seen: set[str] = set()
        while uuid is not None and uuid not in seen and uuid in self.r.nodes:
            pos = self.path_pos.get(uuid)
            if pos is not None:
                return self._turn_end(pos) + 1, out[::-1]
            seen.add(uuid)
            out.append(uuid)
            uuid = parents.get(uuid)
        return 0, out[::-1]

    def run(self, requests: list[_Request]) -> None:
        for k, req in enumerate(requests):
            self.b.add_request(ts=req.ts, model=req.model, usage=req.usage, ts_end=req.end_ts)
            self.b.set_output(k, req.output)
            self.strip_thinking = not PRESERVES_THINKING.match(req.model)
            first = self.r.nodes[req.first_node]
            tree = self.sent_parents if first.uuid in self.sent_before else self.parents
            self._advance(k, *self._logical_path_from(tree.get(first.uuid), tree), first.line)
        tail = self._last_leaf()
        if tail is not None:
            self._advance(len(requests), *self._logical_path_from(tail), None)
        self.flush_event(-1)

    def _last_leaf(self) -> str | None:
        for uuid in reversed(self.r.order):
            if uuid in self.node_ids:
                return uuid
        return None

    def _advance(self, k: int, common: int, added: list[str], before_line: int | None) -> None:
        """Context of request k: the first `common` nodes of the current path, then `added`
        (with the parallel calls the chain misses, `_with_parallel_calls`, from lines
        before `before_line`)."""
        if common < len(self.path):  # a rewind: the rest of the old branch leaves
            for uuid in self.path[common:]:
                for blk in self.node_blocks.get(uuid, []):
                    self.b.hide(blk, k)
                self.path_pos.pop(uuid, None)
            del self.path[common:]
        for uuid in self._with_parallel_calls(added, before_line):
            self.path_pos[uuid] = len(self.path)
            self.path.append(uuid)
            if uuid == self.fork_node and self.b.n_blocks:
                self.b.fork_block = self.b.n_blocks - 1
            node = self.r.nodes[uuid]
            if node.compaction_root:
                self._compaction(k, node)
            blocks = self._blocks_of(k, node)
            self.node_blocks[uuid] = blocks
            self._track_thinking(k, node, blocks)

    def _track_thinking(self, k: int, node: _Node, blocks: list[int]) -> None:
        """A new user turn ends earlier turns' thinking for models that do not keep it."""
        if node.kind == "assistant":
            kinds = self.b.block_kinds(blocks)
            self.thinking.extend(
                b for b, kind in zip(blocks, kinds, strict=True) if kind == Kind.THINKING
            )
            return
        if node.kind != "user" or not self.strip_thinking:
            return
        if any(kind == Kind.TEXT for kind in self.b.block_kinds(blocks)):
            for blk in self.thinking:
                self.b.strip(blk, k)
            self.r.stats["thinking_stripped"] = self.r.stats.get("thinking_stripped", 0) + len(
                self.thinking
            )
            self.thinking = []

    def _compaction(self, k: int, root: _Node) -> None:
        """Everything before the root leaves what the recording sent from request k on."""
        self.thinking = []  # compacted away: no later turn can strip it
        for uuid in self.path[:-1]:
            for blk in self.node_blocks.get(uuid, []):
                self.b.compact_away(blk, k)
        trigger, pre = "unknown", -1
        if root.kind == "system" and root.entry is not None:
            meta = root.entry.get("compactMetadata")
            if isinstance(meta, dict):
                trigger = str(meta.get("trigger") or "unknown")
                pre_v = meta.get("preTokens")
                pre = pre_v if isinstance(pre_v, int) else -1
        ts = root.ts if root.entry else None  # parse_ts of the entry's timestamp
        self.flush_event(-1)
        if root.uuid in self.copied_roots:
            self.r.stats["compactions_copied"] = self.r.stats.get("compactions_copied", 0) + 1
            return
        self._pending = (k, trigger, pre, ts or 0)

    def flush_event(self, summary_block: int) -> None:
        """Record the pending compaction event, with its summary block once that is laid."""
        if self._pending is not None:
            k, trigger, pre, ts = self._pending
            self.b.add_event(CompactionEvent(k, trigger, pre, summary_block, ts))
            self._pending = None

    def _blocks_of(self, k: int, node: _Node) -> list[int]:
        entry = node.entry
        if entry is None or node.kind == "system":
            return []
        content = _content_of(node)
        if content is None:
            self.r.problems.report(
                self.r.label, node.line, "wrong-type", "message content is not text or a list"
            )
            return []
        ts = node.ts or 0  # parsed from the entry's timestamp when the line was read
        out: list[int] = []
        if node.kind == "assistant":
            mid = node.message_id or node.uuid
            msg = self.msg_index.setdefault(mid, len(self.msg_index))
            origin = self._request_index.get(mid, -1)
            for c in content:
                out.extend(self._assistant_block(k, msg, ts, origin, c))
            return out
        msg = self.msg_index.setdefault(node.uuid, len(self.msg_index))
        prompt_from_parent = node.sidechain and node.parent is None
        human = not (entry.get("isMeta") or node.summary or prompt_from_parent)
        for c in content:
            out.extend(self._user_block(k, msg, ts, node, c, human))
        if node.summary:
            self.flush_event(out[0] if out else -1)
        elif content and str(content[0].get("text", "")).startswith(COMPACT_COMMAND):
            self._manual(k)
        return out

    def _manual(self, k: int) -> None:
        """1.0.x logs no trigger, but a manual /compact leaves its command line after the
        summary (before the next request): the compaction at k was the user's."""
        events = self.b.events
        if events and events[-1].request == k and events[-1].trigger == "unknown":
            events[-1] = replace(events[-1], trigger="manual")

    def _assistant_block(
        self, k: int, msg: int, ts: int, origin: int, c: dict[str, Any]
    ) -> list[int]:
        kind = c.get("type")
        add = self.b.add_block
        if kind == "text":
            text = c.get("text")
            return [
                add(
                    msg=msg,
                    kind=Kind.TEXT,
                    role=Role.ASSISTANT,
                    text=str(text or ""),
                    ts=ts,
                    first_request=k,
                    origin=origin,
                )
            ]
        if kind in ("thinking", "redacted_thinking"):
            text = c.get("thinking") if kind == "thinking" else c.get("data")
            return [
                add(
                    msg=msg,
                    kind=Kind.THINKING,
                    role=Role.ASSISTANT,
                    text=str(text or ""),
                    ts=ts,
                    first_request=k,
                    origin=origin,
                )
            ]
        if kind in ("tool_use", "server_tool_use"):
            raw_name = c.get("name")
            name = raw_name if isinstance(raw_name, str) else "unknown"
            tool_input = c.get("input")
            raw_id = c.get("id")
            use_id = raw_id if isinstance(raw_id, str) else None
            path = _tool_path(tool_input)
            flags = 0  # Flag bits as plain ints: IntFlag arithmetic is slow per block
            if path and name in READ_TOOLS:
                flags |= _PATH_READ
            if path and name in WRITE_TOOLS:
                flags |= _PATH_WRITE
            if use_id:
                self.uses[use_id] = (name, path if flags else None)
            text = name + orjson.dumps(tool_input, option=orjson.OPT_SORT_KEYS).decode()
            return [
                add(
                    msg=msg,
                    kind=Kind.TOOL_USE,
                    role=Role.ASSISTANT,
                    text=text,
                    ts=ts,
                    first_request=k,
                    tool=name,
                    flags=flags,
                    path=path if flags else None,
                    origin=origin,
                    use_id=use_id,
                )
            ]
        self.r.stats["blocks_unknown"] = self.r.stats.get("blocks_unknown", 0) + 1
        return []

    def _user_block(
        self, k: int, msg: int, ts: int, node: _Node, c: dict[str, Any], human: bool
    ) -> list[int]:
        kind = c.get("type")
        add = self.b.add_block
        if kind == "text":
            text = str(c.get("text") or "")
            if node.summary:
                return [
                    add(
                        msg=msg,
                        kind=Kind.SUMMARY,
                        role=Role.USER,
                        text=text,
                        ts=ts,
                        first_request=k,
                        flags=Flag.ARTIFACT,
                    )
                ]
            return [
                add(
                    msg=msg,
                    kind=Kind.TEXT,
                    role=Role.USER,
                    text=text,
                    ts=ts,
                    first_request=k,
                    flags=Flag.HUMAN if human else Flag.NONE,
                )
            ]
        if kind == "image":
            src = c.get("source")
            data = src.get("data") if isinstance(src, dict) else None
            return [
                add(
                    msg=msg,
                    kind=Kind.IMAGE,
                    role=Role.USER,
                    text=str(data or ""),
                    ts=ts,
                    first_request=k,
                    tokens=IMAGE_TOKENS,
                    flags=Flag.HUMAN if human else Flag.NONE,
                )
            ]
        if kind == "tool_result":
            use_id = c.get("tool_use_id")
            if not isinstance(use_id, str) or use_id not in self.uses:
                self.r.problems.report(
                    self.r.label,
                    node.line,
                    "orphan-tool-result",
                    "tool_result has no matching tool_use",
                )
                name, path = None, None
                use_id = None
            else:
                name, path = self.uses[use_id]
            text, images = _text_of(c.get("content"))
            flags = 0
            if name in REGENERABLE_TOOLS:
                flags |= _REGENERABLE
            if c.get("is_error"):
                flags |= _ERROR
            if path and name in READ_TOOLS:
                flags |= _PATH_READ
            if path and name in WRITE_TOOLS:
                flags |= _PATH_WRITE
            file_tokens, file_scale = -1, None
            if path and not flags & _ERROR and node.entry is not None:
                file_tokens, file_scale = _file_observation(name, node.entry.get("toolUseResult"))
            out = [
                add(
                    msg=msg,
                    kind=Kind.TOOL_RESULT,
                    role=Role.USER,
                    text=text,
                    ts=ts,
                    first_request=k,
                    tool=name,
                    flags=flags,
                    path=path,
                    result_for=use_id,
                    file_tokens=file_tokens,
                    file_scale=file_scale,
                )
            ]
            for _ in range(images):
                out.append(
                    add(
                        msg=msg,
                        kind=Kind.IMAGE,
                        role=Role.USER,
                        text=f"{use_id}:{len(out)}",
                        ts=ts,
                        first_request=k,
                        tool=name,
                        tokens=IMAGE_TOKENS,
                    )
                )
            return out
        self.r.stats["blocks_unknown"] = self.r.stats.get("blocks_unknown", 0) + 1
        return []


def _split_sessions(reader: _FileReader) -> tuple[set[str], list[set[str]]]:
    """Main-chain nodes and inline sidechains (1.0.x), each grouped by its sidechain root."""
    main: set[str] = set()
    roots: dict[str, str] = {}
    groups: dict[str, set[str]] = {}
    for uuid in reader.order:
        node = reader.nodes[uuid]
        if not node.sidechain:
            main.add(uuid)
            continue
        parent = node.parent
        root = roots.get(parent) if parent is not None else None
        if root is None:
            root = uuid
            groups[root] = set()
        roots[uuid] = root
        groups[root].add(uuid)
    return main, list(groups.values())


def _build_session(
    reader: _FileReader,
    nodes: set[str],
    hasher: Hasher,
    *,
    id: str,
    kind: str,
    parent: int,
    token_cache: dict[int, int],
    requests: list[_Request],
    copied_roots: frozenset[str] = frozenset(),
    process_of: dict[str, int] | None = None,
    fork_from: _Request | None = None,
) -> tuple[Session, dict[str, int]]:
    """One session of `reader`: the blocks of `nodes`, priced at `requests` (the session's
    own calls; calls copied from another file only lay their blocks as context).
    `process_of`: message id -> the file of a resume chain that made the call. `fork_from`:
    the last call a fork copied from its parent (`Session.fork`)."""
    client = f"claude-code {reader.version}".strip()
    builder = SessionBuilder(hasher, id=id, kind=kind, parent=parent, client=client)
    requests = _ordered(reader, requests)
    index = {req.message_id: k for k, req in enumerate(requests)}
    assembler = _SessionAssembler(reader, builder, nodes, index, copied_roots)
    if fork_from is not None and fork_from.nodes:
        assembler.fork_node = fork_from.nodes[0]
        usage = fork_from.usage
        one_hour = usage is not None and usage.cache_write_1h > 0 and usage.cache_write_5m == 0
        ttl = ONE_HOUR if one_hour else FIVE_MINUTES
        builder.fork_times = (fork_from.ts, fork_from.end_ts, ttl)
    assembler.run(requests)
    session = builder.finish(token_cache)
    session.restarted_at = _restarts(reader, requests, process_of or {})
    return session, builder.stats


def _restarts(
    reader: _FileReader, requests: list[_Request], process_of: dict[str, int]
) -> list[int]:
    """The requests (by index) whose client process did not send the request before: a
    process started (`_FileReader.process_starts`) between the first lines of the two
    responses, or the two calls are of different files of a resume chain (before 2.1.x
    logged resumes in the session's own file, `--resume` wrote a new file: `_Unit`)."""
    starts = reader.process_starts
    out: list[int] = []
    before = 0
    previous: int | None = None
    for k, req in enumerate(requests):
        seen = bisect_right(starts, reader.nodes[req.first_node].line)
        process = process_of.get(req.message_id, 0)
        if k and (seen > before or process != previous):
            out.append(k)
        before, previous = seen, process
    return out


def _ordered(reader: _FileReader, requests: list[_Request]) -> list[_Request]:
    """Requests in file order; a response written before its predecessor's is reported.

    Send times are kept non-decreasing (a tool result written after a parallel call's
    response can make them step back by a little).
    """
    last_line = last_sent = None
    for req in requests:
        if last_line is not None and req.line_ts < last_line:
            node = reader.nodes[req.first_node]
            reader.problems.report(
                reader.label,
                node.line,
                "timestamp-order",
                "request timestamp is earlier than the previous request's",
            )
            req.line_ts = last_line
        if last_sent is not None and req.ts < last_sent:
            req.ts = last_sent
        last_line, last_sent = req.line_ts, req.ts
    return requests


@dataclass
class _File:
    """One file of an import unit, parsed."""

    index: int  # position in the unit (file#<index> in problem locations)
    role: str  # "main", "resume", "subagent" or "compaction"
    stem: str
    agent: bool  # a subagent or fork file (every line a sidechain line)
    reader: _FileReader

    def calls(self) -> list[_Request]:
        return [self.reader.requests[m] for m in self.reader.request_order]


def read(unit: ImportUnit, contents: list[bytes], problems: Problems) -> Trace:
    """Compile a Claude Code session with its subagent, compaction and resumed files.

    Every API call is counted once over the unit: a call whose `message.id` an earlier file
    already holds is a copy (see `_Unit`).
    """
    hasher = hasher_for(unit, contents)
    files: list[_File] = []
    roles = ["main", *unit.roles]
    for i, (source, data) in enumerate(zip(unit.files, contents, strict=True)):
        stem = source.path.name.split(".")[0]
        agent = roles[i] in ("subagent", "compaction") or stem.startswith("agent-")
        reader = _FileReader(source.label, data, problems, whole_sidechain=agent)
        files.append(_File(i, roles[i], stem, agent, reader))
    built = _Unit(hasher)
    for chain in _resume_chains(continuation_order([f for f in files if not f.agent])):
        built.conversation(chain)
    # Compaction files last: a subagent compacts too (anthropics/claude-code#16944), and its
    # acompact file copies the subagent's calls, which must be counted before.
    for f in sorted((f for f in files if f.agent), key=lambda f: f.role == "compaction"):
        built.agent(f)
    for f in files:
        add_counts(built.stats, f.reader.stats)
    return unit_trace("claude-code", unit, contents, built.sessions, problems, built.stats)


def continuation_order(files: list[_File]) -> list[_File]:
    """Conversation files in the order they continue one another.

    A resumed file begins with a copy of the calls of the file it resumes, then goes on
    (traces/discover.py groups such files). A file's *divergence* is the time of its first
    call past the longest run of leading calls it shares with another file, or, when every
    call is shared, the time of its last call: the original ends before its continuation's
    first own call, and of two forks of one history the one that went on first comes first
    (a chain A, B resumes A, C resumes B sorts A, B, C). Ties keep unit order.
    """
    if len(files) < 2:
        return files
    keys: list[tuple[int, int]] = []
    for f in files:
        calls = f.calls()
        run = max(_shared_run(calls, g) for g in files if g is not f)
        if not calls:
            keys.append((NEVER_TS, f.index))
        elif run < len(calls):
            keys.append((calls[run].line_ts, f.index))
        else:
            keys.append((calls[-1].line_ts, f.index))
    order = sorted(range(len(files)), key=lambda i: keys[i])
    return [files[i] for i in order]


def _resume_chains(files: list[_File]) -> list[list[_File]]:
    """Conversation files grouped into the files each resume: a file whose every call a
    later file holds is continued by that file (the later file copied it whole), so the two
    are one conversation, read from the last file of the chain. Files that fork (each with
    calls of its own after the shared ones) stay apart."""
    target = list(range(len(files)))
    for i, f in enumerate(files):
        calls = f.calls()
        for j in range(i + 1, len(files)):
            if calls and _shared_run(calls, files[j]) == len(calls):
                target[i] = j
                break
    chains: dict[int, list[_File]] = {}
    for i, f in enumerate(files):
        end = i
        while target[end] != end:
            end = target[end]
        chains.setdefault(end, []).append(f)
    return [chains[i] for i in sorted(chains)]


#: Sort key of a file without calls: after every file with one.
NEVER_TS = 2**62


def _shared_run(calls: list[_Request], other: _File) -> int:
    """How many of `calls`, from the first, `other` holds too."""
    held = other.reader.requests
    n = 0
    for req in calls:
        if req.message_id not in held:
            break
        n += 1
    return n


class _Unit:
    """The sessions of one import unit, every call counted once.

    Evidence: ../shared/traces/claude-code holds five resumed files that repeat 18 to 94 of
    an earlier file's calls (same `message.id`, same usage; traces/discover.py). From
    2.1.8x a compaction writes `subagents/agent-acompact-*.jsonl`, a copy of the parent's
    calls up to the compaction plus the summary call itself with its real usage, and `/btw`
    writes `agent-aside_question-*.jsonl`, a copy plus the side question's call (issue 12:
    3,498 requests compiled for about 2,844 real calls in one source before the copies were
    dropped). Both run as one-turn forks of the parent's context (anthropics/claude-code
    #91910: `compact` and `reactive-compact` go through the shared fork helper); `--resume`
    writes a new file with a new id (anthropics/claude-code#4926). So:

    * a call already held by an earlier file is a copy: its lines still lay their blocks
      (the context the file's own calls were sent with), but it is no request of this file;
    * a resumed file that holds every call of the file it resumes continues it: the two
      are one conversation, one session read from the later file (`_resume_chains`), so a
      policy replays the resumed history it built up, and the prompt cache sees the gap in
      trace time (in the five resumed files of ../shared the first call after the resume
      wrote the history again: the gap had outlived the cache). A file that forks (the
      original went on too) is a `main` session of its own, linked to the file it copied
      (its parent), with only its own calls; a compaction it copied is not its own;
    * an acompact file's own call is its parent's compaction call: its usage is attached to
      that compaction's event (`CompactionEvent.call_usage`), and no session is made; when
      the parent logged no compaction after the copied calls, the call is kept as a
      `compaction` session holding only that call;
    * any other subagent or fork file is a session of its own calls only; one with none
      (every call copied) is dropped;
    * a /btw or unattached compaction file that copied calls sent its first call with the
      parent's context, through the client's shared fork helper, in the same process and
      with the same system prompt (#91910; a forked subagent does the same and reads
      574,953 of 575,298 tokens, claude-code#77306), so it shares the cache, which is keyed
      by content, not by file. `Session.fork` says where that context ends (the last block
      of the input of the last copied call, whose final marker wrote it) and when the
      parent last used it (`_last_use`): replay seeds that entry before the fork's first
      request. A forked session file (`--fork-session`, `/branch`) does not: its system
      prompt names the new session (a scratchpad path), so the whole conversation misses
      (claude-code#77306, open on 2.1.247: reads of 0-57k where the parent's prefix is
      hundreds of thousands; #41284 on 2.1.8x), and it starts cold as any session.
      ../shared/repro/fidelity/fork: the compaction call read 35,371 of its 36,271 tokens;
      replayed cold it wrote 25,668 of them (+199% on the session, +31% on the
      reproduction's bill), seeded -5.4% and -0.9% (the rest is the compaction prompt,
      which the file logs shorter than the 900 uncached tokens the usage shows: the fork's
      anchoring put that deficit into the copied blocks).
    """

    def __init__(self, hasher: Hasher) -> None:
        self.hasher = hasher
        self.token_cache: dict[int, int] = {}
        self.sessions: list[Session] = []
        self.stats: dict[str, int] = {}
        #: message id -> (session index, request index) of the call's first appearance.
        self.calls: dict[str, tuple[int, int]] = {}
        self.nodes: set[str] = set()
        #: Session index of each conversation file's session, by session id.
        self.by_session_id: dict[str, int] = {}

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def _split(self, f: _File) -> tuple[list[_Request], list[_Request]]:
        own: list[_Request] = []
        copied: list[_Request] = []
        for req in f.calls():
            (copied if req.message_id in self.calls else own).append(req)
        return own, copied

    def _copied_roots(self, f: _File, copied: list[_Request]) -> frozenset[str]:
        """Compaction roots this file copied: known from an earlier file, or written before
        its last copied call."""
        r = f.reader
        last = max((r.nodes[q.first_node].line for q in copied), default=0)
        return frozenset(
            u
            for u, node in r.nodes.items()
            if node.compaction_root and (u in self.nodes or node.line < last)
        )

    def _add(
        self,
        f: _File,
        nodes: set[str],
        requests: list[_Request],
        *,
        id: str,
        kind: str,
        parent: int,
        copied_roots: frozenset[str] = frozenset(),
        process_of: dict[str, int] | None = None,
        fork_from: _Request | None = None,
    ) -> int:
        ids = {s.id for s in self.sessions}
        unique, j = id, 1
        while unique in ids:
            unique, j = f"{id}/{j}", j + 1
        session, st = _build_session(
            f.reader,
            nodes,
            self.hasher,
            id=unique,
            kind=kind,
            parent=parent,
            token_cache=self.token_cache,
            requests=requests,
            copied_roots=copied_roots,
            process_of=process_of,
            fork_from=fork_from,
        )
        if session.fork is not None and not session.n_requests:
            session.fork = None  # no call of its own: nothing was sent with that context
        if session.fork is not None and fork_from is not None:
            session.fork = self._last_use(session.fork, fork_from, int(session.requests["ts"][0]))
            self._count("forks_of_a_cached_context")
        add_counts(self.stats, st)
        index = len(self.sessions)
        self.sessions.append(session)
        for k, req in enumerate(requests):
            self.calls.setdefault(req.message_id, (index, k))
        return index

    def _last_use(self, fork: ForkContext, copied: _Request, first_sent: int) -> ForkContext:
        """The fork's parent context as last used before the fork's first call: the entry
        the copied call wrote is read, and so kept alive, by the parent's next request,
        where that one left before the fork's first call with the same context (no
        compaction between) within the entry's TTL of the copied call's send (the rule of
        current models, simulator/prompt_cache.py; forks are of 2.1.8x on); any later
        request of the parent reads its own newer entries."""
        s, k = self.calls.get(copied.message_id, (-1, -1))
        if s < 0 or k + 1 >= self.sessions[s].n_requests:
            return fork
        parent = self.sessions[s]
        if any(e.request == k + 1 for e in parent.events):
            return fork
        sent = int(parent.requests["ts"][k + 1])
        if sent > first_sent or sent > fork.sent_ms + fork.ttl_ms:  # later, or it had expired
            return fork
        return replace(fork, sent_ms=sent, end_ms=max(int(parent.requests["ts_end"][k + 1]), sent))

    def conversation(self, chain: list[_File]) -> None:
        """A conversation: a session file and the files it resumes (`_resume_chains`), read
        from the last of them, which holds every call of the others."""
        f = chain[-1]
        r = f.reader
        self._count("files_resumed", len(chain) - 1)
        earlier = [g.reader.requests for g in chain[:-1]]
        self._count("calls_copied", sum(any(m in e for e in earlier) for m in r.requests))
        _usage_from_originals(chain)
        process_of = _process_of(chain)
        own, copied = self._split(f)
        self._count("calls_copied", len(copied))
        roots = self._copied_roots(f, copied)
        parent = -1
        if copied:
            held = {m: s for m, (s, _) in self.calls.items()}
            counts: dict[int, int] = {}
            for req in copied:
                counts[held[req.message_id]] = counts.get(held[req.message_id], 0) + 1
            parent = max(sorted(counts), key=lambda s: counts[s])
            if not own:
                self._count("files_all_copied")
                self.nodes.update(r.nodes)
                return
            self._count("sessions_forked")
        main, sidechains = _split_sessions(r)
        origin = chain[0].reader
        main_id = (r.last_session_id if copied else origin.session_id) or chain[0].stem
        own_ids = {q.message_id for q in own}
        groups = [(main_id, "main", main)]
        groups += [(f"{main_id}/sidechain-{j}", "subagent", g) for j, g in enumerate(sidechains)]
        first = -1
        for sid, kind, nodes in groups:
            mine = [q for q in r.request_order if r.requests[q].first_node in nodes]
            requests = [r.requests[q] for q in mine if q in own_ids]
            if mine and not requests:  # a copied sidechain: its calls are counted already
                continue
            at = self._add(
                f,
                nodes,
                requests,
                id=sid,
                kind=kind,
                parent=parent if kind == "main" else first,
                copied_roots=roots,
                process_of=process_of,
            )
            if kind == "main":
                first = at
                logged = [g.reader.skill_listing for g in chain if g.reader.skill_listing >= 0]
                self.sessions[at].skill_listing = logged[0] if logged else -1
                names = {main_id, r.last_session_id}
                if not copied:
                    names |= {g.reader.session_id for g in chain}
                    names |= {g.reader.last_session_id for g in chain}
                for name in sorted(n for n in names if n):
                    self.by_session_id.setdefault(name, at)
        self.nodes.update(r.nodes)

    def agent(self, f: _File) -> None:
        """A subagent, aside-question or compaction file: its own calls only."""
        r = f.reader
        own, copied = self._split(f)
        self._count("calls_copied", len(copied))
        parent = self.by_session_id.get(r.session_id, 0 if self.sessions else -1)
        if f.role == "compaction" and own and self._attach(own, copied):
            self._count("compaction_calls_attached", len(own))
            for req in own:
                self.calls.setdefault(req.message_id, (-1, -1))
            return
        if not own and copied:
            self._count("files_all_copied")
            return
        kind = "compaction" if f.role == "compaction" else "subagent"
        if kind == "compaction":
            self._count("compaction_calls_unattached", len(own))
        roots = self._copied_roots(f, copied)
        self._add(
            f,
            set(r.order),
            own,
            id=f.stem,
            kind=kind,
            parent=parent,
            copied_roots=roots,
            fork_from=copied[-1] if copied else None,
        )

    def _attach(self, own: list[_Request], copied: list[_Request]) -> bool:
        """Give the compaction that `own` (an acompact file's own calls) made its usage and
        its times (`_span`).

        The compaction is the first event, without usage yet, of the session holding the
        last call the file copied, at a later request than that call; without copied calls,
        the first event without usage at or after the call's time in any session.
        """
        usage = _sum_usage(own)
        if usage is None:
            return False
        if copied:
            s, k = self.calls[copied[-1].message_id]
            if s < 0:
                return False
            candidates = [(s, i) for i, e in enumerate(self.sessions[s].events) if e.request > k]
        else:
            start = own[0].line_ts
            candidates = [
                (s, i)
                for s, session in enumerate(self.sessions)
                for i, e in enumerate(session.events)
                if e.ts >= start
            ]
            candidates.sort(key=lambda c: (self.sessions[c[0]].events[c[1]].ts, c))
        for s, i in candidates:
            event = self.sessions[s].events[i]
            if event.call_usage is None:
                self.sessions[s].events[i] = replace(event, call_usage=usage, call_ms=_span(own))
                return True
        return False


def _process_of(chain: list[_File]) -> dict[str, int]:
    """Message id -> the first file of a resume chain holding the call: each file of the
    chain is the process that resumed the one before (`_Unit`); empty for a single file."""
    out: dict[str, int] = {}
    if len(chain) > 1:
        for i, g in enumerate(chain):
            for m in g.reader.request_order:
                out.setdefault(m, i)
    return out


def _usage_from_originals(chain: list[_File]) -> None:
    """A call's usage as the file that made it logged it, not as a later copy did.

    A copy can be written while the call is still streaming: in ../shared flutter-docker
    aba9151e, the copy of 390ab778's last call logs zero usage where the original logs a
    204,576-token cache read.
    """
    last = chain[-1].reader.requests
    for g in reversed(chain[:-1]):
        for mid, req in g.reader.requests.items():
            copy = last.get(mid)
            if copy is not None and req.usage is not None:
                copy.usage = req.usage
                copy.output = req.output


def _span(requests: list[_Request]) -> tuple[int, int]:
    """When the first of a compaction's calls was sent and the last one's response ended
    (a retry after an error is the same compaction)."""
    sent = requests[0].ts
    return sent, max(sent, *(q.end_ts for q in requests))


def _sum_usage(requests: list[_Request]) -> tuple[int, int, int, int, int] | None:
    """(input, cache read, cache write 5m, cache write 1h, output) summed over the calls
    that logged usage (a compaction retried after an error is one compaction)."""
    logged = [q for q in requests if q.usage is not None]
    if not logged:
        return None
    total = [0, 0, 0, 0, 0]
    for q in logged:
        u = q.usage
        assert u is not None
        for j, v in enumerate((u.input, u.cache_read, u.cache_write_5m, u.cache_write_1h)):
            total[j] += v
        total[4] += max(q.output, u.output)
    return total[0], total[1], total[2], total[3], total[4]


def _numbered_tokens(chars: int, lines: int) -> int:
    """Estimated cl100k tokens of a file of `chars` characters and `lines` lines as the
    Read tool would show it: counted from lengths, since tokenizing every file an Edit
    reports would cost a quarter of the import time."""
    return round((chars + LINE_PREFIX_CHARS * lines) / NUMBERED_CHARS_PER_TOKEN)


def _file_observation(tool: str | None, result: Any) -> tuple[int, float | None]:
    """What a tool result tells about its file's whole size (``toolUseResult``): a Read's
    shown and total line counts give a scale for the result's own tokens; a Write's
    content and an Edit's original file (with the edit applied by length) give the size.
    Returns (file_tokens, file_scale) as `SessionBuilder.add_block` takes them."""
    if not isinstance(result, dict):
        return -1, None
    if tool == "Read":
        info = result.get("file")
        if not isinstance(info, dict):
            return -1, None
        shown, total = info.get("numLines"), info.get("totalLines")
        if isinstance(shown, int) and isinstance(total, int) and 0 < shown <= total:
            return -1, total / shown
        return -1, 1.0
    if tool == "Write":
        content = result.get("content")
        if isinstance(content, str):
            return _numbered_tokens(len(content), content.count("\n") + 1), None
        return -1, None
    if tool == "Edit":
        original = result.get("originalFile")
        old, new = result.get("oldString"), result.get("newString")
        if not (isinstance(original, str) and isinstance(old, str) and isinstance(new, str)):
            return -1, None
        edits = [(old, new, bool(result.get("replaceAll")))]
    elif tool == "MultiEdit":
        original = result.get("originalFileContents")
        raw_edits = result.get("edits")
        if not isinstance(original, str) or not isinstance(raw_edits, list):
            return -1, None
        edits = [
            (e["old_string"], e["new_string"], bool(e.get("replace_all")))
            for e in raw_edits
            if isinstance(e, dict)
            and isinstance(e.get("old_string"), str)
            and isinstance(e.get("new_string"), str)
        ]
    else:
        return -1, None
    chars, lines = len(original), original.count("\n") + 1
    for old, new, every in edits:
        times = (original.count(old) if every else 1) if old else 0
        chars += times * (len(new) - len(old))
        lines += times * (new.count("\n") - old.count("\n"))
    return _numbered_tokens(max(chars, 0), max(lines, 1)), None
