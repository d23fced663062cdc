#!/usr/bin/env python3
"""Generate ctxsim's sample traces (every word invented), deterministically.

    .venv/bin/python traces/samples/make_samples.py            # rewrite the samples
    .venv/bin/python traces/samples/make_samples.py --check    # exit 1 if they differ
    .venv/bin/python traces/samples/make_samples.py --out DIR  # write elsewhere

Nothing here reads the wall clock or an unseeded random source: the same script always
writes the same bytes. The conversations are scripted below (an agent fixing an invented
bookkeeping library, "tinyledger"); file contents, thinking and tool output are produced
from word lists with a seeded generator.

Recorded usage follows a simple, explicit model so that the numbers are self-consistent:

* Tokens: ``ceil(len(text) / 4)`` per block (CHARS_PER_TOKEN); a response's output tokens
  are the sum over its blocks, and those blocks join the context of the next request.
* Context of request k = system prefix + every logged block before it (+ files restored
  after a compaction, which the transcript does not log) = input + cache read + writes.
* Cache: the conversation entry lives 5 minutes. A request within 5 minutes of the
  previous one reads what the previous one cached (its context minus its few uncached
  input tokens) and writes the rest. In the 2.1.x main session the system prefix is
  written once with a 1-hour TTL: after the 10-minute idle gap (and after the compaction)
  only that prefix is read and the conversation is written again. Elsewhere everything is
  written with the 5-minute TTL.
* Auto-compaction (2.1.x main session): before each request the client's estimate (last
  recorded context + last output + new tokens) is compared with AUTO_COMPACT_AT; at the
  first request where it is reached a compact_boundary and a summary are written. Up to 5
  recently read files (5,000 tokens each at most) are restored after it, unlogged.
"""

from __future__ import annotations

import argparse
import base64
import filecmp
import json
import random
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

SEED = 20251118
CHARS_PER_TOKEN = 4
FIVE_MIN_MS = 5 * 60 * 1000
ONE_HOUR_MS = 60 * 60 * 1000
#: 200k window - 20k reserve - 13k buffer (DESIGN.md section 4).
AUTO_COMPACT_AT = 167_000
RESTORE_FILES = 5
RESTORE_FILE_TOKENS = 5_000
STREAM_TOKENS_PER_S = 55

HERE = Path(__file__).resolve().parent
CWD = "/work/demo"
PROJECT_DIR = "-work-demo"  # CWD with non-alphanumerics as '-'
B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

Json = dict[str, Any]


def tokens(text: str) -> int:
    """The sample's token model: four characters per token, at least one."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def stream_ms(n_tokens: int) -> int:
    """How long a block of `n_tokens` takes to stream."""
    return 1000 * n_tokens // STREAM_TOKENS_PER_S


def iso(ms: int) -> str:
    """Milliseconds since the epoch as Claude Code writes timestamps (UTC, ms, 'Z')."""
    dt = datetime.fromtimestamp(ms // 1000, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def epoch_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def dump_jsonl(lines: list[Json]) -> bytes:
    out = [json.dumps(line, ensure_ascii=False, separators=(",", ":")) for line in lines]
    return ("\n".join(out) + "\n").encode("utf-8")


class Ids:
    """Seeded identifiers in the shapes the tools use."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def uuid4(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def b62(self, n: int) -> str:
        return "".join(self.rng.choice(B62) for _ in range(n))

    def hex(self, n: int) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def message(self) -> str:
        return "msg_01" + self.b62(22)

    def request(self) -> str:
        return "req_011C" + self.b62(18)

    def tool_use(self) -> str:
        return "toolu_01" + self.b62(22)

    def signature(self) -> str:
        return base64.b64encode(self.rng.randbytes(96)).decode()


# -- invented text -------------------------------------------------------------------------

NOUNS = [
    "amount",
    "entry",
    "posting",
    "account",
    "balance",
    "journal",
    "period",
    "currency",
    "rate",
    "total",
    "row",
    "record",
    "column",
    "dialect",
    "budget",
    "payee",
    "memo",
    "tag",
    "split",
    "statement",
]
VERBS = [
    "parse",
    "load",
    "normalize",
    "validate",
    "format",
    "merge",
    "round",
    "convert",
    "group",
    "summarize",
    "resolve",
    "apply",
    "collect",
    "render",
    "check",
]
ADJECTIVES = ["raw", "signed", "local", "default", "pending", "opening", "closing", "grouped"]


class Writer:
    """Produces invented source files, tool output and prose from word lists."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def module(self, title: str, n_lines: int) -> str:
        r = self.rng
        lines = [
            f'"""{title}."""',
            "",
            "from __future__ import annotations",
            "",
            "import csv",
            "from dataclasses import dataclass, field",
            "from decimal import ROUND_HALF_EVEN, Decimal",
            "",
            "from tinyledger.errors import LedgerError",
            "",
            "",
        ]
        used: set[str] = set()
        while len(lines) < n_lines:
            if r.random() < 0.2:
                lines += self._dataclass()
            else:
                lines += self._function(used)
            lines += ["", ""]
        return "\n".join(lines[:n_lines]).rstrip() + "\n"

    def _dataclass(self) -> list[str]:
        r = self.rng
        name = r.choice(NOUNS).capitalize() + r.choice(["Row", "Spec", "Line", "View", "Set"])
        out = [
            "@dataclass",
            f"class {name}:",
            f'    """One {r.choice(NOUNS)} as the importer sees it."""',
            "",
        ]
        for noun in r.sample(NOUNS, r.randint(3, 6)):
            kind = r.choice(["str", "Decimal", "int", "list[str] = field(default_factory=list)"])
            out.append(f"    {noun}: {kind}")
        return out

    def _function(self, used: set[str]) -> list[str]:
        r = self.rng
        verb, noun = r.choice(VERBS), r.choice(NOUNS)
        name = f"{verb}_{noun}"
        while name in used:
            name = f"{verb}_{r.choice(ADJECTIVES)}_{noun}"
        used.add(name)
        args = r.sample(NOUNS, r.randint(1, 3))
        ret = r.choice(["Decimal", "str", "list[str]", "dict[str, Decimal]", "None"])
        out = [
            f"def {name}({', '.join(args)}) -> {ret}:",
            f'    """{verb.capitalize()} the {r.choice(ADJECTIVES)} {noun} of a {args[0]}."""',
        ]
        for _ in range(r.randint(3, 10)):
            a, b, c = r.choice(NOUNS), r.choice(args), r.choice(NOUNS)
            pick = r.randrange(6)
            if pick == 0:
                out.append(f"    {a} = {b}.{r.choice(VERBS)}_{c}()")
            elif pick == 1:
                out += [f"    if {b} is None:", f'        raise LedgerError("missing {c}")']
            elif pick == 2:
                out += [f"    for item in {b}:", f"        {a} = item.{c} or {a}"]
            elif pick == 3:
                out.append(
                    f'    {a} = Decimal(str({b})).quantize(Decimal("0.01"), '
                    "rounding=ROUND_HALF_EVEN)"
                )
            elif pick == 4:
                out.append(f'    {a} = {b}.get("{c}", "").strip()')
            else:
                out.append(f"    # {r.choice(ADJECTIVES)} {c} values come from the bank export")
        out.append(f"    return {r.choice(args)}" if ret != "None" else "    return None")
        return out

    def sentences(self, n: int, topic: str) -> str:
        r = self.rng
        templates = [
            "The {n1} path goes through {v}_{n2} before the {n3} is stored.",
            "I should check whether the fix for {topic} also changes the {n1} column.",
            "If the {n1} is {adj}, the {n2} has to be rounded only once, at the end.",
            "The tests for {topic} only cover the {adj} case, so the {n1} with a {n2} is untested.",
            "Reading {v}_{n1} again: it splits the {n2} before it looks at the {n3}.",
            "A smaller change is to keep {v}_{n1} as it is and fix the caller instead.",
            "The {n1} fixture has a {adj} {n2}; that is the one that shows the problem.",
            "Nothing else calls {v}_{n2}, so changing its signature is safe.",
        ]
        out = []
        for _ in range(n):
            t = r.choice(templates)
            out.append(
                t.format(
                    n1=r.choice(NOUNS),
                    n2=r.choice(NOUNS),
                    n3=r.choice(NOUNS),
                    v=r.choice(VERBS),
                    adj=r.choice(ADJECTIVES),
                    topic=topic,
                )
            )
        return " ".join(out)

    def pytest_run(self, files: list[str], failures: int, seconds: float) -> str:
        r = self.rng
        total = 0
        rows = []
        for i, name in enumerate(files):
            n = r.randint(6, 24)
            total += n
            marks = ["."] * n
            if i < failures:
                marks[r.randrange(n)] = "F"
            pct = int(100 * (i + 1) / len(files))
            rows.append(f"{name} {''.join(marks):<40} [{pct:>3}%]")
        out = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.12.7, pytest-8.3.4, pluggy-1.5.0",
            f"rootdir: {CWD}",
            "configfile: pyproject.toml",
            f"collected {total} items",
            "",
            *rows,
            "",
        ]
        if failures:
            out.append(
                "=================================== FAILURES ==================================="
            )
            for i in range(failures):
                noun = r.choice(NOUNS)
                out += [
                    f"{'_' * 26} test_{noun}_negative_cents_{i} {'_' * 26}",
                    "",
                    f"    def test_{noun}_negative_cents_{i}():",
                    '>       assert parse_amount("-12.05") == Decimal("-12.05")',
                    "E       AssertionError: assert Decimal('-12.5') == Decimal('-12.05')",
                    "",
                    f"{files[i]}:{r.randint(20, 140)}: AssertionError",
                ]
            out.append(
                "=========================== short test summary info ============================"
            )
            for i in range(failures):
                out.append(f"FAILED {files[i]}::test_case_{i} - AssertionError")
        passed = total - failures
        summary = f"{failures} failed, {passed} passed" if failures else f"{passed} passed"
        out.append(
            f"========================= {summary} in {seconds:.2f}s ========================="
        )
        return "\n".join(out)

    def grep_hits(self, files: list[str], pattern: str, n: int) -> str:
        r = self.rng
        out = []
        for _ in range(n):
            f = r.choice(files)
            out.append(
                f"{f}:{r.randint(5, 600)}:    {pattern}{r.choice(NOUNS)}, {r.choice(NOUNS)})"
            )
        return "\n".join(sorted(set(out)))


def numbered(text: str) -> str:
    """A file as the Read tool shows it: right-aligned line numbers and an arrow."""
    return "\n".join(f"{i:>6}\u2192{line}" for i, line in enumerate(text.splitlines(), 1))


# -- the prompt cache ----------------------------------------------------------------------


@dataclass
class Cache:
    """The sample's cache model (see the module docstring)."""

    prefix: int  # system prompt + tools, in tokens
    prefix_1h: bool  # the prefix is written with a 1-hour TTL
    conv_len: int = 0  # tokens covered by the conversation's 5-minute entry
    conv_at: int | None = None
    prefix_at: int | None = None

    def usage(self, context: int, uncached: int, t: int) -> tuple[int, int, int]:
        """(cache read, 5m write, 1h write) of a request at `t`; refreshes the entries."""
        prefix_ttl = ONE_HOUR_MS if self.prefix_1h else FIVE_MIN_MS
        if self.conv_at is not None and self.conv_len and t - self.conv_at <= FIVE_MIN_MS:
            read = self.conv_len
        elif self.prefix_at is not None and t - self.prefix_at <= prefix_ttl:
            read = self.prefix
        else:
            read = 0
        cached = context - uncached
        w1h = self.prefix - read if self.prefix_1h and read < self.prefix else 0
        w5m = cached - read - w1h
        assert w5m >= 0, (context, uncached, read)
        self.conv_len, self.conv_at, self.prefix_at = cached, t, t
        return read, w5m, w1h

    def new_conversation(self, t: int) -> None:
        """A compaction: the message prefix changed; the summary call kept the prefix warm."""
        self.conv_len, self.conv_at, self.prefix_at = 0, None, t


