"""Reader for Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Each line is ``{timestamp, type, payload}``. ``type`` is one of ``session_meta`` (id,
``cli_version``), ``turn_context`` (the model of the turns that follow), ``response_item``
(what the model was sent or produced: ``message``, ``reasoning``, ``function_call``,
``function_call_output``, ``custom_tool_call`` and their outputs, ...), ``event_msg`` (UI
events; only ``token_count`` matters here) and ``compacted`` (a compaction summary).

Requests. Every ``token_count`` event whose ``total_token_usage`` differs from the previous
one marks one API request, with ``last_token_usage`` as its usage. Codex repeats the event
(0.42 writes it again at the start of the next turn step, with the same totals); repeats are
dropped and counted. ``info: null`` events (0.41+, at the start of a turn) carry nothing.
OpenAI's ``input_tokens`` *includes* the cached tokens, so the usage is converted
explicitly (:func:`usage_from_openai`): input = input - cached, cache read = cached, no cache
writes (OpenAI has no write fee), output = ``output_tokens`` (which includes reasoning).

Ordering of a request's items against its ``token_count`` (found in the real files):

* Codex 0.40 - 0.42 (the recorded sessions in shared/traces/codex): the ``token_count`` of
  request k comes FIRST; the response items of k (reasoning, assistant message, function
  calls) and the outputs of its tool calls follow in one batch, all with the same
  timestamp, written when the turn step ends; then ``turn_context`` opens the next step
  (and 0.42 repeats the previous ``token_count`` there). Streaming UI events
  (``agent_reasoning``, ``agent_message``) precede the ``token_count``.
* Newer Codex (the 0.77 fixtures; the source records each item on ``OutputItemDone``): the
  response items of k stream out first, the ``token_count`` follows at
  ``response.completed``, and the tool outputs come after it (drained once the stream ends).
* Codex 0.118 - 0.147 (the 2026 folders of shared/traces/codex): the same, except that the
  outputs of the response's own calls (parallel ``exec_command``) can be written before
  its ``token_count``. Those outputs are held back until the ``token_count`` (or anything
  else) closes the response; without that, 20 responses of one agentv session lost their
  usage to the next one and the anchoring met unexplained shrinks.

One rule covers all three: output items written without an input item between them form one
*response* (one request). A ``token_count`` belongs to the response still open before it
(written since the last input item) when that response has no usage yet; otherwise it
belongs to the next response after it (and if an input item, a compaction or the end of
the file comes first, it is a request whose response was not logged). A response that no
``token_count`` claims is a request without recorded usage (aborted turns, synthetic files
with one token_count at the end).

Blocks: input items (user and developer messages, tool outputs) preceding request k have
``first_request`` k; the output items of request k have ``first_request`` k+1 and
``origin`` k. A request's time is that of its first line (its ``token_count`` in the old
ordering, its first output item in the new one). The system prompt and tool schemas are not
in the rollout: the session prefix is inferred by anchoring from the first request.

Reasoning: a ``reasoning`` item logs only a short summary (its real content is encrypted),
so its THINKING block is sized from the request's ``reasoning_output_tokens``. Most OpenAI
reasoning models drop the reasoning items that precede the latest user message, so THINKING
blocks are hidden (``hidden_from``) from the request after the next user message on.
Without this the real rollouts show unexplained context shrinks at every new user turn;
with it, anchoring reproduces every recorded context exactly. gpt-5.6 keeps them (its
contexts never shrink there): `REASONING_AT_USER_TURN` says which model does what, and for
a model it does not know the session's own usage decides (`reasoning_kept`).

Flags: user messages are HUMAN unless they are client-made context (``<environment_context>``,
``<user_instructions>``, AGENTS.md, ... see :data:`INJECTED_PREFIXES`); tool outputs are
REGENERABLE except those of calls that write files; ERROR when the output reports failure
(nonzero ``exit_code``, ``success: false``). PATH_READ / PATH_WRITE (best effort, on both the
call and its output): ``apply_patch`` (function, custom tool or shell) writes the first file
its patch names; a shell command whose first simple command is ``cat``/``head``/``tail``/
``nl``/``sed``/``Get-Content``... of one file reads it; ``> FILE``, ``tee``,
``sed -i`` and ``Set-Content`` write. Paths are kept as written (relative paths are not
resolved against the working directory).

Tool outputs (0.118+): a string (``exec_command`` writes a header, ``Chunk ID``, ``Wall
time``, ``Process exited with code N``, then ``Output:``; the freeform shell ``Exit code:
N``: a nonzero code in the header is ERROR), a list of ``input_text`` / ``input_image``
items, or, for ``tool_search_output``, no ``output`` but the ``tools`` it loaded (their
definitions enter the context: the block's text). A hosted ``web_search_call`` gets an
INJECTED block for its unlogged results, in its own request only (`_search_results`).
``agent_message`` items (0.147 multi-agent) are messages from another agent: user-role
input, never HUMAN.

Compaction (``compacted``): the ``replacement_history`` items (ARTIFACT) and a SUMMARY
block (see `_compacted`) enter at the next request, every earlier block gets
``compacted_at`` there, and a CompactionEvent records it: trigger "manual" or "auto" (see
`_compaction_trigger`), ``pre_tokens`` the last recorded context before it. The
``token_count`` Codex writes right after (zero last usage, totals unchanged) is a repeat.

Window: Codex logs the input window it runs with as ``model_context_window`` in every
``token_count`` ``info`` (also in ``task_started``, 0.118+, but that is written before the
turn's ``turn_context`` names the turn's model, so it is not read). The first one logged
while a model is current (the latest ``turn_context`` model) is that model's entry of
`Session.context_windows` (-1 when none is): 258,400 on gpt-5.4-5.6 (95% of 272,000,
openai/codex#19319), 121,600 on gpt-5.3-codex-spark (agentv, 0.142.2; 95% of its 128,000:
genai-prices 0.2.3 does not list the model, so the model facts give it gpt-5's 272,000),
and more where a larger window was configured (entirecontext, gpt-5.6-sol: 353,400 and
874,950). One agentv session switches from spark to gpt-5.5 and its window from 121,600
to 258,400, so the window is kept per model. A model whose logged window changes later
is counted in ``context_window_changes`` (none in shared/traces/codex). The Codex policy
compacts against these windows.

Bad input is reported through Problems (strict: TraceError naming file and line; lenient:
the line is skipped and counted). ``event_msg`` subtypes other than ``token_count`` are UI
events and are ignored (counted in ``lines_ignored``) whatever their name, since Codex adds
new ones often. Top-level entry types other than the five above are metadata (0.147 writes
``world_state``, a snapshot of what the client renders into the developer and user
messages it also logs, and ``inter_agent_communication_metadata``): skipped and counted in
``entries_not_context`` whatever their name, so a new one never stops an import. Unknown
``response_item`` types are reported: they may be context (``ghost_snapshot`` and
``compaction`` items are client bookkeeping: counted, not blocks). A line holding two
entries back to back is read as both (`joined_entries`, counted in ``lines_joined``): it
marks a resume of a rewritten copy, whose first request is in `Session.restored_at`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from simulator.model import CompactionEvent, Flag, Kind, Role, Session, Trace, version_tuple
from traces.bounds import (
    MAX_CONTEXT_TOKENS,
    MAX_SHLEX_CHARS,
    quoted,
    ts_in_range,
    usage_problem,
)
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
from traces.tokens import count_tokens

TOP_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted"})
#: Response items the model produced (they make up a response).
OUTPUT_ITEMS = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "web_search_call",
        "image_generation_call",
        "tool_search_call",
    }
)
#: Response items that go back to the model as input.
INPUT_ITEMS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "mcp_tool_call_output",
        "tool_search_output",
    }
)
#: Response items that are never sent to the model as such (client bookkeeping).
IGNORED_ITEMS = frozenset({"ghost_snapshot", "compaction", "compaction_summary", "other"})

#: User-role messages that start like this are context the client added, not the human.
INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<INSTRUCTIONS>",
    "# AGENTS.md instructions",
    "<user_shell_command>",
    "<turn_aborted>",
    "<permissions instructions>",
    "<collaboration_mode>",
    "<skill>",
    "<personality_spec>",
    # 0.118+: a spawned agent's report, written by the client into the parent's history.
    # Not the human: the replacement history of the one compaction after such reports
    # (git-sync, 0.118) keeps all 9 human messages and none of the 12 notifications.
    "<subagent_notification>",
)

#: Keys of token usage as Codex writes them.
USAGE_KEYS = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
    "total_tokens",
)

#: Whether a model keeps the reasoning that precedes a new user message in the context (True)
#: or drops it (False); first match wins, a model none matches: None (see `reasoning_kept`).
#:
#: OpenAI reasoning models drop the reasoning items that precede the latest user message,
#: but not every model does. In shared/traces/codex, at the first request after a user turn
#: that follows reasoning, the context shrinks by about that reasoning (its context minus
#: the previous context, the previous response and the raw tokens of the inputs since is
#: below minus half the reasoning's tokens) on 82% of gpt-5.4 turns (157; git-sync, agentv),
#: 84-100% of gpt-5.5 turns in every folder (171) and 86-91% of gpt-5-codex / 5.3 ones (25),
#: and the cache read falls back to the turn's first prompt (before the dropped reasoning)
#: on 142 of 200 gpt-5.5 user turns. On gpt-5.6 it shrinks on none of 50 turns in either
#: folder (entirecontext 0.147: 35, hk 0.144: 15): the context grows by the new message
#: (median 68 and 6 tokens beyond it), and the cache reads the previous prompt whole (hk:
#: 10 of the 12 turns of several requests). Each folder alone gives the same rule.
#: Dropping it on gpt-5.6 had cost entirecontext 9 of 299 matched requests and its corpus
#: error +7.1% (now +0.1%), and hk's user turns read about half the context they did.
REASONING_AT_USER_TURN: list[tuple[str, bool]] = [
    (r"^gpt-5\.6", True),
    (r"^gpt-5(-codex|\.[0-5](\D|$)|$|-)", False),
]


#: Codex versions [from, to) under which a user message that comes mid-turn (the last
#: response called a tool: a steer typed while the turn runs, a subagent's notification, the
#: marker of an interrupted turn) leaves the reasoning in the context: it is dropped at the
#: next user message after a response that called none (`_message`).
#:
#: In shared/traces/codex, at the first request after each user message that follows
#: reasoning, the recorded read against the position of that reasoning in the previous
#: prompt (past it: kept; at it: dropped; far short of it: a read of the shared start only,
#: routing, no evidence). After a response that called a tool: gpt-5.4 of 0.118-0.128
#: (git-sync) kept it on 14 of 14 (8 subagent notifications, 2 human steers, 4 turn aborts;
#: 2 more read only a start), gpt-5.5 of 0.140 (agentv, 2026-06-18) on 5 of 5 steers (4 more
#: read a start); gpt-5.5 of 0.141-0.142 (agentv, 2026-06-22 on) dropped it on 19 of 19 (4
#: more read a start), gpt-5-codex of 0.40-0.42 (agentic-neurodata) on 3 of 3. After a
#: response that called no tool (a new task, or a steer after the final message) it is
#: dropped on 147 of 151 (gpt-5.3-codex-spark, 5.4 and 5.5 alike; agentv 019ed99c request
#: 204, a steer after a final message on 0.140, too). Misses of the rule: one gpt-5.5 turn
#: abort of 0.126 (git-sync 019ddcb1 request 2) dropped it, one gpt-5.3-codex-spark steer
#: of 0.142.2 (agentv 019f03e0 request 109) kept it. Where the rule applies the replay had
#: read only up to the dropped reasoning, and the request after fall back to the state
#: before: 19 of the 34 "under, other" requests in sample (agentv 019ed99c requests 227,
#: 239, 244 read 167-214k, 21-34k more than the replay). Whether the cut is the client's
#: (0.141) or the server's (between 06-18 and 06-22) the recordings cannot tell.
MID_TURN_KEEPS_REASONING = ((0, 118), (0, 141))


def reasoning_kept(model: str) -> bool | None:
    """Whether `model` keeps earlier turns' reasoning in its context (None: unknown).

    For a model the table does not know, the session's own turns vote: it keeps the
    reasoning when more of its user turns grew by their new message than shrank by the
    reasoning (one turn's evidence alone is noisy: the tokenizers differ on a long
    message; git-sync 0.118 has a gpt-5.4 session whose turns vote 14 to 11 for keeping
    while its cache reads show the drop)."""
    for pattern, kept in REASONING_AT_USER_TURN:
        if re.search(pattern, model):
            return kept
    return None


_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", re.MULTILINE)
_READ_COMMANDS = frozenset(
    {"cat", "head", "tail", "less", "more", "nl", "bat", "type", "get-content", "gc"}
)
_WRITE_COMMANDS = frozenset({"tee", "set-content", "add-content", "out-file"})
_OPTIONS_WITH_VALUE = frozenset(
    {"-n", "-c", "-totalcount", "-tail", "-head", "-first", "-last", "-encoding", "-e"}
)
_PATH_OPTIONS = frozenset({"-path", "-literalpath", "-filepath"})
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&"})


class _BadLine(Exception):
    """A problem that skips the current line: (category, message)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category
        self.message = message


