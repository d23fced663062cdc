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
* Compaction roots: 2.x writes a ``system`` line with ``subtype: compact_boundary``
  (``parentUuid`` null, ``logicalParentUuid`` set) followed by an ``isCompactSummary``
  user line; 1.0.x writes only the summary line, with a null ``parentUuid``. The logical
  history runs on through the root (to ``logicalParentUuid``, or in 1.0.x to the previous
  main-chain line); what the recording really sent stops at the root, so blocks before it
  get ``compacted_at`` and the summary is an ARTIFACT block.
* Triggers: 2.x names them in ``compactMetadata``; 1.0.x does not, but a manual /compact
  leaves a ``<command-name>/compact</command-name>`` user line right after the summary, so
  a 1.0.x compaction is "manual" with that line and "unknown" (in practice auto) without.
* Subagents: inline ``isSidechain`` lines (1.0.x) grouped by their sidechain root,
  ``agent-*.jsonl`` files beside the session (2.0.x) or under ``<session>/subagents/``
  (2.1.x) become sessions of their own whose parent is the main session;
  ``agent-acompact-*`` files are the main session's compaction requests.
* A line that cannot be parsed (under --lenient) becomes a placeholder node in the tree, so
  a child whose parent was on that line still finds its place: an unknown ``parentUuid``
  resolves to the latest placeholder before the child, else to the previous line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson

from simulator.model import CompactionEvent, Flag, Kind, Role, Session, Trace
from traces.builder import (
    IMAGE_TOKENS,
    Hasher,
    RecordedUsage,
    SessionBuilder,
    add_counts,
    hasher_for,
    unit_trace,
)
from traces.errors import Problems
from traces.jsonl import UNREADABLE, json_lines
from traces.source import ImportUnit

#: The line a /compact command leaves in the transcript (both 1.0.x and 2.x).
COMPACT_COMMAND = "<command-name>/compact</command-name>"

#: Entry types that carry nothing the API was sent (metadata, UI state).
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

_PARENT_RE = re.compile(rb'"parentUuid"\s*:\s*"([^"]+)"')
_SIDECHAIN_RE = re.compile(rb'"isSidechain"\s*:\s*true')


def parse_ts(value: Any) -> int | None:
    """ISO-8601 timestamp to milliseconds since the epoch (None when absent or invalid)."""
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


@dataclass
class _Node:
    """One line of the conversation tree."""

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


