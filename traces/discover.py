"""Find the traces under the paths a user gives and group them into import units.

The format is detected from content (the first JSON values of the file), not from the name:
a renamed or gzipped file is still read by the right reader.

Claude Code files that repeat one another's calls belong to one import unit, so that each
call is counted once: a resumed session (`claude --resume`, `--continue`, `--fork-session`)
starts a new file with a copy of the earlier file's lines (same `message.id`s) and goes on
from there. ../shared/traces/claude-code holds five such pairs: m-claude ff33b5b0 copies 18
calls of f225835b (its copied lines keep the old `sessionId`), flutter-docker aba9151e copies
94 of 390ab778 and three wakil pairs copy 41-63 calls (their copied lines carry the *new*
`sessionId`, so the session id cannot tell). In every pair the copy starts with the earlier
file's first call, so files are grouped by the id of their first API call; the reader
(traces/claude_code.py) then decides which file continues which.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import orjson

from traces.errors import TraceError
from traces.source import (
    GZIP_MAGIC,
    INCOMPLETE,
    INCOMPLETE_MARKER,
    INCOMPLETE_MESSAGE,
    ImportUnit,
    SourceFile,
    iter_files,
    shown,
)

SUFFIXES = (".jsonl", ".json", ".traj", ".ctxt")
CODEX_TYPES = {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
#: Every Claude Code conversation line has `parentUuid` (null at a root); summary lines have
#: `leafUuid`. Other tools' logs that merely carry a `sessionId` (history files, Gemini CLI
#: sessions) have neither.
CLAUDE_KEYS = {"parentUuid", "leafUuid"}
CLAUDE_TYPES = {"file-history-snapshot", "queue-operation"}
COMPILED_MAGIC = b"PK"
_PEEK = 1 << 16
#: Lines the detector reads before it gives up on a file: enough to pass the metadata lines
#: 2.1.x writes first (`last-prompt`, `ai-title`, `permission-mode`, ...).
DETECT_LINES = 50
#: Bytes the detector reads at most: a first line longer than this is a line it cannot judge
#: (the transcript reader itself accepts lines up to traces.jsonl.MAX_LINE_BYTES).
DETECT_BYTES = 64 << 20
#: Lines read to find a Claude Code file's first API call (metadata and long prompts first).
FIRST_CALL_LINES = 400
_AGENT = re.compile(r"^agent-(?P<id>[A-Za-z0-9_-]+)\.jsonl(\.gz)?$")


def _open(f: SourceFile) -> IO[bytes]:
    """The file for reading, gunzipped when it is gzip (by content, not by name).

    A file that cannot be opened is a TraceError naming it (R14: a file the user may not
    read, met in a directory, was a PermissionError traceback). It is an error, not a
    counted skip: leaving one session out of a directory changes every total the run
    prints, which a user who named the directory does not expect; the message says which
    file to fix, or to leave out by naming the readable ones.
    """
    try:
        fh = f.path.open("rb")
        if fh.read(2) == GZIP_MAGIC:
            fh.close()
            return cast(IO[bytes], gzip.open(f.path, "rb"))
        fh.seek(0)
    except OSError as exc:
        raise TraceError(f.label, 0, "unreadable", f"cannot read file: {exc.strerror}") from None
    return fh


def _head(f: SourceFile) -> bytes:
    """The first bytes of the file (gunzipped)."""
    try:
        with _open(f) as fh:
            return fh.read(_PEEK)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f.label, 0, "bad-gzip", f"corrupt gzip data: {exc}") from exc


def head_objects(f: SourceFile, max_lines: int, max_bytes: int | None = None) -> Iterator[Any]:
    """The parsed JSON values of the file's first `max_lines` complete lines, read line by
    line, so a first line of any length (up to `max_bytes`, default DETECT_BYTES, read in
    all) is judged whole. Lines that do not parse yield nothing."""
    max_bytes = DETECT_BYTES if max_bytes is None else max_bytes
    read = 0
    try:
        with _open(f) as fh:
            for _ in range(max_lines):
                line = fh.readline(max_bytes - read + 1)
                if not line:
                    return
                read += len(line)
                if read > max_bytes:
                    return
                if not line.strip():
                    continue
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f.label, 0, "bad-gzip", f"corrupt gzip data: {exc}") from exc


def detect(f: SourceFile) -> str:
    """'claude-code', 'codex', 'swe-agent' or 'compiled'; raise when none fits."""
    head = _head(f)
    if head[:2] == COMPILED_MAGIC:
        return "compiled"
    stripped = head.lstrip()
    if not stripped:  # the reader for its kind of name reports it (or, lenient, counts it)
        return "swe-agent" if f.path.suffix in (".traj", ".json") else "claude-code"
    if stripped[:1] == b"{" and (b'"trajectory"' in head or f.path.suffix == ".traj"):
        return "swe-agent"
    for obj in head_objects(f, DETECT_LINES):
        if not isinstance(obj, dict):
            continue
        kind = obj.get("type")
        if not isinstance(kind, str):  # a list is unhashable (issue 17, R01)
            kind = None
        if "payload" in obj and kind in CODEX_TYPES:
            return "codex"
        if CLAUDE_KEYS & obj.keys() or kind in CLAUDE_TYPES:
            return "claude-code"
        if "trajectory" in obj and "history" in obj:
            return "swe-agent"
    raise TraceError(f.label, 1, "unknown-format", "not a Claude Code, Codex or SWE-agent trace")


@dataclass(frozen=True)
class ClaudeHead:
    """What grouping needs from the start of a Claude Code file."""

    session_id: str | None  # the first `sessionId`
    first_call: str | None  # message id of the first API call (not a `<synthetic>` line)


def claude_head(f: SourceFile) -> ClaudeHead:
    """The first session id and first API call of a Claude Code file."""
    sid: str | None = None
    for obj in head_objects(f, FIRST_CALL_LINES):
        if not isinstance(obj, dict):
            continue
        if sid is None and isinstance(obj.get("sessionId"), str):
            sid = str(obj["sessionId"])
        call = _call_id(obj)
        if call is not None:
            return ClaudeHead(sid, call)
    return ClaudeHead(sid, None)


def _call_id(obj: dict[str, Any]) -> str | None:
    """The id of the API call an assistant line belongs to (as traces/claude_code.py keys it)."""
    msg = obj.get("message")
    if obj.get("type") != "assistant" or not isinstance(msg, dict):
        return None
    if msg.get("model") == "<synthetic>" or obj.get("isApiErrorMessage"):
        return None
    mid = msg.get("id") or obj.get("requestId")
    return mid if isinstance(mid, str) else None


def discover(paths: list[Path]) -> list[ImportUnit]:
    """Import units under `paths`, in a deterministic order."""
    return discover_all(paths)[0]


def discover_all(paths: list[Path]) -> tuple[list[ImportUnit], list[str]]:
    """Import units under `paths`, and the labels of files found there that are not traces.

    A file named on the command line must be a trace (else TraceError); files met while
    walking a directory that hold no trace of a known format (notes, expected-value files,
    other tools' logs) are passed over and listed instead: every command counts them in its
    summary line.
    """
    files: list[tuple[SourceFile, bool]] = []
    for p in paths:
        if not p.exists():
            raise TraceError(shown(p.name), 0, "not-found", "no such file or directory")
        if not p.is_file() and not p.is_dir():  # a FIFO would block, or read as "0 traces"
            raise TraceError(
                shown(p.name), 0, "not-a-file", "not a regular file or directory (FIFO, device?)"
            )
        files.extend((f, p.is_file()) for f in iter_files(p, SUFFIXES))
    units: list[ImportUnit] = []
    not_traces: list[str] = []
    claude: list[tuple[SourceFile, ClaudeHead]] = []
    seen: set[Path] = set()
    incomplete: dict[Path, bool] = {}
    for f, explicit in files:
        key = f.path.resolve()
        if key in seen:  # the same file given twice (a directory and a file in it)
            continue
        seen.add(key)
        try:
            fmt = detect(f)
        except TraceError as exc:
            if explicit or exc.category != "unknown-format":
                raise
            not_traces.append(f.label)
            continue
        if fmt == "compiled" and _incomplete(f.path.parent, incomplete):
            raise TraceError(f.label, 0, INCOMPLETE, INCOMPLETE_MESSAGE)
        if fmt == "claude-code":
            claude.append((f, claude_head(f)))
        else:
            units.append(ImportUnit(fmt, [f]))
    units.extend(_group_claude(claude))
    units.sort(key=lambda u: u.label)
    return units, not_traces


def _incomplete(directory: Path, known: dict[Path, bool]) -> bool:
    """Whether `directory` holds the marker of an unfinished import (traces/load.py)."""
    if directory not in known:
        known[directory] = (directory / INCOMPLETE_MARKER).exists()
    return known[directory]


def _group_claude(files: list[tuple[SourceFile, ClaudeHead]]) -> list[ImportUnit]:
    """Attach agent-*.jsonl files to the session they belong to, and resumed files to the
    file they resume.

    A subagent file names its parent in `sessionId` (2.0.x, beside the parent) or lives in
    `<sessionId>/subagents/` (2.1.x). `agent-acompact-*` files are the parent's compaction
    requests. Session files whose first API call is the same call (see the module docstring)
    form one unit: the first by label is `files[0]`, the others have the role "resume". A
    subagent whose parent is absent is imported as a trace of its own.
    """
    mains: dict[str, ImportUnit] = {}
    by_call: dict[str, ImportUnit] = {}
    agents: list[tuple[SourceFile, str | None]] = []
    units: list[ImportUnit] = []
    ordered = sorted(files, key=lambda item: item[0].label)
    for f, head in ordered:
        sid = head.session_id
        if _AGENT.match(f.path.name):
            parent_dir = f.path.parent
            if parent_dir.name == "subagents":
                sid = parent_dir.parent.name
            agents.append((f, sid))
            continue
        stem = f.path.name.split(".")[0]
        unit = by_call.get(head.first_call) if head.first_call is not None else None
        if unit is not None:
            unit.files.append(f)
            unit.roles.append("resume")
        else:
            unit = ImportUnit("claude-code", [f])
            units.append(unit)
            if head.first_call is not None:
                by_call[head.first_call] = unit
        for key in (sid, stem):
            if key and key not in mains:
                mains[key] = unit
    for f, sid in agents:
        parent = mains.get(sid or "")
        if parent is None:
            units.append(ImportUnit("claude-code", [f]))
            continue
        is_compact = f.path.name.startswith("agent-acompact")
        parent.files.append(f)
        parent.roles.append("compaction" if is_compact else "subagent")
    return units