def usage_from_openai(usage: Mapping[str, Any]) -> RecordedUsage:
    """OpenAI usage to the Anthropic-style RecordedUsage the model stores.

    OpenAI's ``input_tokens`` counts cached tokens too; Anthropic's (and ours) does not. There
    is no cache write fee on OpenAI, so both write columns are 0. ``output_tokens`` already
    includes ``reasoning_output_tokens``. Raises ValueError on missing or negative counts, or
    more cached tokens than input tokens.
    """
    values: dict[str, int] = {}
    for key in ("input_tokens", "cached_input_tokens", "output_tokens"):
        v = usage.get(key, 0 if key == "cached_input_tokens" else None)
        if v is None and key == "cached_input_tokens":
            v = 0
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{key} is not a token count: {quoted(v)}")
        values[key] = v
    cached = values["cached_input_tokens"]
    if cached > values["input_tokens"]:
        raise ValueError("cached_input_tokens exceeds input_tokens")
    problem = usage_problem(values["input_tokens"] - cached, cached, 0, 0, values["output_tokens"])
    if problem is not None:
        raise ValueError(problem)
    return RecordedUsage(
        input=values["input_tokens"] - cached,
        cache_read=cached,
        cache_write_5m=0,
        cache_write_1h=0,
        output=values["output_tokens"],
    )