@dataclass
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
        kind = obj.get("type")
        if not isinstance(kind, str):
            self._report(lineno, "missing-field", "entry has no 'type'")
            return
        if kind in METADATA_TYPES:
            self.stats["lines_metadata"] += 1
            if kind in ("progress", "attachment"):
                self._tree_node(lineno, obj, kind, pass_through=True)
            return
        if kind not in TREE_TYPES:
            self._report(lineno, "unknown-type", f"unknown entry type {kind!r}")
            return
        self._tree_node(lineno, obj, kind, pass_through=False)

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
            self._report(lineno, "duplicate-id", f"uuid {uuid[:8]}… appears twice")
            return
        if isinstance(obj.get("version"), str):
            self.version = obj["version"]
        if isinstance(obj.get("sessionId"), str) and not self.session_id:
            self.session_id = obj["sessionId"]
        sidechain = bool(obj.get("isSidechain")) or self.whole_sidechain
        node = _Node(uuid, parent, lineno, kind, sidechain, None if pass_through else obj)
        node.ts = parse_ts(obj.get("timestamp"))
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
                self._report(lineno, "wrong-type", "assistant line has no valid timestamp")
                line_ts = 0
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
        fields = (
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        )
        values: dict[str, int] = {}
        for name in fields:
            v = usage.get(name, 0)
            if v is None:
                v = 0
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                self._report(lineno, "wrong-type", f"usage.{name} is not a count: {v!r}")
                return None
            values[name] = v
        created = values["cache_creation_input_tokens"]
        w5, w1 = created, 0
        split = usage.get("cache_creation")
        if isinstance(split, dict):
            a = split.get("ephemeral_5m_input_tokens", 0) or 0
            b = split.get("ephemeral_1h_input_tokens", 0) or 0
            if isinstance(a, int) and isinstance(b, int) and a + b == created:
                w5, w1 = a, b
        return RecordedUsage(
            values["input_tokens"],
            values["cache_read_input_tokens"],
            w5,
            w1,
            values["output_tokens"],
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
    ):
        self.r = reader
        self._request_index = request_index
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
        self._resolve_parents()

    def _resolve_parents(self) -> None:
        """Parent of each node in the logical tree (see the module docstring)."""
        last_placeholder: str | None = None
        previous: str | None = None
        parents: dict[str, str | None] = {}
        for uuid in self.r.order:
            if uuid not in self.node_ids:
                continue
            node = self.r.nodes[uuid]
            parent = node.parent
            if node.compaction_root:
                lp = node.logical_parent
                parent = lp if lp in self.node_ids else previous
            elif parent is not None and parent not in self.r.nodes:
                parent = last_placeholder or previous
            elif parent is not None and parent not in self.node_ids:
                parent = None  # parent is in another session (a sidechain's root)
            parents[uuid] = parent
            if node.kind == "broken":
                last_placeholder = uuid
            previous = uuid
        self.parents = parents

    def _logical_path_from(self, uuid: str | None) -> tuple[int, list[str]]:
        """How much of the current path the context of `uuid` keeps, and what it adds.

        Walks up only until it meets the current path, so an append-only step costs
        O(new nodes), not O(path).
        """
        out: list[str] = []
        seen: set[str] = set()
        while uuid is not None and uuid not in seen and uuid in self.r.nodes:
            pos = self.path_pos.get(uuid)
            if pos is not None:
                return pos + 1, out[::-1]
            seen.add(uuid)
            out.append(uuid)
            uuid = self.parents.get(uuid)
        return 0, out[::-1]

    def run(self, requests: list[_Request]) -> None:
        for k, req in enumerate(requests):
            self.b.add_request(ts=req.ts, model=req.model, usage=req.usage, ts_end=req.end_ts)
            self.b.set_output(k, req.output)
            self.strip_thinking = not PRESERVES_THINKING.match(req.model)
            first = self.r.nodes[req.first_node]
            self._advance(k, *self._logical_path_from(self.parents.get(first.uuid)))
        tail = self._last_leaf()
        if tail is not None:
            self._advance(len(requests), *self._logical_path_from(tail))
        self.flush_event(-1)

    def _last_leaf(self) -> str | None:
        for uuid in reversed(self.r.order):
            if uuid in self.node_ids:
                return uuid
        return None

    def _advance(self, k: int, common: int, added: list[str]) -> None:
        """Context of request k: the first `common` nodes of the current path, then `added`."""
        if common < len(self.path):  # a rewind: the rest of the old branch leaves
            for uuid in self.path[common:]:
                for blk in self.node_blocks.get(uuid, []):
                    self.b.hide(blk, k)
                self.path_pos.pop(uuid, None)
            del self.path[common:]
        for uuid in added:
            self.path_pos[uuid] = len(self.path)
            self.path.append(uuid)
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
        ts = parse_ts(root.entry.get("timestamp")) if root.entry else None
        self.flush_event(-1)
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
        content = _content_blocks(entry)
        if content is None:
            self.r.problems.report(
                self.r.label, node.line, "wrong-type", "message content is not text or a list"
            )
            return []
        ts = parse_ts(entry.get("timestamp")) or 0
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
            flags = Flag.NONE
            if path and name in READ_TOOLS:
                flags |= Flag.PATH_READ
            if path and name in WRITE_TOOLS:
                flags |= Flag.PATH_WRITE
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
            flags = Flag.NONE
            if name in REGENERABLE_TOOLS:
                flags |= Flag.REGENERABLE
            if c.get("is_error"):
                flags |= Flag.ERROR
            if path and name in READ_TOOLS:
                flags |= Flag.PATH_READ
            if path and name in WRITE_TOOLS:
                flags |= Flag.PATH_WRITE
            file_tokens, file_scale = -1, None
            if path and not flags & Flag.ERROR and node.entry is not None:
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
) -> tuple[Session, dict[str, int]]:
    client = f"claude-code {reader.version}".strip()
    builder = SessionBuilder(hasher, id=id, kind=kind, parent=parent, client=client)
    requests = [
        reader.requests[m] for m in reader.request_order if reader.requests[m].first_node in nodes
    ]
    requests = _ordered(reader, requests)
    index = {req.message_id: k for k, req in enumerate(requests)}
    _SessionAssembler(reader, builder, nodes, index).run(requests)
    session = builder.finish(token_cache)
    return session, builder.stats


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


def read(unit: ImportUnit, contents: list[bytes], problems: Problems) -> Trace:
    """Compile a Claude Code session (with its subagent files) into a Trace."""
    hasher = hasher_for(unit, contents)
    token_cache: dict[int, int] = {}
    sessions: list[Session] = []
    stats: dict[str, int] = {}
    roles = ["main", *unit.roles]
    for i, (f, data) in enumerate(zip(unit.files, contents, strict=True)):
        role = roles[i]
        stem = f.path.name.split(".")[0]
        is_agent = role != "main" or stem.startswith("agent-")
        reader = _FileReader(f.label, data, problems, whole_sidechain=is_agent)
        add_counts(stats, reader.stats)
        if is_agent:
            kind = "compaction" if role == "compaction" else "subagent"
            groups = [(stem, kind, set(reader.order))]
        else:
            main, sidechains = _split_sessions(reader)
            main_id = reader.session_id or stem
            groups = [(main_id, "main", main)]
            groups += [
                (f"{main_id}/sidechain-{j}", "subagent", g) for j, g in enumerate(sidechains)
            ]
        for sid, kind, nodes in groups:
            parent = -1 if kind == "main" or not sessions else 0
            session, st = _build_session(
                reader, nodes, hasher, id=sid, kind=kind, parent=parent, token_cache=token_cache
            )
            sessions.append(session)
            add_counts(stats, st)
    return unit_trace("claude-code", unit, contents, sessions, problems, stats)


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