# -- Claude Code sessions ------------------------------------------------------------------


@dataclass
class Block:
    kind: str  # thinking | text | tool_use
    text: str = ""
    name: str = ""
    input: Json = field(default_factory=dict)
    id: str = ""

    def tokens(self) -> int:
        if self.kind == "tool_use":
            return tokens(self.name + json.dumps(self.input, sort_keys=True))
        return tokens(self.text)


@dataclass
class Result:
    tool_use_id: str
    content: str | list[Json]
    is_error: bool = False
    meta: Any = None
    exec_ms: int = 200
    progress: bool = False  # a long-running Bash call logs a progress line meanwhile

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(str(part.get("text", "")) for part in self.content)


class ClaudeSession:
    """Writes one Claude Code conversation (or sidechain) with self-consistent usage."""

    def __init__(
        self,
        ids: Ids,
        rng: random.Random,
        *,
        session_id: str,
        version: str,
        model: str,
        start_ms: int,
        cache: Cache,
        lines: list[Json] | None = None,
        sidechain: bool = False,
        agent_id: str | None = None,
        slug: str | None = None,
        split_usage: bool = True,
        auto_compact: bool = False,
    ) -> None:
        self.ids, self.rng = ids, rng
        self.session_id, self.version, self.model = session_id, version, model
        self.t = start_ms
        self.cache = cache
        self.lines = lines if lines is not None else []
        self.sidechain, self.agent_id, self.slug = sidechain, agent_id, slug
        self.split_usage = split_usage
        self.auto_compact = auto_compact
        self.modern = version.startswith("2.")
        self.tip: str | None = None  # uuid the next line hangs from
        self.held = 0  # tokens of logged blocks in the context
        self.injected = 0  # unlogged tokens in the context (restored files)
        self.summary_for_compaction = ""
        self.recent_reads: list[tuple[str, int]] = []
        self.requests: list[Json] = []  # per request: ts, usage, output, lines
        self.compactions: list[Json] = []
        self.turn_start = start_ms
        self.backups: dict[str, Json] = {}

    # -- lines -----------------------------------------------------------------------

    def _base(self, kind: str, parent: str | None) -> Json:
        line: Json = {"parentUuid": parent, "isSidechain": self.sidechain}
        if self.agent_id:
            line["agentId"] = self.agent_id
        line |= {
            "userType": "external",
            "cwd": CWD,
            "sessionId": self.session_id,
            "version": self.version,
        }
        if self.modern:
            line["gitBranch"] = "fix-negative-cents"
            if self.slug:
                line["slug"] = self.slug
        line["type"] = kind
        return line

    def _append(self, line: Json, *, chain: bool = True) -> str:
        self.lines.append(line)
        if chain:
            self.tip = line["uuid"]
        return str(line["uuid"])

    def _tick(self, lo_ms: int, hi_ms: int) -> int:
        self.t += self.rng.randint(lo_ms, hi_ms)
        return self.t

    def _usage_json(self, inp: int, read: int, w5: int, w1: int, out: int) -> Json:
        u: Json = {
            "input_tokens": inp,
            "cache_creation_input_tokens": w5 + w1,
            "cache_read_input_tokens": read,
        }
        if self.split_usage:
            u["cache_creation"] = {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1}
        u["output_tokens"] = out
        u["service_tier"] = "standard"
        return u

    # -- metadata ----------------------------------------------------------------------

    def hook_progress(self, event: str, name: str) -> None:
        uid = self.ids.uuid4()
        tool = self.ids.uuid4()
        line = self._base("progress", self.tip)
        line |= {
            "data": {
                "type": "hook_progress",
                "hookEvent": event,
                "hookName": name,
                "command": "${HOME}/.claude/hooks/session-note.sh",
            },
            "parentToolUseID": tool,
            "toolUseID": tool,
            "timestamp": iso(self.t),
            "uuid": uid,
        }
        self._append(line)

    def _bash_progress(self, parent: str, tool_id: str, seconds: int) -> None:
        line = self._base("progress", parent)
        line |= {
            "data": {"type": "bash_progress", "elapsedTimeSeconds": seconds, "totalLines": 0},
            "toolUseID": f"bash-progress-{seconds}",
            "parentToolUseID": tool_id,
            "timestamp": iso(self.t + 1000 * seconds),
            "uuid": self.ids.uuid4(),
        }
        self._append(line, chain=False)  # a leaf beside the conversation

    def turn_end(self) -> None:
        if not self.modern:
            return
        line = self._base("system", self.tip)
        line |= {
            "subtype": "turn_duration",
            "durationMs": self.t - self.turn_start,
            "timestamp": iso(self.t + 12),
            "uuid": self.ids.uuid4(),
            "isMeta": False,
        }
        self._append(line)

    def queue(self, operation: str, content: str | None = None) -> None:
        line: Json = {
            "type": "queue-operation",
            "operation": operation,
            "timestamp": iso(self.t),
            "sessionId": self.session_id,
        }
        if content is not None:
            line["content"] = content
        self.lines.append(line)

    # -- conversation ------------------------------------------------------------------

    def human(self, text: str, pause_s: float, *, blocks: bool = False) -> None:
        """A message the human typed, `pause_s` seconds after the previous line."""
        self.t += int(pause_s * 1000)
        self.turn_start = self.t
        uid = self.ids.uuid4()
        if self.modern and not self.sidechain:
            self.lines.append(
                {
                    "type": "file-history-snapshot",
                    "messageId": uid,
                    "snapshot": {
                        "messageId": uid,
                        "trackedFileBackups": dict(sorted(self.backups.items())),
                        "timestamp": iso(self.t),
                    },
                    "isSnapshotUpdate": False,
                }
            )
        content: Any = [{"type": "text", "text": text}] if blocks else text
        line = self._base("user", self.tip)
        line |= {"message": {"role": "user", "content": content}, "uuid": uid}
        line["timestamp"] = iso(self.t)
        if self.modern and not self.sidechain:
            line |= {
                "thinkingMetadata": {"maxThinkingTokens": 31999},
                "todos": [],
                "permissionMode": "default",
            }
        self._append(line)
        self.held += tokens(text)

    def task_prompt(self, text: str) -> None:
        """First line of a subagent: the prompt its parent wrote (no parent line)."""
        line = self._base("user", None)
        line |= {"message": {"role": "user", "content": text}, "uuid": self.ids.uuid4()}
        line["timestamp"] = iso(self.t)
        self._append(line)
        self.held += tokens(text)

    def synthetic_error(self, wait_s: int) -> None:
        """An API call that failed after retries: Claude Code logs a <synthetic> line."""
        self._tick(wait_s * 1000, wait_s * 1000 + 900)
        line = self._base("assistant", self.tip)
        line |= {
            "message": {
                "id": self.ids.uuid4(),
                "container": None,
                "model": "<synthetic>",
                "role": "assistant",
                "stop_reason": "stop_sequence",
                "stop_sequence": "",
                "type": "message",
                "usage": self._usage_json(0, 0, 0, 0, 0),
                "content": [
                    {
                        "type": "text",
                        "text": "API Error: 529 overloaded (the service is busy; retried 10 times)",
                    }
                ],
            },
            "type": "assistant",
            "uuid": self.ids.uuid4(),
            "timestamp": iso(self.t),
            "isApiErrorMessage": True,
        }
        self._append(line)

    def context(self) -> int:
        return self.cache.prefix + self.held + self.injected

    def call(self, blocks: list[Block], latency_s: float, stop: str | None = None) -> list[str]:
        """One API request; one line per content block. Returns the tool_use ids."""
        if self.auto_compact and self.context() >= AUTO_COMPACT_AT:
            self._compact_auto()
        for b in blocks:
            if b.kind == "tool_use" and not b.id:
                b.id = self.ids.tool_use()
        # time to first token, then about STREAM_TOKENS_PER_S while each block streams
        t_first = self.t + int(latency_s * 1000) + stream_ms(blocks[0].tokens())
        context = self.context()
        uncached = self.rng.randint(3, 12)
        read, w5, w1 = self.cache.usage(context, uncached, t_first)
        output = sum(b.tokens() for b in blocks)
        mid, rid = self.ids.message(), self.ids.request()
        uuids = []
        t = t_first
        for i, b in enumerate(blocks):
            last = i == len(blocks) - 1
            snapshot = output if last else self.rng.randint(1, 8)
            if b.kind == "thinking":
                content: Json = {
                    "type": "thinking",
                    "thinking": b.text,
                    "signature": self.ids.signature(),
                }
            elif b.kind == "text":
                content = {"type": "text", "text": b.text}
            else:
                content = {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
            line = self._base("assistant", self.tip)
            line |= {
                "message": {
                    "model": self.model,
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "content": [content],
                    "stop_reason": (stop or ("tool_use" if b.kind == "tool_use" else None))
                    if last
                    else None,
                    "stop_sequence": None,
                    "usage": self._usage_json(uncached, read, w5, w1, snapshot),
                },
                "requestId": rid,
                "type": "assistant",
                "uuid": self.ids.uuid4(),
                "timestamp": iso(t),
            }
            uuids.append(self._append(line))
            if not last:
                t += self.rng.randint(30, 400) + stream_ms(blocks[i + 1].tokens())
        self.t = t
        self.held += output
        self.requests.append(
            {
                "ts": t_first,
                "input": uncached,
                "cache_read": read,
                "cache_write_5m": w5,
                "cache_write_1h": w1,
                "output": output,
                "context": context,
                "lines": len(blocks),
            }
        )
        self._last_tool_line = {b.id: u for b, u in zip(blocks, uuids, strict=True) if b.id}
        self._assistant_uuid = uuids[-1]
        return [b.id for b in blocks if b.kind == "tool_use"]

    def results(self, results: list[Result]) -> None:
        """Tool results, one user line each, in the order the tools finished."""
        for res in results:
            tool_line = self._last_tool_line.get(res.tool_use_id, self._assistant_uuid)
            if self.modern and res.progress:
                self._bash_progress(tool_line, res.tool_use_id, res.exec_ms // 2000)
            self.t += res.exec_ms
            part: Json = {
                "tool_use_id": res.tool_use_id,
                "type": "tool_result",
                "content": res.content,
            }
            if res.is_error:
                part["is_error"] = True
            line = self._base("user", self.tip)
            line |= {
                "message": {"role": "user", "content": [part]},
                "uuid": self.ids.uuid4(),
                "timestamp": iso(self.t),
            }
            if self.modern:
                line["toolUseResult"] = res.meta if res.meta is not None else res.text()[:200]
                line["sourceToolAssistantUUID"] = tool_line
            self._append(line)
            self.held += tokens(res.text())

    def note_read(self, path: str, content: str) -> None:
        self.recent_reads = [(p, n) for p, n in self.recent_reads if p != path]
        self.recent_reads.append((path, tokens(numbered(content))))

    # -- compaction ----------------------------------------------------------------------

    def _compact_auto(self) -> None:
        pre = self.context()
        summary = self.summary_for_compaction
        assert summary, "auto-compaction reached without a summary prepared"
        call_start = self.t
        self._tick(38_000, 52_000)  # the (unlogged) summary request
        boundary = self._base("system", None)
        boundary["logicalParentUuid"] = self.tip
        boundary |= {
            "subtype": "compact_boundary",
            "content": "Conversation compacted",
            "isMeta": False,
            "timestamp": iso(self.t),
            "uuid": self.ids.uuid4(),
            "level": "info",
            "compactMetadata": {"trigger": "auto", "preTokens": pre},
        }
        self._append(boundary)
        line = self._base("user", self.tip)
        line |= {
            "message": {"role": "user", "content": summary},
            "isVisibleInTranscriptOnly": True,
            "isCompactSummary": True,
            "uuid": self.ids.uuid4(),
            "timestamp": iso(self.t),
        }
        self._append(line)
        self.hook_progress("SessionStart", "SessionStart:compact")
        restored = [min(n, RESTORE_FILE_TOKENS) for _, n in self.recent_reads[-RESTORE_FILES:]]
        self.held = tokens(summary)
        self.injected = sum(restored)
        self.cache.new_conversation(call_start)
        self.compactions.append(
            {
                "request": len(self.requests),
                "trigger": "auto",
                "pre_tokens": pre,
                "restored_tokens": self.injected,
                "ts": self.t,
            }
        )

    def compact_v1(self, summary: str, pause_s: float) -> None:
        """1.0.x: a /compact writes only the summary line, with no parent."""
        call_start = self.t + int(pause_s * 1000)
        self.t = call_start
        self._tick(20_000, 30_000)
        line = self._base("user", None)
        line |= {
            "message": {"role": "user", "content": summary},
            "isCompactSummary": True,
            "uuid": self.ids.uuid4(),
            "timestamp": iso(self.t),
        }
        pre = self.context()
        self._append(line)
        self.held = tokens(summary)
        self.injected = 0
        self.cache.new_conversation(call_start)
        self.compactions.append(
            {"request": len(self.requests), "trigger": "unknown", "pre_tokens": pre, "ts": self.t}
        )

    def totals(self) -> Json:
        keys = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
        out: Json = {k: sum(r[k] for r in self.requests) for k in keys}
        out["requests"] = len(self.requests)
        out["lines"] = sum(r["lines"] for r in self.requests)
        return out


# -- the invented project ------------------------------------------------------------------


class Project:
    """tinyledger's files, generated once and edited as the scripted agent edits them."""

    SIZES: ClassVar[dict[str, int]] = {
        "src/tinyledger/parser.py": 980,
        "src/tinyledger/importer.py": 1270,
        "src/tinyledger/money.py": 540,
        "src/tinyledger/cli.py": 1170,
        "src/tinyledger/report.py": 1320,
        "src/tinyledger/ledger.py": 1430,
        "src/tinyledger/config.py": 390,
        "src/tinyledger/dialects.py": 330,
        "src/tinyledger/errors.py": 50,
        "tests/test_parser.py": 670,
        "tests/test_importer.py": 830,
        "tests/test_report.py": 910,
        "docs/importing.md": 490,
        "CHANGELOG.md": 200,
    }

    def __init__(self, writer: Writer) -> None:
        self.files: dict[str, str] = {}
        for path, n in self.SIZES.items():
            title = f"tinyledger: {Path(path).stem.replace('_', ' ')}"
            self.files[path] = writer.module(title, n)

    def abs(self, path: str) -> str:
        return f"{CWD}/{path}"

    def snippet(self, path: str, start: int, n: int) -> str:
        return "\n".join(self.files[path].splitlines()[start : start + n])

    def edit(self, path: str, start: int, n: int, new: str) -> tuple[str, str]:
        old = self.snippet(path, start, n)
        self.files[path] = self.files[path].replace(old, new, 1)
        return old, new


# -- the 2.1.x main session and its subagent -----------------------------------------------


MAIN_ID = "7c1f9e42-5b8d-4a3e-9f60-2d4b8a1c3e75"
AGENT_ID = "a1b2c3d"
V1_ID = "3e8a0b6d-1c47-4f92-8d15-6a9e2f4c7b08"
MAIN_START = "2025-11-18T09:14:07.512Z"
V1_START = "2025-07-08T15:02:41.088Z"


class MainScript:
    """The scripted 2.1.x session: six human turns, one subagent, an idle gap, a compaction."""

    def __init__(self, rng: random.Random, ids: Ids, w: Writer, project: Project) -> None:
        self.rng, self.ids, self.w, self.p = rng, ids, w, project
        self.s = ClaudeSession(
            ids,
            rng,
            session_id=MAIN_ID,
            version="2.1.34",
            model="claude-opus-4-5-20251101",
            start_ms=epoch_ms(MAIN_START),
            cache=Cache(prefix=16_418, prefix_1h=True),
            slug="quiet-copper-ledger",
            auto_compact=True,
        )
        self.agent: ClaudeSession | None = None

    # tool helpers: each makes one request with the given blocks, then the tool results

    def think(self, topic: str, n: int) -> Block:
        return Block("thinking", self.w.sentences(3 * n + 2, topic))

    def read(self, path: str, pre: list[Block] | None = None, latency: float = 14) -> None:
        tid = self.s.call(
            [*(pre or []), Block("tool_use", name="Read", input={"file_path": self.p.abs(path)})],
            latency,
        )[0]
        self._read_result(tid, path)

    def _read_result(self, tid: str, path: str) -> None:
        content = self.p.files[path]
        n = len(content.splitlines())
        meta = {
            "type": "text",
            "file": {"filePath": self.p.abs(path), "numLines": n, "startLine": 1, "totalLines": n},
        }
        self.s.results(
            [Result(tid, numbered(content), meta=meta, exec_ms=self.rng.randint(40, 160))]
        )
        self.s.note_read(path, content)

    def bash(
        self,
        command: str,
        description: str,
        output: str,
        *,
        pre: list[Block] | None = None,
        error: bool = False,
        exec_ms: int = 1500,
        latency: float = 12,
    ) -> None:
        tool = Block(
            "tool_use", name="Bash", input={"command": command, "description": description}
        )
        tid = self.s.call([*(pre or []), tool], latency)[0]
        meta = {
            "stdout": output if not error else "",
            "stderr": output if error else "",
            "interrupted": False,
            "isImage": False,
        }
        content = f"Exit code 1\n{output}" if error else output
        exec_ms += self.approval_ms()
        res = Result(
            tid, content, is_error=error, meta=meta, exec_ms=exec_ms, progress=exec_ms > 5000
        )
        self.s.results([res])

    def grep(self, pattern: str, path: str, hits: int, pre: list[Block] | None = None) -> None:
        tool = Block(
            "tool_use",
            name="Grep",
            input={
                "pattern": pattern,
                "path": self.p.abs(path),
                "output_mode": "content",
                "-n": True,
            },
        )
        tid = self.s.call([*(pre or []), tool], 11)[0]
        text = self.w.grep_hits(sorted(self.p.files), pattern.split("(")[0], hits)
        n = len(text.splitlines())
        meta = {
            "mode": "content",
            "numFiles": min(n, 4),
            "filenames": [],
            "content": text[:120],
            "numLines": n,
        }
        self.s.results([Result(tid, text, meta=meta, exec_ms=90)])

    def edit(self, path: str, start: int, n: int, new: str, pre: list[Block] | None = None) -> None:
        old, new = self.p.edit(path, start, n, new)
        tool = Block(
            "tool_use",
            name="Edit",
            input={
                "file_path": self.p.abs(path),
                "old_string": old,
                "new_string": new,
                "replace_all": False,
            },
        )
        tid = self.s.call([*(pre or []), tool], 20)[0]
        lines = self.p.files[path].splitlines()
        view = "\n".join(
            f"{i:>6}\u2192{lines[i - 1]}"
            for i in range(max(1, start - 3), min(len(lines), start + n + 6) + 1)
        )
        self.s.backups[path] = {
            "backupFileName": f"{self.ids.hex(16)}@v1",
            "version": 1,
            "backupTime": iso(self.s.t),
        }
        meta = {
            "filePath": self.p.abs(path),
            "oldString": old[:80],
            "newString": new[:80],
            "replaceAll": False,
            "userModified": False,
        }
        self.s.results(
            [
                Result(
                    tid,
                    f"Edited {self.p.abs(path)}; the changed region now reads:\n{view}",
                    meta=meta,
                    exec_ms=60 + self.approval_ms(),
                )
            ]
        )

    def write(self, path: str, content: str, pre: list[Block] | None = None) -> None:
        self.p.files[path] = content
        tool = Block(
            "tool_use", name="Write", input={"file_path": self.p.abs(path), "content": content}
        )
        tid = self.s.call([*(pre or []), tool], 35)[0]
        self.s.backups[path] = {"backupFileName": None, "version": 1, "backupTime": iso(self.s.t)}
        meta = {"type": "create", "filePath": self.p.abs(path), "content": content[:80]}
        self.s.results(
            [
                Result(
                    tid,
                    f"Created {self.p.abs(path)} ({len(content.splitlines())} lines).",
                    meta=meta,
                    exec_ms=45 + self.approval_ms(),
                )
            ]
        )

    def approval_ms(self) -> int:
        """Time the human takes to allow an Edit, Write or Bash call (permission prompt)."""
        return self.rng.randint(4_000, 45_000)

    def say(self, text: str, pre: list[Block] | None = None, latency: float = 16) -> None:
        self.s.call([*(pre or []), Block("text", text)], latency, stop="end_turn")
        self.s.turn_end()

    # the script

    def run(self) -> tuple[ClaudeSession, ClaudeSession]:
        s, w = self.s, self.w
        s.hook_progress("SessionStart", "SessionStart:startup")
        s.tip = None  # the first message is a root of its own
        self.turn1()
        self.turn2()
        s.human(
            "Run the whole suite once more and give me a short summary, then I'll take a break.",
            231,
        )
        files = sorted(f for f in self.p.files if f.startswith("tests/"))
        self.bash(
            "python -m pytest -q",
            "Run the full test suite",
            w.pytest_run(files * 3, 0, 6.31),
            exec_ms=7600,
            latency=7,
        )
        self.say(
            "All 3 test files pass (the parser, importer and report suites). The "
            "negative-cents fix and the semicolon dialect are in; nothing else changed."
        )
        self.turn4_after_gap()
        self.turn5_with_compaction()
        self.turn6()
        self.turn7()
        s.lines.append(
            {
                "type": "summary",
                "summary": "tinyledger: negative cents, semicolon CSV, sorted totals",
                "leafUuid": s.tip,
            }
        )
        assert self.agent is not None
        return s, self.agent

    def turn1(self) -> None:
        s, w = self.s, self.w
        s.human(
            "tinyledger drops a zero from negative amounts in CSV imports: -12.05 comes out as "
            "-12.5. Can you find out why and fix it? The tests live in tests/.",
            0.9,
        )
        self.grep(
            "def parse_amount(",
            "src",
            6,
            pre=[
                self.think("negative amounts", 5),
                Block("text", "I'll start by finding where amounts are parsed."),
            ],
        )
        self.read("src/tinyledger/parser.py", pre=[self.think("parse_amount", 3)])
        self.read("tests/test_parser.py", pre=[self.think("the parser tests", 4)])
        self.bash(
            "python -m pytest -q tests/test_parser.py",
            "Run the parser tests",
            w.pytest_run(["tests/test_parser.py"], 1, 0.42),
            pre=[Block("text", "Let me confirm the failure with the existing tests first.")],
            error=True,
            exec_ms=2600,
        )
        fix = (
            "def split_sign(text: str) -> tuple[int, str]:\n"
            '    """Sign and digits of an amount; keeps leading zeros of the cents."""\n'
            "    text = text.strip()\n"
            '    if text.startswith("-"):\n'
            "        return -1, text[1:]\n"
            "    return 1, text"
        )
        self.edit(
            "src/tinyledger/parser.py",
            118,
            6,
            fix,
            pre=[
                self.think("the sign handling", 7),
                Block(
                    "text",
                    "The sign is stripped after the cents are converted to an int, which "
                    "drops the leading zero. I'll split the sign off first.",
                ),
            ],
        )
        self.bash(
            "python -m pytest -q tests/test_parser.py",
            "Re-run the parser tests",
            w.pytest_run(["tests/test_parser.py"], 0, 0.39),
            exec_ms=2400,
        )
        self.say(
            "Fixed. `split_sign` now separates the sign before the cents are parsed, so "
            "-12.05 stays -12.05. The parser tests pass, including the one that failed."
        )

    def turn2(self) -> None:
        s, w = self.s, self.w
        s.human(
            "Nice. Our bank in Lyon exports semicolon-separated files with a comma as the "
            "decimal mark. Can the importer handle those? Look at how it is structured first.",
            228,
            blocks=True,
        )
        prompt = (
            "Map how tinyledger imports CSV files: which functions read the file, where the "
            "delimiter and decimal mark are decided, and which tests cover it. Report file "
            "paths and function names; do not change anything."
        )
        task = Block(
            "tool_use",
            name="Task",
            input={
                "description": "Map the CSV import path",
                "prompt": prompt,
                "subagent_type": "Explore",
            },
        )
        tid = s.call([self.think("the importer", 4), task], 10)[0]
        report = self.run_agent(prompt)
        s.t = self.agent_end  # the main session waits for the subagent
        meta = {
            "status": "completed",
            "agentId": AGENT_ID,
            "totalDurationMs": self.agent_end - self.agent_start,
            "totalToolUseCount": 4,
        }
        s.results([Result(tid, [{"type": "text", "text": report}], meta=meta, exec_ms=120)])
        self.read("src/tinyledger/importer.py", pre=[self.think("the delimiter sniffing", 3)])
        s.queue("enqueue", "and keep the comma files working please")
        self.read("src/tinyledger/dialects.py")
        s.queue("remove")
        s.human("and keep the comma files working please", 2)
        self.read("src/tinyledger/money.py", pre=[self.think("decimal marks", 4)])
        self.edit(
            "src/tinyledger/importer.py",
            210,
            5,
            "def sniff_dialect(sample: str) -> Dialect:\n"
            '    """Semicolon files use a comma as the decimal mark; comma files a point."""\n'
            '    if sample.count(";") > sample.count(","):\n'
            '        return Dialect(delimiter=";", decimal=",")\n'
            '    return Dialect(delimiter=",", decimal=".")',
            pre=[
                self.think("sniffing", 6),
                Block(
                    "text",
                    "I'll detect the dialect from the first lines and keep comma files "
                    "as they are.",
                ),
            ],
        )
        test = "\n".join(
            [
                '"""Semicolon-separated bank exports."""',
                "",
                "from decimal import Decimal",
                "",
                "from tinyledger.importer import import_rows",
                "",
                "",
                "def test_semicolon_with_decimal_comma(tmp_path):",
                '    path = tmp_path / "lyon.csv"',
                '    path.write_text("date;payee;amount\\n2025-03-02;Boulangerie;-4,35\\n")',
                "    rows = import_rows(path)",
                '    assert rows[0].amount == Decimal("-4.35")',
                "",
                "",
                "def test_comma_files_still_work(tmp_path):",
                '    path = tmp_path / "old.csv"',
                '    path.write_text("date,payee,amount\\n2025-03-02,Rent,-850.00\\n")',
                '    assert import_rows(path)[0].amount == Decimal("-850.00")',
            ]
        )
        self.write("tests/test_importer_semicolon.py", test + "\n")
        self.bash(
            "python -m pytest -q tests/test_importer.py tests/test_importer_semicolon.py",
            "Run the importer tests",
            w.pytest_run(["tests/test_importer.py", "tests/test_importer_semicolon.py"], 0, 0.77),
            exec_ms=3100,
        )
        self.bash(
            "ruff check src tests",
            "Lint",
            "src/tinyledger/importer.py:214:89: E501 Line too long (104 > 88)\nFound 1 error.",
            error=True,
            exec_ms=700,
        )
        self.edit(
            "src/tinyledger/importer.py",
            213,
            1,
            '    """Semicolon files use a decimal comma."""',
            pre=[Block("text", "Shortening that docstring.")],
        )
        self.bash("ruff check src tests", "Lint again", "All checks passed!", exec_ms=650)
        self.say(
            "The importer now sniffs the dialect: semicolon files are read with a decimal comma, "
            "comma files exactly as before. Two new tests cover both; lint is clean."
        )

    def run_agent(self, prompt: str) -> str:
        """The Explore subagent (its own file and cache); returns its final report."""
        rng, ids, w, p = self.rng, self.ids, self.w, self.p
        self.agent_start = self.s.t + 400
        a = ClaudeSession(
            ids,
            rng,
            session_id=MAIN_ID,
            version="2.1.34",
            model="claude-haiku-4-5-20251001",
            start_ms=self.agent_start,
            cache=Cache(prefix=7_342, prefix_1h=False),
            sidechain=True,
            agent_id=AGENT_ID,
            slug="quiet-copper-ledger",
        )
        a.task_prompt(prompt)
        grep = Block(
            "tool_use",
            name="Grep",
            input={
                "pattern": "delimiter|decimal",
                "path": p.abs("src"),
                "output_mode": "content",
                "-n": True,
            },
        )
        tid = a.call([Block("text", "Searching for where the delimiter is chosen."), grep], 3)[0]
        a.results(
            [
                Result(
                    tid,
                    w.grep_hits(
                        ["src/tinyledger/importer.py", "src/tinyledger/dialects.py"],
                        "delimiter=(",
                        9,
                    ),
                    exec_ms=80,
                )
            ]
        )
        r1 = Block(
            "tool_use", name="Read", input={"file_path": p.abs("src/tinyledger/dialects.py")}
        )
        r2 = Block(
            "tool_use",
            name="Read",
            input={"file_path": p.abs("tests/test_importer.py"), "limit": 120},
        )
        t1, t2 = a.call([r1, r2], 4)
        tests_head = "\n".join(p.files["tests/test_importer.py"].splitlines()[:120])
        a.results(
            [
                Result(t1, numbered(p.files["src/tinyledger/dialects.py"]), exec_ms=50),
                Result(t2, numbered(tests_head), exec_ms=40),
            ]
        )
        r3 = Block(
            "tool_use",
            name="Read",
            input={"file_path": p.abs("src/tinyledger/importer.py"), "offset": 180, "limit": 80},
        )
        t3 = a.call([r3], 3)[0]
        part = "\n".join(p.files["src/tinyledger/importer.py"].splitlines()[180:260])
        a.results([Result(t3, numbered(part), exec_ms=50)])
        report = (
            "CSV import path:\n"
            "- src/tinyledger/importer.py: import_rows() opens the file and calls sniff_dialect() "
            "on the first 4 KB; rows are built by build_row().\n"
            "- src/tinyledger/dialects.py: the Dialect dataclass (delimiter, quotechar); there is "
            "no decimal mark, amounts always go through parse_amount() with a point.\n"
            "- tests/test_importer.py: 14 tests, all with comma-separated input.\n"
            "Nothing handles a decimal comma today."
        )
        a.call([Block("text", report)], 5, stop="end_turn")
        self.agent = a
        self.agent_end = a.t + 300
        return report

    def turn4_after_gap(self) -> None:
        s, w = self.s, self.w
        # 10.5 minutes idle: the 5-minute conversation entry expires, the 1-hour prefix does not.
        s.human(
            "Back. Please add a --dialect option to `tinyledger import` so people can force "
            "'comma' or 'semicolon' when sniffing guesses wrong.",
            632,
        )
        self.read("src/tinyledger/cli.py", pre=[self.think("the CLI options", 4)], latency=12)
        self.grep("dialect=", "src", 5)
        self.read("src/tinyledger/config.py")
        self.edit(
            "src/tinyledger/cli.py",
            402,
            4,
            '@click.option("--dialect", type=click.Choice(["auto", "comma", "semicolon"]), '
            'default="auto")\n'
            "def import_cmd(path: str, dialect: str) -> None:\n"
            '    """Import a bank export into the ledger."""\n'
            '    rows = import_rows(Path(path), dialect=None if dialect == "auto" else dialect)',
            pre=[self.think("the option", 5)],
        )
        self.edit(
            "src/tinyledger/importer.py",
            240,
            3,
            "def import_rows(path: Path, dialect: str | None = None) -> list[Row]:\n"
            '    """Rows of a bank export; `dialect` overrides the sniffing."""\n'
            "    spec = DIALECTS[dialect] if dialect else sniff_dialect(path.read_text()[:4096])",
        )
        self.bash(
            "python -m pytest -q tests/test_importer.py",
            "Importer tests",
            w.pytest_run(["tests/test_importer.py"], 0, 0.58),
            exec_ms=2900,
        )
        self.read(
            "docs/importing.md",
            pre=[Block("text", "The docs describe the import options; I'll add the new one.")],
        )
        self.edit(
            "docs/importing.md",
            60,
            2,
            "### Choosing the dialect\n\nUse `--dialect comma` or `--dialect semicolon` "
            "to skip the automatic detection.",
        )
        self.say(
            "Added `--dialect auto|comma|semicolon` (default auto) to `tinyledger import`, "
            "passed through to `import_rows`, and documented it in docs/importing.md."
        )

    def turn5_with_compaction(self) -> None:
        s, w = self.s, self.w
        s.human(
            "Next: the report prints per-currency totals in random order. Sort them by "
            "currency code and add a test.",
            150,
        )
        s.synthetic_error(31)
        s.human("try again", 24)
        s.summary_for_compaction = self.summary_text()
        self.read("src/tinyledger/report.py", pre=[self.think("the report totals", 5)], latency=13)
        self.read("src/tinyledger/ledger.py", pre=[self.think("where totals are grouped", 3)])
        self.read("tests/test_report.py")
        self.grep("def total_by_", "src", 7, pre=[self.think("grouping by currency", 2)])
        self.bash(
            "git log --oneline -8 -- src/tinyledger/report.py",
            "Recent report changes",
            self.git_log(8),
            exec_ms=120,
        )
        self.read(
            "src/tinyledger/parser.py",
            pre=[
                Block("text", "Checking how the parser orders currencies after my earlier change.")
            ],
        )
        self.read("src/tinyledger/money.py")
        self.read("src/tinyledger/importer.py")
        self.read("tests/test_importer.py", pre=[self.think("the importer fixtures", 2)])
        self.bash("git diff --stat", "Changes so far", self.diff_stat(), exec_ms=110)
        self.read("src/tinyledger/cli.py", pre=[self.think("the report command", 3)])
        self.edit(
            "src/tinyledger/report.py",
            330,
            4,
            "def totals_by_currency(entries: list[Entry]) -> list[tuple[str, Decimal]]:\n"
            '    """Totals per currency, sorted by ISO code."""\n'
            "    totals = group_totals(entries)\n"
            "    return sorted(totals.items())",
            pre=[self.think("sorting", 5)],
        )
        self.edit(
            "tests/test_report.py",
            40,
            2,
            "def test_totals_sorted_by_currency():\n"
            '    entries = [entry("USD", "3.00"), entry("CHF", "1.00"), entry("EUR", "2.00")]\n'
            '    assert [c for c, _ in totals_by_currency(entries)] == ["CHF", "EUR", "USD"]',
        )
        self.bash(
            "python -m pytest -q tests/test_report.py",
            "Report tests",
            w.pytest_run(["tests/test_report.py"], 0, 0.64),
            exec_ms=2700,
        )
        self.say(
            "Totals are now sorted by currency code (`totals_by_currency` returns a sorted "
            "list) and a new test checks the order CHF, EUR, USD."
        )

    def turn6(self) -> None:
        s = self.s
        s.human("Great. Add a CHANGELOG entry for all of today's changes.", 238)
        self.read("CHANGELOG.md", pre=[self.think("the changelog format", 2)])
        self.edit(
            "CHANGELOG.md",
            4,
            1,
            "## Unreleased\n\n- Fix: negative amounts kept their leading cent zero.\n"
            "- Import: semicolon files with a decimal comma; `--dialect` option.\n"
            "- Report: totals sorted by currency code.",
        )
        self.say("CHANGELOG updated: three entries under Unreleased.")

    def turn7(self) -> None:
        s, w = self.s, self.w
        s.human(
            "Last thing: `tinyledger balance` should list currencies in the same order. "
            "Then run everything once more.",
            219,
        )
        self.grep("def balance_cmd", "src", 2, pre=[self.think("the balance command", 4)])
        self.read("src/tinyledger/report.py", pre=[self.think("reusing the sorted totals", 2)])
        self.edit(
            "src/tinyledger/cli.py",
            615,
            3,
            "    for currency, amount in totals_by_currency(ledger.entries(period)):\n"
            '        click.echo(f"{currency} {amount:>12}")',
            pre=[self.think("the output format", 3)],
        )
        files = sorted(f for f in self.p.files if f.startswith("tests/"))
        self.bash(
            "python -m pytest -q",
            "Full suite",
            w.pytest_run(files * 3, 0, 6.02),
            exec_ms=7300,
        )
        self.bash(
            "ruff check src tests && ruff format --check src tests",
            "Lint and format check",
            "All checks passed!\n31 files already formatted",
            exec_ms=900,
        )
        self.say("`tinyledger balance` now uses totals_by_currency too. Full suite and lint pass.")

    def summary_text(self) -> str:
        w = self.w
        sections = [
            "This conversation was compacted. Summary of the work so far:",
            "1. Request: fix negative CSV amounts losing a cent digit; support semicolon "
            "bank exports with a decimal comma; add a --dialect option; sort report totals.",
            "2. Done: split_sign() in src/tinyledger/parser.py; sniff_dialect() in "
            "src/tinyledger/importer.py; tests/test_importer_semicolon.py; --dialect in "
            "src/tinyledger/cli.py and docs/importing.md. Lint clean, tests green.",
            "3. In progress: sorting per-currency totals in src/tinyledger/report.py "
            "(totals_by_currency), with a test in tests/test_report.py.",
            "4. Notes: " + w.sentences(14, "the report totals"),
            "5. Files read recently: report.py, ledger.py, parser.py, money.py, "
            "importer.py, cli.py.",
        ]
        return "\n\n".join(sections)

    def git_log(self, n: int) -> str:
        return "\n".join(
            f"{self.ids.hex(7)} {self.rng.choice(VERBS)} {self.rng.choice(NOUNS)} "
            f"{self.rng.choice(NOUNS)}s in reports"
            for _ in range(n)
        )

    def diff_stat(self) -> str:
        files = [
            "CHANGELOG.md",
            "docs/importing.md",
            "src/tinyledger/cli.py",
            "src/tinyledger/importer.py",
            "src/tinyledger/parser.py",
            "tests/test_importer_semicolon.py",
        ]
        rows = [
            f" {f:<40} | {self.rng.randint(2, 30):>3} {'+' * self.rng.randint(1, 12)}"
            for f in files
        ]
        return "\n".join([*rows, f" {len(files)} files changed, 96 insertions(+), 21 deletions(-)"])


# -- the 1.0.x session ---------------------------------------------------------------------


def v1_session(
    rng: random.Random, ids: Ids, w: Writer, p: Project
) -> tuple[ClaudeSession, ClaudeSession]:
    """A shorter 1.0.53 session: inline sidechain, a /compact written as one summary line."""
    lines: list[Json] = []
    s = ClaudeSession(
        ids,
        rng,
        session_id=V1_ID,
        version="1.0.53",
        model="claude-sonnet-4-20250514",
        start_ms=epoch_ms(V1_START),
        cache=Cache(prefix=13_947, prefix_1h=False),
        lines=lines,
        split_usage=False,
    )

    def tool(name: str, inp: Json, text: str | None = None, latency: float = 6) -> str:
        blocks = [Block("text", text)] if text else []
        return s.call([*blocks, Block("tool_use", name=name, input=inp)], latency)[0]

    s.human("Set up a test for parse_amount in tinyledger, there are no parser tests yet.", 0.5)
    tid = tool("LS", {"path": CWD}, "Let me look at the layout.")
    s.results(
        [
            Result(
                tid,
                "- /work/demo/\n  - pyproject.toml\n  - src/\n    - tinyledger/\n  - tests/\n",
                exec_ms=30,
            )
        ]
    )
    tid = tool("Read", {"file_path": p.abs("src/tinyledger/parser.py"), "limit": 260})
    s.results(
        [
            Result(
                tid,
                numbered("\n".join(p.files["src/tinyledger/parser.py"].splitlines()[:260])),
                exec_ms=60,
            )
        ]
    )
    tid = tool("Read", {"file_path": p.abs("src/tinyledger/errors.py")})
    s.results([Result(tid, numbered(p.files["src/tinyledger/errors.py"]), exec_ms=40)])

    # A Task whose sidechain is written inline, between the call and its result.
    prompt = "List every call site of parse_amount under src/ and say which ones pass user input."
    task = Block(
        "tool_use",
        name="Task",
        input={"description": "Find parse_amount callers", "prompt": prompt},
    )
    tid = s.call([Block("text", "I'll have an agent find the callers."), task], 7)[0]
    side = ClaudeSession(
        ids,
        rng,
        session_id=V1_ID,
        version="1.0.53",
        model="claude-sonnet-4-20250514",
        start_ms=s.t + 350,
        cache=Cache(prefix=11_208, prefix_1h=False),
        lines=lines,
        sidechain=True,
        split_usage=False,
    )
    side.task_prompt(prompt)
    gid = side.call(
        [
            Block(
                "tool_use", name="Grep", input={"pattern": "parse_amount\\(", "path": p.abs("src")}
            )
        ],
        3,
    )[0]
    side.results(
        [
            Result(
                gid,
                w.grep_hits(
                    ["src/tinyledger/importer.py", "src/tinyledger/cli.py"], "parse_amount(", 6
                ),
                exec_ms=70,
            )
        ]
    )
    answer = (
        "parse_amount is called from importer.build_row (CSV input, user data), "
        "cli.add_cmd (the --amount option, user input) and report.format_total (internal)."
    )
    side.call([Block("text", answer)], 4, stop="end_turn")
    s.t = side.t + 200
    s.results([Result(tid, [{"type": "text", "text": answer}], exec_ms=50)])

    test = "\n".join(
        [
            "from decimal import Decimal",
            "",
            "import pytest",
            "",
            "from tinyledger.parser import parse_amount",
            "",
            "",
            '@pytest.mark.parametrize("text, value", [("1.00", "1.00"), ("-3.5", "-3.50")])',
            "def test_parse_amount(text, value):",
            "    assert parse_amount(text) == Decimal(value)",
        ]
    )
    tid = tool(
        "Write", {"file_path": p.abs("tests/test_parser.py"), "content": test + "\n"}, latency=12
    )
    s.results([Result(tid, f"Created {p.abs('tests/test_parser.py')}.", exec_ms=40)])
    tid = tool(
        "Bash",
        {"command": "python -m pytest -q tests/test_parser.py", "description": "Run the new test"},
    )
    s.results([Result(tid, w.pytest_run(["tests/test_parser.py"], 0, 0.21), exec_ms=2100)])
    s.call(
        [Block("text", "Added tests/test_parser.py with two parametrised cases; they pass.")],
        5,
        stop="end_turn",
    )

    s.human("Also read the importer and money modules and tell me if they round twice.", 75)
    for path in ("src/tinyledger/importer.py", "src/tinyledger/money.py"):
        tid = tool("Read", {"file_path": p.abs(path)}, latency=5)
        s.results([Result(tid, numbered(p.files[path]), exec_ms=50)])
    s.call(
        [
            Block(
                "text",
                "They do: money.round_amount rounds, and importer.build_row rounds the "
                "result again with ROUND_HALF_UP.",
            )
        ],
        9,
        stop="end_turn",
    )

    s.compact_v1(
        "Summary: added tests/test_parser.py (parse_amount, three cases, passing). Callers of "
        "parse_amount: importer.build_row, cli.add_cmd, report.format_total. The importer and "
        "money modules round twice (ROUND_HALF_EVEN then ROUND_HALF_UP); the user may want "
        "that fixed. " + w.sentences(6, "rounding"),
        64,
    )
    s.human("Yes, fix the double rounding.", 40)
    tid = tool(
        "Edit",
        {
            "file_path": p.abs("src/tinyledger/importer.py"),
            "old_string": "amount = round_amount(raw).quantize(CENT, rounding=ROUND_HALF_UP)",
            "new_string": "amount = round_amount(raw)",
        },
        "Removing the second rounding in build_row.",
        latency=9,
    )
    s.results([Result(tid, f"Edited {p.abs('src/tinyledger/importer.py')}.", exec_ms=40)])
    tid = tool("Bash", {"command": "python -m pytest -q", "description": "Run all tests"})
    s.results(
        [
            Result(
                tid,
                w.pytest_run(["tests/test_parser.py", "tests/test_importer.py"], 0, 0.93),
                exec_ms=2600,
            )
        ]
    )
    s.call(
        [Block("text", "build_row now rounds once (through round_amount). All tests pass.")],
        6,
        stop="end_turn",
    )
    return s, side


def patch_text(path: str, old: list[str], new: list[str]) -> str:
    """A patch in the format Codex's apply_patch tool takes."""
    body = [f"-{line}" for line in old] + [f"+{line}" for line in new]
    return "\n".join(
        ["*** Begin Patch", f"*** Update File: {path}", "@@", *body, "*** End Patch", ""]
    )


# -- Codex ---------------------------------------------------------------------------------


def codex_rollout(rng: random.Random, ids: Ids, w: Writer, p: Project) -> tuple[str, bytes, Json]:
    """A Codex CLI rollout: two user turns, six model calls, token_count events."""
    start = epoch_ms("2025-10-14T07:12:03.271Z")
    sid = f"0199e1a4-{ids.hex(4)}-7{ids.hex(3)}-8{ids.hex(3)}-{ids.hex(12)}"
    t = start
    lines: list[Json] = []
    window = 272_000
    base = 2_612  # instructions + tools
    prompt = base
    prev_prompt = 0
    total = {
        "input_tokens": 0,
        "cached_input_tokens": 0,
        "output_tokens": 0,
        "reasoning_output_tokens": 0,
        "total_tokens": 0,
    }
    calls: list[Json] = []

    def emit(kind: str, payload: Json, dt_ms: int = 0) -> None:
        nonlocal t
        t += dt_ms
        lines.append({"timestamp": iso(t), "type": kind, "payload": payload})

    def token_count(last: Json | None) -> None:
        info = None
        if last is not None:
            info = {
                "total_token_usage": dict(total),
                "last_token_usage": last,
                "model_context_window": window,
            }
        emit(
            "event_msg",
            {
                "type": "token_count",
                "info": info,
                "rate_limits": {
                    "primary": {
                        "used_percent": 4.0,
                        "window_minutes": 299,
                        "resets_in_seconds": 14400,
                    },
                    "secondary": {
                        "used_percent": 1.0,
                        "window_minutes": 10079,
                        "resets_in_seconds": 501000,
                    },
                },
            },
        )

    def turn_context() -> None:
        emit(
            "turn_context",
            {
                "cwd": CWD,
                "approval_policy": "on-request",
                "sandbox_policy": {
                    "mode": "workspace-write",
                    "writable_roots": [CWD],
                    "network_access": False,
                    "exclude_tmpdir_env_var": False,
                    "exclude_slash_tmp": False,
                },
                "model": "gpt-5-codex",
                "effort": "medium",
                "summary": "auto",
            },
        )

    def model_call(summary: str, item: Json, visible: str, latency_ms: int) -> None:
        nonlocal prompt, prev_prompt
        reasoning = 64 * rng.randint(0, 5)
        out = reasoning + tokens(visible)
        cached = (min(prev_prompt, prompt) // 128) * 128 if prev_prompt >= 1024 else 0
        last = {
            "input_tokens": prompt,
            "cached_input_tokens": cached,
            "output_tokens": out,
            "reasoning_output_tokens": reasoning,
            "total_tokens": prompt + out,
        }
        for k in total:
            total[k] += last[k]
        calls.append(dict(last))
        emit("event_msg", {"type": "agent_reasoning", "text": summary}, latency_ms - 600)
        token_count(last)
        emit(
            "response_item",
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": summary}],
                "content": None,
                "encrypted_content": base64.b64encode(rng.randbytes(24 + 3 * reasoning)).decode(),
            },
            600,
        )
        if item["type"] == "message":
            emit("event_msg", {"type": "agent_message", "message": visible})
        emit("response_item", item)
        prev_prompt = prompt
        prompt += out

    def shell(
        summary: str, argv: list[str], output: str, exit_code: int = 0, latency_ms: int = 5200
    ) -> None:
        nonlocal prompt
        call_id = "call_" + ids.b62(24)
        args = json.dumps({"command": argv, "workdir": CWD, "timeout_ms": 120000})
        model_call(
            summary,
            {"type": "function_call", "name": "shell", "arguments": args, "call_id": call_id},
            "shell" + args,
            latency_ms,
        )
        result = json.dumps(
            {
                "output": output,
                "metadata": {
                    "exit_code": exit_code,
                    "duration_seconds": round(rng.uniform(0.05, 2.5), 1),
                },
            }
        )
        emit(
            "response_item",
            {"type": "function_call_output", "call_id": call_id, "output": result},
            rng.randint(80, 2400),
        )
        prompt += tokens(result)
        turn_context()
        token_count(calls[-1])

    def user(text: str, pause_ms: int) -> None:
        nonlocal prompt
        emit(
            "response_item",
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            pause_ms,
        )
        emit("event_msg", {"type": "user_message", "message": text, "kind": "plain"}, 4)
        turn_context()
        token_count(None)
        prompt += tokens(text)

    emit(
        "session_meta",
        {
            "id": sid,
            "timestamp": iso(start - 110),
            "cwd": CWD,
            "originator": "codex_cli_rs",
            "cli_version": "0.46.0",
            "instructions": None,
            "git": {
                "commit_hash": ids.hex(40),
                "branch": "main",
                "repository_url": "git@example.com:demo/tinyledger.git",
            },
        },
    )
    env = "\n".join(
        [
            "<environment_context>",
            f"  <cwd>{CWD}</cwd>",
            "  <approval_policy>on-request</approval_policy>",
            "  <sandbox_mode>workspace-write</sandbox_mode>",
            "  <network_access>restricted</network_access>",
            "  <shell>bash</shell>",
            "</environment_context>",
        ]
    )
    emit(
        "response_item",
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]},
    )
    prompt += tokens(env)
    user("Add a --json flag to `tinyledger balance` that prints the balances as a JSON object.", 1)
    shell(
        "**Looking at the balance command**",
        ["bash", "-lc", 'rg -n "def balance" src'],
        "src/tinyledger/cli.py:512:def balance_cmd(period: str) -> None:\n",
    )
    cli = "\n".join(p.files["src/tinyledger/cli.py"].splitlines()[500:620])
    shell(
        "**Reading the command**",
        ["bash", "-lc", "sed -n '500,620p' src/tinyledger/cli.py"],
        cli + "\n",
        latency_ms=4100,
    )
    patch = patch_text(
        "src/tinyledger/cli.py",
        ["def balance_cmd(period: str) -> None:"],
        [
            '@click.option("--json", "as_json", is_flag=True)',
            "def balance_cmd(period: str, as_json: bool) -> None:",
        ],
    )
    shell(
        "**Adding the option**",
        ["apply_patch", patch],
        "Success. Updated the following files:\nM src/tinyledger/cli.py\n",
        latency_ms=9800,
    )
    shell(
        "**Running the CLI tests**",
        ["bash", "-lc", "python -m pytest -q tests/test_cli.py"],
        w.pytest_run(["tests/test_cli.py"], 0, 0.51),
        latency_ms=3900,
    )
    done = (
        'Added `--json` to `tinyledger balance`; it prints `{"account": "amount"}` with '
        "amounts as strings. The CLI tests pass."
    )
    model_call(
        "**Summarising**",
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": done}],
        },
        done,
        3600,
    )
    token_count(calls[-1])
    user("Thanks. Also sort the keys.", 84_000)
    patch2 = patch_text(
        "src/tinyledger/cli.py",
        ["        click.echo(json.dumps(balances))"],
        ["        click.echo(json.dumps(balances, sort_keys=True))"],
    )
    shell(
        "**Sorting keys**",
        ["apply_patch", patch2],
        "Success. Updated the following files:\nM src/tinyledger/cli.py\n",
        latency_ms=6100,
    )
    done2 = "Keys are now sorted (`sort_keys=True`)."
    model_call(
        "**Done**",
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": done2}],
        },
        done2,
        2900,
    )
    token_count(calls[-1])
    name = f"2025/10/14/rollout-2025-10-14T09-12-03-{sid}.jsonl"
    facts = {"calls": len(calls), "total": dict(total), "last": calls[-1]}
    return name, dump_jsonl(lines), facts