def joined_entries(raw: bytes) -> list[Any] | None:
    """The entries of a line holding several JSON objects back to back, else None.

    Found in a real 0.118 rollout (git-sync 019d6d29): a whole entry without its newline,
    then, 94 minutes later, the next entry on the same line. Codex never writes that
    (codex-rs JsonlWriter.write_line writes each entry and its newline in one write); the
    copy of a rollout that Entire's ``entire resume`` writes back does (entireio/cli#878,
    merged 2026-04-08, the session's day: the restored rollout goes through
    SanitizePortableTranscript, which deletes the ``encrypted_content`` of every reasoning
    item and joins the lines without a final newline), and Codex 0.118 appends to it as
    is (later codex-rs adds the missing newline first, ensure_rollout_is_newline_terminated:
    there such a resume leaves no mark). Both entries are whole, so both are read (counted
    in ``lines_joined``), and the first request at or after the second one is in
    `Session.restored_at`; anything else on the line keeps it invalid.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    decoder = json.JSONDecoder()
    entries: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        entries.append(obj)
    return entries if len(entries) > 1 else None


def parse_ts(value: Any) -> int | None:
    """ISO-8601 timestamp to milliseconds since the epoch, UTC (None when invalid or outside
    the plausible range of traces/bounds.py)."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if dt.tzinfo is None:  # a naive time is taken as UTC, never as the machine's zone
            dt = dt.replace(tzinfo=UTC)
        ms = int(dt.timestamp() * 1000)
    except (ValueError, OverflowError):
        return None
    return ms if ts_in_range(ms) else None


# -- file access of tool calls (best effort) ----------------------------------------------


def patch_path(patch: str) -> str | None:
    """The first file an ``apply_patch`` patch adds, updates or deletes."""
    m = _PATCH_FILE.search(patch)
    return m.group(1) if m else None


def _tokens(line: str, *, powershell: bool) -> list[str]:
    if len(line) > MAX_SHLEX_CHARS:  # shlex is quadratic in one token's length (issue 17)
        return []
    try:
        if powershell:
            return [t.strip("'\"") for t in shlex.split(line, posix=False)]
        return shlex.split(line, posix=True)
    except ValueError:  # unbalanced quotes: better no path than a wrong one
        return []


def shell_file_access(script: str, *, powershell: bool = False) -> tuple[Flag, str | None]:
    """(PATH_READ or PATH_WRITE, path) for a simple shell command, else (NONE, None).

    Only the first simple command of the first line is looked at (``cat a | head`` reads
    ``a``; ``cd x && cat a`` is not recognised). Best effort by design: a miss only means a
    policy that restores recently read files does not know about this one.
    """
    if "*** Begin Patch" in script:
        path = patch_path(script)
        return (Flag.PATH_WRITE, path) if path else (Flag.NONE, None)
    first = script.strip().split("\n", 1)[0]
    tokens = _tokens(first, powershell=powershell)
    for i, tok in enumerate(tokens):
        if tok in _SEPARATORS:
            tokens = tokens[:i]
            break
    if not tokens:
        return Flag.NONE, None
    for i, tok in enumerate(tokens):
        if tok in (">", ">>") and i + 1 < len(tokens):
            return Flag.PATH_WRITE, tokens[i + 1]
        if tok.startswith(">") and not tok.startswith(">&") and len(tok.lstrip(">")) > 0:
            return Flag.PATH_WRITE, tok.lstrip(">")
    cmd = posixpath.basename(tokens[0].replace("\\", "/")).lower()
    args = tokens[1:]
    if cmd == "sed":
        return _sed_access(args)
    if cmd in _READ_COMMANDS or cmd in _WRITE_COMMANDS:
        flag = Flag.PATH_READ if cmd in _READ_COMMANDS else Flag.PATH_WRITE
        lowered = [a.lower() for a in args]
        for i, a in enumerate(lowered):
            if a in _PATH_OPTIONS and i + 1 < len(args):
                return flag, args[i + 1]
        files = _plain_args(args)
        if len(files) == 1:
            return flag, files[0]
    return Flag.NONE, None


def _sed_access(args: list[str]) -> tuple[Flag, str | None]:
    """``sed`` on one file prints it (a read) or, with ``-i``, rewrites it (a write)."""
    plain: list[str] = []
    script_given = skip = inplace = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-e", "-f", "--expression", "--file"):
            skip = script_given = True
        elif a.startswith("-i") or a.startswith("--in-place"):
            inplace = True
        elif not a.startswith("-"):
            plain.append(a)
    files = plain if script_given else plain[1:]
    if len(files) != 1:
        return Flag.NONE, None
    return (Flag.PATH_WRITE if inplace else Flag.PATH_READ), files[0]


