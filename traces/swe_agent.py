"""Reader for SWE-agent trajectories (``*.traj``: one JSON document per run).

What the reader uses:

* ``history``: the messages the model was sent, in order. ``content`` is a string or a list
  of ``{type: text, text}`` (and image) items. The first ``system`` message is the session's
  prefix (``prefix_tokens`` = its cl100k count; it is not a block). Every assistant message
  that is not a demonstration is one request (the model's response to everything before
  it). Two shapes occur: the older one (``agent: primary``; observations are ``user``
  messages; the action is written inside ``content``) and the newer function-calling one
  (``message_type``, ``tool_calls`` on the assistant, ``role: tool`` observations with
  ``tool_call_ids``). When ``history`` is absent, ``trajectory`` steps (response, action,
  observation) stand in for it.
* Demonstrations (``is_demo: true``, either one long user message or expanded
  user/assistant pairs) are input text the model reads, never requests and never HUMAN.
  The task statement (the first user message that is not a demonstration) is HUMAN.
* Observations (a user or tool message answering an assistant action) are TOOL_RESULT
  blocks linked to the action's TOOL_USE block: by ``tool_call_ids`` when present, else to
  the preceding action. They are REGENERABLE, except those of actions that write a file.
* Tool names: the first word of the command (``open``, ``edit``, ``python``, ``submit``...);
  a first word that is not a plain command name (a path, an assignment, over 24
  characters) becomes ``bash``, so no path or script name reaches the trace. For function
  calls the command is rebuilt from the call (``bash`` calls use their ``command``).
* Files (best effort, on the call and its observation): ``open``/``goto``/``scroll_*`` read,
  ``create``/``edit``/``insert`` write the file last opened or created;
  ``str_replace_editor view`` reads and its other subcommands write; shell commands such
  as ``cat FILE`` or ``> FILE`` are read as in the Codex reader
  (:func:`traces.codex.shell_file_access`). Paths are kept as written.

Time and usage: a trajectory has no timestamps and no per-call usage. The clock is
synthetic and deterministic: request k is at ``k * STEP_MS`` ms after the epoch (t0 = 0,
one request every 10 s); every block carries the time of the request it belongs to (inputs:
the first request that sees them; outputs: the request that produced them). Requests have
no recorded usage, so token counts are the tokenizer's. ``info.model_stats`` (a run-wide
total) goes to the trace's stats. The model is ``replay_config``'s model name when present,
else "unknown"; the client is ``swe-agent`` plus ``info.swe_agent_version`` when recorded.

Bad input (invalid JSON, wrong types, missing fields, unknown roles) is reported through
Problems at line 1, or at the line orjson names for a JSON syntax error; under --lenient
the offending message is skipped and counted.
"""

from __future__ import annotations

import bisect
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import orjson

from simulator.model import Flag, Kind, Role, Session, Trace
from traces.bounds import MAX_SHLEX_CHARS
from traces.builder import (
    IMAGE_TOKENS,
    Hasher,
    SessionBuilder,
    add_counts,
    hasher_for,
    unit_trace,
)
from traces.codex import shell_file_access
from traces.errors import Problems
from traces.source import ImportUnit, shown
from traces.tokens import count_tokens

#: Synthetic clock: milliseconds between two consecutive requests (request 0 is at 0).
STEP_MS = 10_000
#: A command's first word becomes the tool name only if it looks like a command name.
_COMMAND_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_+-]{0,23}$")
#: SWE-agent's own commands (its tool bundles: defaults/windowed, search, edit_anthropic,
#: submit, filemap, EnIGMA's debug/connect/decompile tools) and its function-calling
#: `bash`: tool names that say what the agent did and nothing about the user's work. Any
#: other first word of a command (`cat`, `python`, a project's own script) is a shell
#: command, named `bash` in outputs unless the user asks for the words (traces/load.py).
OWN_COMMANDS = frozenset(
    {
        "bash",
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
        "create",
        "edit",
        "insert",
        "append",
        "search_dir",
        "search_file",
        "find_file",
        "filemap",
        "str_replace_editor",
        "set_cursors",
        "submit",
        "exit_forfeit",
        "decompile",
        "disassemble",
        "debug_start",
        "debug_add_breakpoint",
        "debug_continue",
        "debug_step",
        "debug_exec",
        "debug_stop",
        "connect_start",
        "connect_sendline",
        "connect_exec",
        "connect_stop",
    }
)
#: Commands of SWE-agent's file viewer/editor and what they do to the open file.
_VIEW_COMMANDS = frozenset({"goto", "scroll_up", "scroll_down"})
_EDIT_COMMANDS = frozenset({"edit", "insert", "append"})