# -- SWE-agent -----------------------------------------------------------------------------


def swe_agent_traj(rng: random.Random, w: Writer) -> tuple[bytes, Json]:
    """A classic SWE-agent trajectory: history, trajectory[], info.model_stats."""
    system = (
        "SETTING: You are working in a repository checkout with a special shell. Besides bash "
        "you can use these commands:\n"
        "open <path> [<line>] - show 100 lines of a file around <line>\n"
        "search_dir <term> [<dir>] - list files containing <term>\n"
        "edit <start>:<end> ... end_of_edit - replace lines <start> to <end>\n"
        "submit - finish and hand in the current diff\n"
        "Reply with one DISCUSSION paragraph and exactly one command in a ``` block."
    )
    demo = (
        "Here is a worked example of the format (it is not your task).\n"
        "DISCUSSION\nFirst I look for the function named in the issue.\n"
        "```\nsearch_dir parse_date\n```"
    )
    issue = (
        "We're solving this issue in tinyledger:\n"
        "ISSUE: `format_total` prints -0.00 for a zero balance reached from negative entries.\n"
        "(Open file: n/a)\n(Current directory: /testbed)\nbash-$"
    )
    report = w.module("tinyledger: report", 120).splitlines()
    window = "\n".join(f"{i}:{line}" for i, line in enumerate(report[:100], 1))
    steps = [
        (
            "search_dir format_total src",
            "Let me find where format_total is defined.",
            'Found 2 matches for "format_total" in /testbed/src:\n'
            "/testbed/src/tinyledger/report.py (1 matches)\n"
            "/testbed/src/tinyledger/cli.py (1 matches)\n"
            'End of matches for "format_total" in /testbed/src',
        ),
        (
            "open src/tinyledger/report.py 40",
            "The definition is in report.py; I'll open it.",
            f"[File: /testbed/src/tinyledger/report.py (120 lines total)]\n{window}",
        ),
        (
            'edit 57:57\n    return f"{(total + 0):.2f}"\nend_of_edit',
            "Adding zero turns a negative zero into a positive one before formatting.",
            "File updated. Please review the changes and make sure they are correct.",
        ),
        (
            'python -c "from tinyledger.report import format_total; print(format_total(-0.0))"',
            "Let me check the output for a negative zero.",
            "0.00",
        ),
        ("submit", "The fix works; submitting.", ""),
    ]
    history: list[Json] = [
        {"role": "system", "content": system, "agent": "primary"},
        {"agent": "primary", "content": demo, "is_demo": True, "role": "user"},
        {"role": "user", "content": issue, "agent": "primary"},
    ]
    trajectory: list[Json] = []
    prompt_tail = "(Open file: n/a)\n(Current directory: /testbed)\nbash-$"
    sent = received = 0
    for action, thought, observation in steps:
        sent += sum(tokens(h["content"]) for h in history)
        response = f"DISCUSSION\n{thought}\n\n```\n{action}\n```"
        received += tokens(response)
        history.append(
            {
                "role": "assistant",
                "content": response,
                "thought": thought,
                "action": action + "\n",
                "agent": "primary",
            }
        )
        state = json.dumps(
            {
                "open_file": "/testbed/src/tinyledger/report.py"
                if "open" in action or "edit" in action
                else "n/a",
                "working_dir": "/testbed",
            }
        )
        history.append(
            {
                "role": "user",
                "content": f"{observation}\n{prompt_tail}",
                "agent": "primary",
            }
        )
        trajectory.append(
            {
                "action": action + "\n",
                "observation": observation,
                "response": response,
                "state": state,
                "thought": thought,
                "execution_time": round(rng.uniform(0.05, 1.8), 3),
            }
        )
    cost = round(sent * 2.5e-6 + received * 1e-5, 6)
    diff = "\n".join(
        [
            "",
            "diff --git a/src/tinyledger/report.py b/src/tinyledger/report.py",
            "--- a/src/tinyledger/report.py",
            "+++ b/src/tinyledger/report.py",
            "@@ -57 +57 @@",
            '-    return f"{total:.2f}"',
            '+    return f"{(total + 0):.2f}"',
            "",
        ]
    )
    stats = {
        "total_cost": cost,
        "instance_cost": cost,
        "tokens_sent": sent,
        "tokens_received": received,
        "api_calls": len(steps),
    }
    traj = {
        "environment": "swe_main",
        "trajectory": trajectory,
        "history": history,
        "info": {
            "swe_agent_version": "1.0.1",
            "exit_status": "submitted",
            "submission": diff,
            "model_stats": stats,
        },
        "replay_config": json.dumps(
            {
                "agent": {"model": {"name": "gpt-4o-2024-08-06", "temperature": 0.0}},
                "env": {"repo": {"path": "/testbed"}},
            }
        ),
    }
    data = (json.dumps(traj, indent=2, ensure_ascii=False) + "\n").encode()
    return data, {"steps": len(steps), "model_stats": stats}