def _plain_args(args: list[str]) -> list[str]:
    """Arguments that are not options or option values."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a.startswith("-") and len(a) > 1:
            skip = a.lower() in _OPTIONS_WITH_VALUE
            continue
        out.append(a)
    return out


def _command_script(command: Any) -> tuple[str, bool] | None:
    """The script a shell call runs (and whether it is PowerShell), from argv or a string."""
    if isinstance(command, str):
        return command, False
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        return None
    if not command:
        return None
    prog = posixpath.basename(command[0].replace("\\", "/")).lower()
    if prog in ("bash", "sh", "zsh", "dash") and len(command) >= 3 and command[1] in ("-lc", "-c"):
        return command[2], False
    if prog.startswith(("powershell", "pwsh")):
        lowered = [c.lower() for c in command]
        if "-command" in lowered:
            i = lowered.index("-command")
            return " ".join(command[i + 1 :]), True
        return "", True
    if prog == "apply_patch" and len(command) >= 2:
        return command[1], False
    return shlex.join(command), False


def call_file_access(name: str, arguments: Any) -> tuple[Flag, str | None]:
    """File read or written by a Codex tool call (see the module docstring)."""
    if name == "apply_patch":
        patch = arguments
        if isinstance(arguments, dict):
            patch = arguments.get("input") or arguments.get("patch")
        if isinstance(patch, str):
            path = patch_path(patch)
            if path:
                return Flag.PATH_WRITE, path
        return Flag.NONE, None
    if not isinstance(arguments, dict):
        return Flag.NONE, None
    if name in ("read_file", "view_image"):
        path = arguments.get("path") or arguments.get("file_path")
        return (Flag.PATH_READ, path) if isinstance(path, str) and path else (Flag.NONE, None)
    command = arguments.get("command", arguments.get("cmd"))
    script = _command_script(command)
    if script is None:
        return Flag.NONE, None
    return shell_file_access(script[0], powershell=script[1])


# -- reading ------------------------------------------------------------------------------


@dataclass
class _Request:
    ts: int
    model: str
    usage: RecordedUsage | None = None
    reasoning: int | None = None  # reasoning_output_tokens of the request, when recorded


@dataclass
class _Call:
    key: str  # unique link key (call ids can repeat)
    tool: str
    flags: Flag
    path: str | None


@dataclass
class _Output:
    """An output block waiting for its response to close (see `_RolloutReader._flush`)."""

    kind: Kind
    text: str
    ts: int
    tool: str | None = None
    flags: Flag = Flag.NONE
    path: str | None = None
    use_id: str | None = None
    tokens: int | None = None


def _content_text(item: dict[str, Any]) -> str | None:
    text = item.get("text")
    return text if isinstance(text, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class _RolloutReader:
    """One pass over one rollout file, feeding a SessionBuilder as it goes.

    Output items are held until their response closes: by then the response's usage is
    known in both orderings, and the reasoning items can be sized from the recorded
    ``reasoning_output_tokens`` (their summaries are far shorter than what the model was
    billed and later re-read). Most OpenAI reasoning models drop the reasoning items that
    precede the latest user message from the context, so their THINKING blocks are hidden
    from the request after the next user message on (this explains the shrinks the rollouts
    show at a new user turn); gpt-5.6 keeps them (`REASONING_AT_USER_TURN`).
    """

    def __init__(self, label: str, stem: str, data: bytes, problems: Problems, hasher: Hasher):
        self.label = label
        self.problems = problems
        self.stats: dict[str, int] = {
            "lines": 0,
            "lines_ignored": 0,
            "lines_joined": 0,
            "entries_not_context": 0,
            "web_search_results": 0,
            "token_counts": 0,
            "token_counts_repeated": 0,
            "token_counts_empty": 0,
            "requests_without_usage": 0,
            "content_items_unknown": 0,
            "compactions": 0,
            "timestamps_clamped": 0,
            "context_window_changes": 0,
            "reasoning_kept_at_user_turn": 0,
        }
        self.session_id = ""
        self.version = ""
        self.stem = stem
        self.model = ""
        self.b = SessionBuilder(hasher, id=stem, kind="main", client="codex")
        self.requests: list[_Request] = []
        self.calls: dict[str, _Call] = {}
        self.n_calls = 0
        self.msg = -1
        # The response being written: its request index (-1 when none is open), whether a
        # token_count has claimed it, and its output blocks.
        self.run = -1
        self.run_owned = False
        self.run_blocks: list[_Output] = []
        self.run_calls: set[str] = set()  # call ids of the open response's calls
        #: Outputs of those calls written before the response's token_count (held back).
        self.run_inputs: list[tuple[int, int, str, str, list[str], bool]] = []
        # A token_count that waits for the response after it: (usage, reasoning, ts).
        self.pending: tuple[RecordedUsage, int | None, int] | None = None
        self.last_total: tuple[Any, ...] | None = None
        self.last_context = -1
        self.last_output = 0
        #: Texts of the input items logged since the last token_count; and for the latest
        #: request: (previous context, previous output, its context, its inputs' texts).
        self.inputs: list[str] = []
        self.interval: tuple[int, int, int, list[str]] = (-1, 0, -1, [])
        #: THINKING blocks not yet dropped by a user turn: (block, tokens; 0 if unsized).
        self.thinking: list[tuple[int, int]] = []
        #: Reasoning a user turn may have dropped, waiting for the usage of the first request
        #: after it (`_settle_drops`): (that request, its blocks, their tokens).
        self.drops: list[tuple[int, list[int], int]] = []
        #: ... and with that evidence: the request's context growth beyond its new inputs.
        self.turns: list[tuple[int, list[int], int, int | None]] = []
        self.live_from = 0  # first block not yet compacted away by a recorded compaction
        self.task_items: int | None = None  # response items since the last task_started
        #: The last response called a tool: a user message now comes mid-turn.
        self.last_called = False
        self.windows: dict[str, int] = {}  # model -> the first model_context_window logged
        self.window_last: dict[str, int] = {}  # model -> the latest one
        #: Times of the first entry after each joined line: a resume of a rewritten copy.
        self.restored_ts: list[int] = []
        self._parse(data)

    # -- driver -------------------------------------------------------------------------

    def _parse(self, data: bytes) -> None:
        invalid: list[tuple[int, str]] = []  # invalid-json reports held back: maybe joined

        def report(line: int, category: str, message: str) -> None:
            if category == "invalid-json":
                invalid.append((line, message))
            else:
                self._report(line, category, message)

        for lineno, raw, obj in json_lines(data, report):
            self.stats["lines"] += 1
            entries = [obj]
            if obj is UNREADABLE:
                if not invalid or invalid[-1][0] != lineno:
                    continue
                message = invalid.pop()[1]
                joined = joined_entries(raw)
                if joined is None:
                    self._report(lineno, "invalid-json", message)
                    continue
                self.stats["lines_joined"] += 1
                entries = joined
                resumed = entries[1].get("timestamp")
                if isinstance(resumed, str) and (ts := parse_ts(resumed)) is not None:
                    self.restored_ts.append(ts)
            for entry in entries:
                self._entry(lineno, entry)

    def _entry(self, lineno: int, obj: Any) -> None:
        try:
            self._line(lineno, obj)
        except _BadLine as bad:
            self._report(lineno, bad.category, bad.message)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # A structure no check above foresaw: still a located report, never a crash.
            self._report(lineno, "malformed", f"unexpected structure ({type(exc).__name__})")

    def _report(self, line: int, category: str, message: str) -> None:
        self.problems.report(self.label, line, category, message)

    def _line(self, lineno: int, obj: Any) -> None:
        if not isinstance(obj, dict):
            raise _BadLine("wrong-type", "line is not a JSON object")
        kind = obj.get("type")
        if kind is None:
            raise _BadLine("missing-field", "entry has no 'type'")
        if not isinstance(kind, str):
            raise _BadLine("wrong-type", "entry 'type' is not a string")
        if kind not in TOP_TYPES:
            # Metadata entries (world_state, inter_agent_communication_metadata, ...): the
            # context they describe is logged as response items of its own.
            self.stats["entries_not_context"] += 1
            return
        payload = obj.get("payload")
        if payload is None:
            raise _BadLine("missing-field", "entry has no 'payload'")
        if not isinstance(payload, dict):
            raise _BadLine("wrong-type", "'payload' is not an object")
        if "timestamp" not in obj:
            raise _BadLine("missing-field", "entry has no 'timestamp'")
        ts = parse_ts(obj["timestamp"])
        if ts is None:
            raise _BadLine("wrong-type", "'timestamp' is not an ISO-8601 time in 2020-2100")
        if kind == "session_meta":
            self._session_meta(payload)
        elif kind == "turn_context":
            model = payload.get("model")
            if model is not None and not isinstance(model, str):
                raise _BadLine("wrong-type", "turn_context 'model' is not a string")
            if model:
                self.model = model
        elif kind == "event_msg":
            sub = payload.get("type")
            if not isinstance(sub, str):
                raise _BadLine("missing-field", "event_msg payload has no 'type'")
            if sub == "token_count":
                self._token_count(ts, payload)
            elif sub == "task_started":
                self.task_items = 0
                self.stats["lines_ignored"] += 1
            else:
                self.stats["lines_ignored"] += 1
        elif kind == "response_item":
            self._response_item(lineno, ts, payload)
            if self.task_items is not None:
                self.task_items += 1
        else:
            self._compacted(ts, payload)

    def _session_meta(self, payload: dict[str, Any]) -> None:
        if self.session_id or self.version:  # a resumed or forked rollout repeats it
            self.stats["lines_ignored"] += 1
            return
        sid = payload.get("id")
        version = payload.get("cli_version")
        if sid is not None and not isinstance(sid, str):
            raise _BadLine("wrong-type", "session_meta 'id' is not a string")
        if version is not None and not isinstance(version, str):
            raise _BadLine("wrong-type", "session_meta 'cli_version' is not a string")
        model = payload.get("model")
        if isinstance(model, str) and model and not self.model:
            self.model = model
        self.session_id = sid or ""
        self.version = version or ""

    # -- requests -----------------------------------------------------------------------

    def _new_request(self, ts: int, usage: RecordedUsage | None, reasoning: int | None) -> int:
        self.requests.append(_Request(ts, self.model or "unknown", usage, reasoning))
        return len(self.requests) - 1

    def _flush_pending(self) -> None:
        """A token_count whose response was never logged is a request of its own."""
        if self.pending is not None:
            usage, reasoning, ts = self.pending
            self.pending = None
            self._new_request(ts, usage, reasoning)

    def _close_run(self) -> None:
        """Write the open response's output blocks (its usage is known by now, or never)."""
        if self.run < 0:
            return
        k = self.run
        reasoning = self.requests[k].reasoning
        thinking = [o for o in self.run_blocks if o.kind == Kind.THINKING]
        if reasoning is not None and thinking:
            share, extra = divmod(reasoning, len(thinking))
            for j, o in enumerate(thinking):
                o.tokens = share + (1 if j < extra else 0)
        searches = [o.text for o in self.run_blocks if o.tool == "web_search"]
        if searches and self.requests[k].usage is not None:
            self._search_results(k, "\n".join(searches))
        for o in self.run_blocks:
            idx = self.b.add_block(
                msg=self.msg,
                kind=o.kind,
                role=Role.ASSISTANT,
                text=o.text,
                ts=o.ts,
                first_request=k + 1,
                tool=o.tool,
                flags=o.flags,
                path=o.path,
                origin=k,
                use_id=o.use_id,
                tokens=o.tokens,
            )
            if o.kind == Kind.THINKING:
                self.thinking.append((idx, o.tokens or 0))
        self.last_called = any(o.kind == Kind.TOOL_USE and o.use_id for o in self.run_blocks)
        self.run = -1
        self.run_owned = False
        self.run_blocks = []
        self.run_calls = set()
        inputs, self.run_inputs = self.run_inputs, []
        for args in inputs:
            self._add_tool_output(*args)

    def _search_results(self, k: int, queries: str) -> None:
        """The results of a hosted web search: in request k's context only.

        The server runs ``web_search_call`` inside the response and feeds the results to the
        model there; the rollout logs the call's action, never the results, and the next
        request does not resend them. In shared/traces/codex (git-sync, 0.118-0.120) a
        request with searches grows by 4-12k tokens more than its logged input explains and
        the next one drops back by as much (the drops the anchoring could not place before),
        and its cache read stops before where the results were. So an INJECTED block enters
        at k and leaves at k+1, weighted by that unexplained growth (recorded context minus
        the previous context, the previous response and the raw tokens of the inputs logged
        since), so that the anchoring gives it the growth and takes it back as it leaves.
        """
        self.stats["web_search_results"] += 1
        block = self.b.add_block(
            msg=self.msg,
            kind=Kind.INJECTED,
            role=Role.USER,
            text=queries,
            ts=self.requests[k].ts,
            first_request=k,
            tool="web_search",
            tokens=self._unexplained_growth(),
        )
        self.b.hide(block, k + 1)

    def _unexplained_growth(self) -> int | None:
        """What the latest request's context grew by beyond the previous context, the
        previous response and the inputs logged since (None when unknown or not positive)."""
        before, output, context, texts = self.interval
        if before < 0:
            return None
        grown = context - before - output - sum(count_tokens(t) for t in texts)
        return grown if grown > 0 else None

    def _before_input(self) -> int:
        """Close the open response; the input that follows is seen first by the next request."""
        self._close_run()
        self._flush_pending()
        return len(self.requests)

    def _output(self, ts: int, out: _Output) -> None:
        """Add an output item to the open response, opening one if needed."""
        if self.run >= 0 and self.run_inputs:  # tool outputs came between: a new response
            self._close_run()
        if self.run < 0:
            self.msg += 1
            if self.pending is not None:
                usage, reasoning, pts = self.pending
                self.pending = None
                self.run = self._new_request(pts, usage, reasoning)
                self.run_owned = True
            else:
                self.run = self._new_request(ts, None, None)
                self.run_owned = False
        self.run_blocks.append(out)

    def _window(self, value: Any) -> None:
        """Keep the first positive ``model_context_window`` of the current model; count
        each later change of it."""
        window = _count(value)
        if not window:
            return
        if window > MAX_CONTEXT_TOKENS:
            raise _BadLine(
                "implausible-usage", f"model_context_window {window} exceeds any model's"
            )
        model = self.model or "unknown"
        self.windows.setdefault(model, window)
        if self.window_last.setdefault(model, window) != window:
            self.stats["context_window_changes"] += 1
            self.window_last[model] = window

    def _token_count(self, ts: int, payload: dict[str, Any]) -> None:
        info = payload.get("info")
        if info is None:
            self.stats["token_counts_empty"] += 1
            return
        if not isinstance(info, dict):
            raise _BadLine("wrong-type", "token_count 'info' is not an object")
        self._window(info.get("model_context_window"))
        total = info.get("total_token_usage")
        last = info.get("last_token_usage")
        if total is None or last is None:
            raise _BadLine("missing-field", "token_count info lacks total/last_token_usage")
        if not isinstance(total, dict) or not isinstance(last, dict):
            raise _BadLine("wrong-type", "token usage is not an object")
        key = tuple(total.get(k) for k in USAGE_KEYS)
        if not all(v is None or _count(v) is not None for v in key):
            raise _BadLine("wrong-type", "total_token_usage holds a non-integer count")
        try:
            usage = usage_from_openai(last)
        except ValueError as exc:
            raise _BadLine("wrong-type", f"last_token_usage: {exc}") from None
        reasoning = _count(last.get("reasoning_output_tokens"))
        if reasoning is not None and reasoning > usage.output:
            # Reasoning is part of the output: more of it than output is no count.
            raise _BadLine("implausible-usage", "reasoning_output_tokens exceeds output_tokens")
        if key == self.last_total:
            self.stats["token_counts_repeated"] += 1
            return
        self.last_total = key
        self.stats["token_counts"] += 1
        self.interval = (self.last_context, self.last_output, usage.context, self.inputs)
        self.inputs = []
        self.last_context = usage.context
        self.last_output = usage.output
        if self.run >= 0 and not self.run_owned:  # items-first ordering (newer Codex)
            self.requests[self.run].usage = usage
            self.requests[self.run].reasoning = reasoning
            self._settle_drops(self.run)
            self._close_run()
            return
        self._close_run()
        self._flush_pending()  # two token_counts with no response between them
        self._settle_drops(len(self.requests))
        self.pending = (usage, reasoning, ts)  # usage-first ordering (Codex <= 0.42)

    def _settle_drops(self, owner: int) -> None:
        """Record, for each user turn whose first request is `owner`, how that request's
        context changed beyond its new inputs (the evidence `_apply_drops` weighs)."""
        if not self.drops:
            return
        before, output, context, texts = self.interval
        pending: list[tuple[int, list[int], int]] = []
        for k, blocks, tokens in self.drops:
            if k > owner:
                pending.append((k, blocks, tokens))
                continue
            grown = None
            if k == owner and before >= 0 and tokens > 0:
                grown = context - before - output - sum(count_tokens(t) for t in texts)
            self.turns.append((k, blocks, tokens, grown))
        self.drops = pending

    def _apply_drops(self) -> None:
        """Hide the reasoning before each user turn from that turn on, for the models that
        drop it (`REASONING_AT_USER_TURN`; a model it does not know: the session's turns
        vote, see there)."""
        self.drops, undecided = [], [(k, b, t, None) for k, b, t in self.drops]
        turns = self.turns + undecided
        votes: dict[str, list[int]] = {}
        for k, _, tokens, grown in turns:
            if grown is not None:
                vote = votes.setdefault(self._model_of(k), [0, 0])
                vote[0 if grown < -tokens // 2 else 1] += 1
        for k, blocks, _, _ in turns:
            model = self._model_of(k)
            kept = reasoning_kept(model)
            if kept is None:
                shrank, grew = votes.get(model, [0, 0])
                kept = grew > shrank
            if kept:
                self.stats["reasoning_kept_at_user_turn"] += 1
                continue
            for block in blocks:
                self.b.hide(block, k)

    def _model_of(self, k: int) -> str:
        return self.requests[k].model if k < len(self.requests) else self.model or "unknown"

    # -- items --------------------------------------------------------------------------

    def _response_item(self, lineno: int, ts: int, p: dict[str, Any]) -> None:
        kind = p.get("type")
        if kind is None:
            raise _BadLine("missing-field", "response_item payload has no 'type'")
        if not isinstance(kind, str):
            raise _BadLine("wrong-type", "response_item 'type' is not a string")
        if kind == "message":
            self._message(ts, p)
        elif kind == "agent_message":  # 0.147 multi-agent: a message from another agent
            self._message(ts, {**p, "role": "user"}, human=False)
        elif kind in OUTPUT_ITEMS:
            self._output_item(ts, kind, p)
        elif kind in INPUT_ITEMS:
            self._tool_output(lineno, ts, p)
        elif kind in IGNORED_ITEMS:
            self.stats["lines_ignored"] += 1
        else:
            raise _BadLine("unknown-type", f"unknown response_item type {kind[:40]!r}")

    def _message(self, ts: int, p: dict[str, Any], *, human: bool = True) -> None:
        role = p.get("role")
        if not isinstance(role, str):
            raise _BadLine("missing-field", "message has no 'role'")
        if role not in ("assistant", "user", "developer", "system"):
            raise _BadLine("unknown-type", f"unknown message role {role[:20]!r}")
        content = p.get("content")
        if not isinstance(content, list):
            raise _BadLine("wrong-type", "message 'content' is not a list")
        parts = self._content_parts(content)
        if role == "assistant":
            for kind, text in parts:
                tokens = IMAGE_TOKENS if kind == Kind.IMAGE else None
                self._output(ts, _Output(kind, text, ts, tokens=tokens))
            return
        k = self._before_input()
        self.msg += 1
        flags = Flag.NONE
        if role == "user":
            head = next((text for kind, text in parts if kind == Kind.TEXT), "")
            version = version_tuple(self.version)
            kept = self.last_called and MID_TURN_KEEPS_REASONING[0] <= version
            kept = kept and version < MID_TURN_KEEPS_REASONING[1]
            if self.thinking and not kept:  # the reasoning before a user turn may be dropped
                blocks = [b for b, _ in self.thinking]
                self.drops.append((k, blocks, sum(t for _, t in self.thinking)))
                self.thinking = []
            if human and not head.lstrip().startswith(INJECTED_PREFIXES):
                flags = Flag.HUMAN
        self.inputs.extend(text for kind, text in parts if kind == Kind.TEXT)
        for kind, text in parts:
            self.b.add_block(
                msg=self.msg,
                kind=kind,
                role=Role.USER if role == "user" else Role.SYSTEM,
                text=text,
                ts=ts,
                first_request=k,
                flags=flags,
                tokens=IMAGE_TOKENS if kind == Kind.IMAGE else None,
            )

    def _content_parts(self, content: list[Any]) -> list[tuple[Kind, str]]:
        """Validate a message's content items first, so a bad line adds nothing."""
        parts: list[tuple[Kind, str]] = []
        for c in content:
            if not isinstance(c, dict):
                raise _BadLine("wrong-type", "message content item is not an object")
            ctype = c.get("type")
            if ctype in ("input_text", "output_text", "text", "refusal"):
                text = c.get("text", c.get("refusal"))
                if not isinstance(text, str):
                    raise _BadLine("wrong-type", "message text is not a string")
                parts.append((Kind.TEXT, text))
            elif ctype == "input_image":
                url = c.get("image_url")
                parts.append((Kind.IMAGE, url if isinstance(url, str) else ""))
            else:
                self.stats["content_items_unknown"] += 1
        return parts

    def _output_item(self, ts: int, kind: str, p: dict[str, Any]) -> None:
        if kind == "reasoning":
            parts: list[str] = []
            for field in ("summary", "content"):
                items = p.get(field)
                if items is None:
                    continue
                if not isinstance(items, list):
                    raise _BadLine("wrong-type", f"reasoning '{field}' is not a list")
                parts.extend(
                    t for c in items if isinstance(c, dict) for t in [_content_text(c)] if t
                )
            self._output(ts, _Output(Kind.THINKING, "\n".join(parts), ts))
            return
        call_id = p.get("call_id", p.get("id"))
        if kind in ("function_call", "custom_tool_call"):
            name = p.get("name")
            raw = p.get("arguments" if kind == "function_call" else "input")
            if not isinstance(name, str):
                raise _BadLine("missing-field", f"{kind} has no 'name'")
            if not isinstance(raw, str):
                raise _BadLine("wrong-type", f"{kind} arguments are not a string")
            args: Any = raw
            if kind == "function_call":
                try:
                    args = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    args = raw
            text = raw
        else:  # local_shell_call, web_search_call, ...: the action is the input
            name = {"local_shell_call": "local_shell", "web_search_call": "web_search"}.get(
                kind, kind
            )
            action = p.get("action")
            args = action if isinstance(action, dict) else {}
            text = orjson.dumps(action, option=orjson.OPT_SORT_KEYS).decode()
        if call_id is not None and not isinstance(call_id, str):
            raise _BadLine("wrong-type", f"{kind} 'call_id' is not a string")
        flags, path = call_file_access(name, args)
        key = None
        if call_id:
            self.n_calls += 1
            key = f"c{self.n_calls}"
            self.calls[call_id] = _Call(key, name, flags, path)
        out = _Output(Kind.TOOL_USE, text, ts, tool=name, flags=flags, path=path, use_id=key)
        self._output(ts, out)
        if call_id:
            self.run_calls.add(call_id)

    def _tool_output(self, lineno: int, ts: int, p: dict[str, Any]) -> None:
        call_id = p.get("call_id")
        if not isinstance(call_id, str):
            raise _BadLine("missing-field", "tool output has no 'call_id'")
        if "output" in p and p["output"] is not None:
            text, images, failed = _output_text(p["output"])
        elif isinstance(p.get("tools"), list):  # tool_search_output: the tools it loaded
            text = orjson.dumps(p["tools"], option=orjson.OPT_SORT_KEYS).decode()
            images, failed = [], p.get("status") not in (None, "completed")
        else:
            raise _BadLine("missing-field", "tool output has no 'output'")
        if self.run >= 0 and not self.run_owned and call_id in self.run_calls:
            # 0.14x: the outputs of the open response's own calls can be written before its
            # token_count; they wait, so that the token_count still finds its response.
            self.run_inputs.append((lineno, ts, call_id, text, images, failed))
            return
        self._add_tool_output(lineno, ts, call_id, text, images, failed)

    def _add_tool_output(
        self, lineno: int, ts: int, call_id: str, text: str, images: list[str], failed: bool
    ) -> None:
        k = self._before_input()
        self.msg += 1
        self.inputs.append(text)
        call = self.calls.get(call_id)
        if call is None:
            self._report(lineno, "orphan-tool-result", "tool output has no matching call")
            tool, path, flags = None, None, Flag.REGENERABLE
        else:
            tool, path = call.tool, call.path
            flags = call.flags
            if not (flags & Flag.PATH_WRITE or call.tool == "apply_patch"):
                flags |= Flag.REGENERABLE
        if failed:
            flags |= Flag.ERROR
        self.b.add_block(
            msg=self.msg,
            kind=Kind.TOOL_RESULT,
            role=Role.USER,
            text=text,
            ts=ts,
            first_request=k,
            tool=tool,
            flags=flags,
            path=path,
            result_for=call.key if call else None,
        )
        for j, url in enumerate(images):
            self.b.add_block(
                msg=self.msg,
                kind=Kind.IMAGE,
                role=Role.USER,
                text=url or f"{call_id}:{j}",
                ts=ts,
                first_request=k,
                tool=tool,
                tokens=IMAGE_TOKENS,
            )

    def _compacted(self, ts: int, p: dict[str, Any]) -> None:
        """A recorded compaction: the replacement history enters, everything before leaves.

        The summary block is the ``message`` when it has text (older Codex), else the
        ``compaction`` item of the replacement history (0.141+ remote compaction: an opaque
        ``encrypted_content`` handle of about 150 characters, sized 0 here), else an empty
        SUMMARY block: in 0.118-0.140 the history holds only the kept messages, the summary
        is not logged. Either way the builder sizes the kept messages from their text and
        books the rest of the recorded context after as an INJECTED artifact (the unlogged
        summary), as it does for Claude Code's compactions.
        """
        message = p.get("message")
        history = p.get("replacement_history")
        if message is None and history is None:
            raise _BadLine("missing-field", "compacted entry has no 'message'")
        if message is not None and not isinstance(message, str):
            raise _BadLine("wrong-type", "compacted 'message' is not a string")
        if history is not None and not isinstance(history, list):
            raise _BadLine("wrong-type", "compacted 'replacement_history' is not a list")
        trigger = self._compaction_trigger()
        k = self._before_input()
        self.msg += 1
        start = self.b.n_blocks
        summary = -1
        items = [item for item in history or [] if isinstance(item, dict)]
        if message:
            summary = self._artifact(Kind.SUMMARY, Role.USER, message, ts, k)
        for item in items:
            kind, role, text = _history_item(item)
            if kind == Kind.SUMMARY and summary < 0:
                summary = self._artifact(kind, role, text, ts, k, tokens=0)
            else:
                self._artifact(kind, role, text, ts, k)
        if summary < 0:
            summary = self._artifact(Kind.SUMMARY, Role.USER, "", ts, k, tokens=0)
        for block in range(self.live_from, start):
            self.b.compact_away(block, k)
        self.live_from = start
        self.stats["compactions"] += 1
        event = CompactionEvent(
            request=k,
            trigger=trigger,
            pre_tokens=self.last_context,
            summary_block=summary,
            ts=ts,
        )
        self.b.add_event(event)

    def _artifact(
        self, kind: Kind, role: Role, text: str, ts: int, k: int, tokens: int | None = None
    ) -> int:
        return self.b.add_block(
            msg=self.msg,
            kind=kind,
            role=role,
            text=text,
            ts=ts,
            first_request=k,
            flags=Flag.ARTIFACT,
            tokens=tokens,
        )

    def _compaction_trigger(self) -> str:
        """ "manual" for a compaction that is a task of its own, else "auto".

        Codex 0.118+ opens every task with ``task_started``. ``/compact`` runs as a task with
        no input and no model output before the ``compacted`` entry (the one such case in
        shared/traces/codex, agentv 0.142.5, ends with ``task_complete`` right after it, at
        73% of the window: below any automatic limit); the automatic compaction runs inside
        a user's task, after that task's messages or tool outputs (19 of 20 recorded ones,
        all mid-turn, at 81-93% of the window). Without ``task_started`` it is "unknown".
        """
        if self.task_items is None:
            return "unknown"
        return "manual" if self.task_items == 0 else "auto"

    # -- finishing ----------------------------------------------------------------------

    def finish(self, token_cache: dict[int, int]) -> Session:
        self._close_run()
        self._flush_pending()
        self._apply_drops()
        self.b.id = self.session_id or self.stem
        self.b.client = f"codex {self.version}".strip()
        last = 0
        for req in self.requests:
            if req.ts < last:
                self.stats["timestamps_clamped"] += 1
                req.ts = last
            last = req.ts
            if req.usage is None:
                self.stats["requests_without_usage"] += 1
            self.b.add_request(ts=req.ts, model=req.model, usage=req.usage)
        session = self.b.finish(token_cache)
        if self.windows:
            session.context_windows = [self.windows.get(m, -1) for m in session.models]
        times = [req.ts for req in self.requests]
        session.restored_at = sorted(
            {k for t in self.restored_ts if (k := bisect_left(times, t)) < len(times)}
        )
        add_counts(self.stats, self.b.stats)
        return session


def _output_text(output: Any) -> tuple[str, list[str], bool]:
    """Text of a tool output, its image URLs, and whether it reports a failure."""
    failed = False
    images: list[str] = []
    if isinstance(output, dict):  # {"content": ..., "success": bool}
        failed = output.get("success") is False
        output = output.get("content", output.get("output", ""))
    if isinstance(output, str):
        failed = failed or _header_exit_code(output) not in (None, 0)
        if output.startswith('{"output"'):
            try:
                parsed = orjson.loads(output)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                meta = parsed.get("metadata")
                code = meta.get("exit_code") if isinstance(meta, dict) else None
                failed = failed or (isinstance(code, int) and code != 0)
        return output, images, failed
    if isinstance(output, list):
        parts: list[str] = []
        for item in output:
            if not isinstance(item, dict):
                raise _BadLine("wrong-type", "tool output item is not an object")
            if item.get("type") == "input_image":
                url = item.get("image_url")
                images.append(url if isinstance(url, str) else "")
            else:
                text = item.get("text")
                if isinstance(text, str):
                    parts.append(text)
        text = "\n".join(parts)
        failed = failed or _header_exit_code(text) not in (None, 0)
        return text, images, failed
    if output is None:
        return "", images, failed
    raise _BadLine("wrong-type", "tool 'output' is neither text nor a list")


_EXIT_LINE = re.compile(r"^(?:Process exited with code|Exit code:) (\d+)\s*$")


def _header_exit_code(text: str) -> int | None:
    """Exit code in the header Codex 0.118+ puts before a command's ``Output:`` line.

    ``exec_command`` writes ``Process exited with code N``, the freeform shell ``Exit code:
    N``; only the header is read, so a command that prints such a line is not misread.
    """
    for line in text[:1000].split("\n")[:8]:
        if line.startswith("Output:"):
            return None
        m = _EXIT_LINE.match(line)
        if m:
            return int(m.group(1))
    return None


def _history_item(item: dict[str, Any]) -> tuple[Kind, Role, str]:
    """Kind, role and text of a replacement_history item (kept as an ARTIFACT block)."""
    kind = item.get("type")
    if kind == "message":
        content = item.get("content")
        texts = []
        if isinstance(content, list):
            texts = [t for c in content if isinstance(c, dict) for t in [_content_text(c)] if t]
        role = {"assistant": Role.ASSISTANT, "user": Role.USER}.get(
            str(item.get("role")), Role.SYSTEM
        )
        return Kind.TEXT, role, "\n".join(texts)
    if kind in ("function_call", "custom_tool_call"):
        text = item.get("arguments", item.get("input"))
        return Kind.TOOL_USE, Role.ASSISTANT, text if isinstance(text, str) else ""
    if kind in INPUT_ITEMS:
        text, _, _ = _output_text(item.get("output"))
        return Kind.TOOL_RESULT, Role.USER, text
    if kind == "reasoning":
        return Kind.THINKING, Role.ASSISTANT, ""
    enc = item.get("encrypted_content")  # a "compaction" item: the server-side summary
    return Kind.SUMMARY, Role.USER, enc if isinstance(enc, str) else ""


def read(unit: ImportUnit, contents: list[bytes], problems: Problems) -> Trace:
    """Compile a Codex rollout into a Trace (one main session per file of the unit)."""
    hasher = hasher_for(unit, contents)
    token_cache: dict[int, int] = {}
    sessions: list[Session] = []
    stats: dict[str, int] = {}
    for f, data in zip(unit.files, contents, strict=True):
        stem = f.path.name.split(".")[0]
        reader = _RolloutReader(f.label, stem, data, problems, hasher)
        sessions.append(reader.finish(token_cache))
        add_counts(stats, reader.stats)
    return unit_trace("codex", unit, contents, sessions, problems, stats)