#: A JSON string (the unrolled form is linear in its length) or one structural character.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')
_NON_SPACE = re.compile(rb"\S")
#: Top-level arrays whose elements problems are located in.
_LOCATED_ARRAYS = (b"history", b"trajectory")


class _Lines:
    """The 1-based line of a trajectory's top-level keys and of the elements of its
    `history` / `trajectory` arrays, so that a problem names the line it is on (a .traj is
    one JSON document, usually indented: issue 17, "SWE-agent errors always point at line
    1"). Found by one scan of the bytes, made only when a first problem is reported."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._scanned = False
        self._keys: dict[bytes, int] = {}
        self._elements: dict[bytes, list[int]] = {}
        self._newlines: list[int] = []

    def key(self, name: str) -> int:
        """The line of the top-level key `name` (1 when absent)."""
        self._scan()
        at = self._keys.get(name.encode())
        return 1 if at is None else self._line(at)

    def element(self, array: str, index: int) -> int:
        """The line where element `index` of the top-level array `array` starts."""
        self._scan()
        starts = self._elements.get(array.encode(), [])
        if not 0 <= index < len(starts):
            return self.key(array)
        found = _NON_SPACE.search(self._data, starts[index])
        return self._line(found.start() if found else starts[index])

    def _line(self, offset: int) -> int:
        return bisect.bisect_right(self._newlines, offset) + 1

    def _scan(self) -> None:
        if self._scanned:
            return
        self._scanned = True
        data = self._data
        self._newlines = [m.start() for m in re.finditer(rb"\n", data)]
        depth = 0
        last: tuple[int, int] | None = None  # the last string at depth 1 (a key, if ':' follows)
        current: bytes | None = None  # the top-level key whose value is being read
        inside: list[int] | None = None  # element starts of the located array being read
        for m in _JSON_TOKEN.finditer(data):
            c = data[m.start()]
            if c == 0x22:  # '"'
                if depth == 1:
                    last = (m.start(), m.end())
            elif c == 0x3A:  # ':'
                if depth == 1 and last is not None:
                    current = data[last[0] + 1 : last[1] - 1]
                    self._keys.setdefault(current, last[0])
            elif c in (0x7B, 0x5B):  # '{' '['
                depth += 1
                if depth == 2 and c == 0x5B and current in _LOCATED_ARRAYS:
                    inside = self._elements.setdefault(current, [])
                    inside.append(m.end())
            elif c in (0x7D, 0x5D):  # '}' ']'
                if depth == 2 and inside is not None:
                    after = _NON_SPACE.search(data, inside[-1])
                    if after is not None and after.start() == m.start():
                        inside.pop()  # `[]`: the array has no element
                    inside = None
                depth -= 1
            elif c == 0x2C:  # ','
                if depth == 2 and inside is not None:
                    inside.append(m.end())
                elif depth == 1:
                    current = None


class _BadMessage(Exception):
    """A problem that skips the current message: (category, message)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category
        self.message = message


@dataclass
class _Call:
    key: str  # unique link key: tool call ids repeat within one replayed trajectory
    ids: tuple[str, ...]
    tool: str
    flags: Flag
    path: str | None


@dataclass
class _State:
    """What the walk over the history carries from one message to the next."""

    requests: int = 0
    msg: int = -1
    task_seen: bool = False
    open_file: str | None = None
    open_calls: list[_Call] = field(default_factory=list)
    n_calls: int = 0
    prefix_set: bool = False


def tool_name(command: str) -> str:
    """The tool a command invokes: its first word, or ``bash`` when that is not a name."""
    words = command.strip().split(None, 1)
    if not words:
        return "bash"
    return words[0] if _COMMAND_NAME.match(words[0]) else "bash"


def command_file_access(command: str, open_file: str | None) -> tuple[Flag, str | None]:
    """File read or written by a SWE-agent command (see the module docstring)."""
    first = command.strip().split("\n", 1)[0]
    try:
        if len(first) > MAX_SHLEX_CHARS:  # shlex is quadratic in one token's length
            raise ValueError("line too long for shlex")
        words = shlex.split(first)
    except ValueError:
        words = first.split()
    if not words:
        return Flag.NONE, None
    cmd, args = words[0], words[1:]
    if cmd == "open":
        return (Flag.PATH_READ, args[0]) if args else (Flag.NONE, None)
    if cmd == "create":
        return (Flag.PATH_WRITE, args[0]) if args else (Flag.NONE, None)
    if cmd in _VIEW_COMMANDS:
        return (Flag.PATH_READ, open_file) if open_file else (Flag.NONE, None)
    if cmd in _EDIT_COMMANDS:
        return (Flag.PATH_WRITE, open_file) if open_file else (Flag.NONE, None)
    if cmd == "str_replace_editor":
        if len(args) >= 2:
            return (Flag.PATH_READ if args[0] == "view" else Flag.PATH_WRITE), args[1]
        return Flag.NONE, None
    return shell_file_access(command)