# -- driver --------------------------------------------------------------------------------


def generate(out: Path) -> Json:
    """Write every sample under `out`; return the facts the tests check."""
    rng = random.Random(SEED)
    ids = Ids(rng)
    w = Writer(rng)
    project = Project(w)
    main, agent = MainScript(rng, ids, w, project).run()
    v1, side = v1_session(rng, ids, w, Project(w))
    codex_name, codex_bytes, codex_facts = codex_rollout(rng, ids, w, project)
    traj_bytes, traj_facts = swe_agent_traj(rng, w)

    cc = out / "claude-code" / PROJECT_DIR
    files = {
        cc / f"{MAIN_ID}.jsonl": dump_jsonl(main.lines),
        cc / MAIN_ID / "subagents" / f"agent-{AGENT_ID}.jsonl": dump_jsonl(agent.lines),
        cc / f"{V1_ID}.jsonl": dump_jsonl(v1.lines),
        out / "codex" / codex_name: codex_bytes,
        out / "swe-agent" / "tinyledger-7.traj": traj_bytes,
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def facts(s: ClaudeSession) -> Json:
        f = s.totals()
        f["compactions"] = s.compactions
        f["duration_s"] = (s.requests[-1]["ts"] - s.requests[0]["ts"]) / 1000
        f["max_context"] = max(r["context"] for r in s.requests)
        return f

    return {
        "main": facts(main),
        "main_requests": main.requests,
        "agent": facts(agent),
        "v1": facts(v1),
        "v1_sidechain": facts(side),
        "codex": codex_facts,
        "swe_agent": traj_facts,
        "bytes": {str(p.relative_to(out)): len(d) for p, d in files.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write (default: here)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out")
    ap.add_argument("--facts", action="store_true", help="print the expected numbers as JSON")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            info = generate(Path(tmp))
            bad = [
                name
                for name in info["bytes"]
                if not (args.out / name).is_file()
                or not filecmp.cmp(Path(tmp) / name, args.out / name, shallow=False)
            ]
        for name in bad:
            print(f"differs: {name}", file=sys.stderr)
        return 1 if bad else 0
    info = generate(args.out)
    if args.facts:
        info.pop("main_requests")
        print(json.dumps(info, indent=1))
    else:
        for name, n in info["bytes"].items():
            print(f"{n:>9}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