def _text_of(content: Any) -> tuple[str, list[str]]:
    """Text of a message's content (string or item list) and its image references."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise _BadMessage("wrong-type", "message 'content' is neither text nor a list")
    texts: list[str] = []
    images: list[str] = []
    for item in content:
        if isinstance(item, str):
            texts.append(item)
            continue
        if not isinstance(item, dict):
            raise _BadMessage("wrong-type", "content item is not an object")
        kind = item.get("type")
        if kind == "text":
            text = item.get("text")
            if not isinstance(text, str):
                raise _BadMessage("wrong-type", "content item 'text' is not a string")
            texts.append(text)
        elif kind in ("image_url", "image"):
            ref = item.get("image_url", item.get("source"))
            if isinstance(ref, dict):
                ref = ref.get("url", ref.get("data"))
            images.append(ref if isinstance(ref, str) else "")
    return "\n".join(texts), images


def _call_commands(m: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    """(call id, command, text sent) of each action of an assistant message."""
    action = m.get("action")
    if action is not None and not isinstance(action, str):
        raise _BadMessage("wrong-type", "assistant 'action' is not a string")
    calls = m.get("tool_calls")
    if calls is None:
        return [(None, action, action)] if action and action.strip() else []
    if not isinstance(calls, list):
        raise _BadMessage("wrong-type", "assistant 'tool_calls' is not a list")
    out: list[tuple[str | None, str, str]] = []
    for c in calls:
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
            raise _BadMessage("wrong-type", "tool call is not an object with a 'function'")
        fn = c["function"]
        name = fn.get("name")
        raw = fn.get("arguments", "")
        if not isinstance(name, str):
            raise _BadMessage("missing-field", "tool call has no function name")
        if not isinstance(raw, str):
            raw = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS).decode()
        cid = c.get("id")
        cid = cid if isinstance(cid, str) else None
        if len(calls) == 1 and action and action.strip():
            command = action
        else:
            try:
                args = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                args = {}
            if name == "bash" and isinstance(args, dict) and isinstance(args.get("command"), str):
                command = args["command"]
            elif isinstance(args, dict):
                command = " ".join([name, *(shlex.quote(str(v)) for v in args.values())])
            else:
                command = name
        out.append((cid, command, name + raw))
    return out


class _TrajReader:
    """Walks one trajectory's history (one pass), feeding a SessionBuilder."""

    def __init__(self, label: str, stem: str, problems: Problems, hasher: Hasher) -> None:
        self.label = label
        self.problems = problems
        self.lines = _Lines(b"")
        self.b = SessionBuilder(hasher, id=stem, kind="main", client="swe-agent")
        self.s = _State()
        self.model = "unknown"
        self.stats: dict[str, int] = {
            "messages": 0,
            "messages_demo": 0,
            "messages_ignored": 0,
            "observations_unlinked": 0,
        }

    def _report(self, line: int, category: str, message: str) -> None:
        self.problems.report(self.label, line, category, message)

    # -- whole document -----------------------------------------------------------------

    def read(self, data: bytes) -> None:
        self.lines = _Lines(data)
        if not data.strip():
            self._report(1, "empty-file", "file is empty")
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            line = int(getattr(exc, "lineno", 1) or 1)
            head = data[:512]
            if b"\x00" in head or sum(1 for c in head if c < 9 or 13 < c < 32) > len(head) // 10:
                self._report(line, "binary-garbage", "file is not text")
            else:
                self._report(line, "invalid-json", f"invalid JSON ({exc})")
            return
        if not isinstance(doc, dict):
            self._report(1, "wrong-type", "trajectory is not a JSON object")
            return
        self._meta(doc)
        history = doc.get("history")
        if history is None:
            steps = doc.get("trajectory")
            if isinstance(steps, list):
                self._steps(steps)
                return
            self._report(1, "missing-field", "trajectory has neither 'history' nor 'trajectory'")
            return
        if not isinstance(history, list):
            self._report(self.lines.key("history"), "wrong-type", "'history' is not a list")
            return
        for i, m in enumerate(history):
            self.stats["messages"] += 1
            try:
                self._message(m)
            except _BadMessage as bad:
                self.stats["messages_ignored"] += 1
                self._report(self.lines.element("history", i), bad.category, bad.message)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                # A structure no check foresaw: still a located report, never a traceback.
                self.stats["messages_ignored"] += 1
                line = self.lines.element("history", i)
                self._report(line, "malformed", f"unexpected structure ({type(exc).__name__})")

    def _meta(self, doc: dict[str, Any]) -> None:
        info = doc.get("info")
        if info is not None and not isinstance(info, dict):
            self._report(self.lines.key("info"), "wrong-type", "'info' is not an object")
            info = None
        if info:
            version = info.get("swe_agent_version")
            if isinstance(version, str) and version:
                self.b.client = f"swe-agent {version}"
            stats = info.get("model_stats")
            if stats is not None and not isinstance(stats, dict):
                line = self.lines.key("info")
                self._report(line, "wrong-type", "'info.model_stats' is not an object")
            elif stats:
                for key in ("api_calls", "tokens_sent", "tokens_received"):
                    v = stats.get(key)
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53:
                        self.stats[f"model_{key}"] = v
        config = doc.get("replay_config")
        if isinstance(config, str):
            try:
                config = orjson.loads(config)
            except orjson.JSONDecodeError:
                config = None
        if isinstance(config, dict):
            agent = config.get("agent")
            model = agent.get("model") if isinstance(agent, dict) else None
            name = model.get("name") if isinstance(model, dict) else None
            if isinstance(name, str) and name:
                self.model = name

    # -- messages -----------------------------------------------------------------------

    def _message(self, m: Any) -> None:
        if not isinstance(m, dict):
            raise _BadMessage("wrong-type", "history entry is not an object")
        role = m.get("role")
        if role is None:
            raise _BadMessage("missing-field", "history entry has no 'role'")
        if not isinstance(role, str):
            raise _BadMessage("wrong-type", "history entry 'role' is not a string")
        if role not in ("system", "user", "assistant", "tool"):
            raise _BadMessage("unknown-type", f"unknown role {role[:20]!r}")
        if "content" not in m and role != "assistant":
            raise _BadMessage("missing-field", "history entry has no 'content'")
        text, images = _text_of(m.get("content"))
        s = self.s
        k = s.requests
        if role == "system" and not s.prefix_set:
            self.b.prefix_tokens = count_tokens(text)
            s.prefix_set = True
            return
        if m.get("is_demo"):
            self.stats["messages_demo"] += 1
            r = Role.ASSISTANT if role == "assistant" else Role.USER
            self._text(text, images, r, k, Flag.NONE)
            return
        if role == "assistant":
            self._assistant(m, text, images)
        elif role == "system":
            self._text(text, images, Role.SYSTEM, k, Flag.NONE)
        elif s.open_calls:
            self._observation(m, text, images)
        else:
            flags = Flag.NONE if s.task_seen or role == "tool" else Flag.HUMAN
            s.task_seen = True
            self._text(text, images, Role.USER, k, flags)
            if role == "tool":
                self.stats["observations_unlinked"] += 1

    def _text(self, text: str, images: list[str], role: Role, k: int, flags: Flag) -> None:
        self.s.msg += 1
        ts = k * STEP_MS
        self.b.add_block(
            msg=self.s.msg,
            kind=Kind.TEXT,
            role=role,
            text=text,
            ts=ts,
            first_request=k,
            flags=flags,
        )
        for ref in images:
            self.b.add_block(
                msg=self.s.msg,
                kind=Kind.IMAGE,
                role=role,
                text=ref,
                ts=ts,
                first_request=k,
                flags=flags,
                tokens=IMAGE_TOKENS,
            )

    def _assistant(self, m: dict[str, Any], text: str, images: list[str]) -> None:
        """One request: its thought as TEXT, each action as TOOL_USE (output of request k)."""
        s = self.s
        commands = _call_commands(m)  # validates before anything is added
        k = s.requests
        ts = k * STEP_MS
        thought = text
        if len(commands) == 1 and m.get("tool_calls") is None:
            # Older shape: the action is written inside the content; split it off there.
            action = commands[0][1].strip()
            pos = text.rfind(action) if action else -1
            if pos >= 0:
                thought, commands = text[:pos], [(None, action, text[pos:])]
        s.msg += 1
        if thought.strip() or not commands:
            self.b.add_block(
                msg=s.msg,
                kind=Kind.TEXT,
                role=Role.ASSISTANT,
                text=thought,
                ts=ts,
                first_request=k + 1,
                origin=k,
            )
        s.open_calls = []
        for cid, command, sent in commands:
            tool = tool_name(command)
            flags, path = command_file_access(command, s.open_file)
            if tool in ("open", "create") and path:
                s.open_file = path
            s.n_calls += 1
            call = _Call(f"a{s.n_calls}", (cid,) if cid else (), tool, flags, path)
            s.open_calls.append(call)
            self.b.add_block(
                msg=s.msg,
                kind=Kind.TOOL_USE,
                role=Role.ASSISTANT,
                text=sent,
                ts=ts,
                first_request=k + 1,
                tool=tool,
                flags=flags,
                path=path,
                origin=k,
                use_id=call.key,
            )
        for ref in images:
            self.b.add_block(
                msg=s.msg,
                kind=Kind.IMAGE,
                role=Role.ASSISTANT,
                text=ref,
                ts=ts,
                first_request=k + 1,
                origin=k,
                tokens=IMAGE_TOKENS,
            )
        self.b.add_request(ts=ts, model=self.model, usage=None)
        s.requests += 1

    def _observation(self, m: dict[str, Any], text: str, images: list[str]) -> None:
        s = self.s
        ids = m.get("tool_call_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise _BadMessage("wrong-type", "'tool_call_ids' is not a list of strings")
        call = next((c for c in s.open_calls if ids and set(ids) & set(c.ids)), None)
        if call is None:
            call = s.open_calls[0]
        s.open_calls.remove(call)
        flags = call.flags
        if not flags & Flag.PATH_WRITE:
            flags |= Flag.REGENERABLE
        k = s.requests
        s.msg += 1
        self.b.add_block(
            msg=s.msg,
            kind=Kind.TOOL_RESULT,
            role=Role.USER,
            text=text,
            ts=k * STEP_MS,
            first_request=k,
            tool=call.tool,
            flags=flags,
            path=call.path,
            result_for=call.key,
        )
        for ref in images:
            self.b.add_block(
                msg=s.msg,
                kind=Kind.IMAGE,
                role=Role.USER,
                text=ref,
                ts=k * STEP_MS,
                first_request=k,
                tool=call.tool,
                tokens=IMAGE_TOKENS,
            )

    def _steps(self, steps: list[Any]) -> None:
        """No history: each trajectory step is a response with its action and observation."""
        for i, step in enumerate(steps):
            self.stats["messages"] += 1
            try:
                if not isinstance(step, dict):
                    raise _BadMessage("wrong-type", "trajectory step is not an object")
                response = step.get("response", step.get("thought", ""))
                observation = step.get("observation", "")
                action = step.get("action", "")
                if not (
                    isinstance(response, str)
                    and isinstance(observation, str)
                    and isinstance(action, str)
                ):
                    raise _BadMessage("wrong-type", "trajectory step field is not a string")
                self._assistant({"action": action}, response, [])
                if self.s.open_calls:
                    self._observation({}, observation, [])
            except _BadMessage as bad:
                self.stats["messages_ignored"] += 1
                self._report(self.lines.element("trajectory", i), bad.category, bad.message)

    def finish(self, token_cache: dict[int, int]) -> Session:
        if self.b.prefix_tokens is None:
            self.b.prefix_tokens = 0
        session = self.b.finish(token_cache)
        self.stats["requests"] = session.n_requests
        add_counts(self.stats, self.b.stats)
        return session


def read(unit: ImportUnit, contents: list[bytes], problems: Problems) -> Trace:
    """Compile a SWE-agent trajectory into a Trace (one main session per file)."""
    hasher = hasher_for(unit, contents)
    token_cache: dict[int, int] = {}
    sessions: list[Session] = []
    stats: dict[str, int] = {}
    for f, data in zip(unit.files, contents, strict=True):
        stem = shown(f.path.name).split(".")[0]
        reader = _TrajReader(f.label, stem, problems, hasher)
        try:
            reader.read(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # A structure no check foresaw: still a located report, never a traceback.
            problems.report(f.label, 1, "malformed", f"unexpected structure ({type(exc).__name__})")
        sessions.append(reader.finish(token_cache))
        add_counts(stats, reader.stats)
    return unit_trace("swe-agent", unit, contents, sessions, problems, stats)
