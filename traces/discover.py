"""Find the traces under the paths a user gives and group them into import units.

The format is detected from content (the first JSON value of the file), not from the name:
a renamed or gzipped file is still read by the right reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from traces.errors import TraceError
from traces.source import GZIP_MAGIC, ImportUnit, SourceFile, iter_files

SUFFIXES = (".jsonl", ".json", ".traj", ".ctxt")
CODEX_TYPES = {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
#: Every Claude Code conversation line has `parentUuid` (null at a root); summary lines have
#: `leafUuid`. Other tools' logs that merely carry a `sessionId` (history files, Gemini CLI
#: sessions) have neither.
CLAUDE_KEYS = {"parentUuid", "leafUuid"}
CLAUDE_TYPES = {"file-history-snapshot", "queue-operation"}
COMPILED_MAGIC = b"PK"
_PEEK = 1 << 16
_AGENT = re.compile(r"^agent-(?P<id>[A-Za-z0-9_-]+)\.jsonl(\.gz)?$")


def _peek(f: SourceFile) -> bytes:
    with f.path.open("rb") as fh:
        head = fh.read(_PEEK)
    if head[:2] == GZIP_MAGIC:
        import gzip
        import zlib

        try:
            with gzip.open(f.path, "rb") as gz:
                head = gz.read(_PEEK)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f.label, 0, "bad-gzip", f"corrupt gzip data: {exc}") from exc
    return head


def detect(f: SourceFile) -> str:
    """'claude-code', 'codex', 'swe-agent' or 'compiled'; raise when none fits."""
    head = _peek(f)
    if head[:2] == COMPILED_MAGIC:
        return "compiled"
    stripped = head.lstrip()
    if not stripped:  # the reader for its kind of name reports it (or, lenient, counts it)
        return "swe-agent" if f.path.suffix in (".traj", ".json") else "claude-code"
    if stripped[:1] == b"{" and (b'"trajectory"' in head or f.path.suffix == ".traj"):
        return "swe-agent"
    for lineno, line in enumerate(head.splitlines()[:50], start=1):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        kind = obj.get("type")
        if "payload" in obj and kind in CODEX_TYPES:
            return "codex"
        if CLAUDE_KEYS & obj.keys() or kind in CLAUDE_TYPES:
            return "claude-code"
        if "trajectory" in obj and "history" in obj:
            return "swe-agent"
        del lineno
    raise TraceError(f.label, 1, "unknown-format", "not a Claude Code, Codex or SWE-agent trace")


def _claude_session_id(f: SourceFile) -> str | None:
    for line in _peek(f).splitlines()[:50]:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("sessionId"), str):
            return str(obj["sessionId"])
    return None


def discover(paths: list[Path]) -> list[ImportUnit]:
    """Import units under `paths`, in a deterministic order."""
    return discover_all(paths)[0]


def discover_all(paths: list[Path]) -> tuple[list[ImportUnit], list[str]]:
    """Import units under `paths`, and the labels of files found there that are not traces.

    A file named on the command line must be a trace (else TraceError); files met while
    walking a directory that hold no trace of a known format (notes, expected-value files,
    other tools' logs) are passed over and listed instead.
    """
    files: list[tuple[SourceFile, bool]] = []
    for p in paths:
        if not p.exists():
            raise TraceError(str(p.name), 0, "not-found", "no such file or directory")
        files.extend((f, p.is_file()) for f in iter_files(p, SUFFIXES))
    units: list[ImportUnit] = []
    not_traces: list[str] = []
    claude: list[tuple[SourceFile, str | None]] = []
    for f, explicit in files:
        try:
            fmt = detect(f)
        except TraceError as exc:
            if explicit or exc.category != "unknown-format":
                raise
            not_traces.append(f.label)
            continue
        if fmt == "claude-code":
            claude.append((f, _claude_session_id(f)))
        else:
            units.append(ImportUnit(fmt, [f]))
    units.extend(_group_claude(claude))
    units.sort(key=lambda u: u.label)
    return units, not_traces


def _group_claude(files: list[tuple[SourceFile, str | None]]) -> list[ImportUnit]:
    """Attach agent-*.jsonl files to the session they belong to.

    A subagent file names its parent in `sessionId` (2.0.x, beside the parent) or lives in
    `<sessionId>/subagents/` (2.1.x). `agent-acompact-*` files are the parent's compaction
    requests. A subagent whose parent is absent is imported as a trace of its own.
    """
    mains: dict[str, ImportUnit] = {}
    agents: list[tuple[SourceFile, str | None]] = []
    units: list[ImportUnit] = []
    for f, sid in files:
        if _AGENT.match(f.path.name):
            parent_dir = f.path.parent
            if parent_dir.name == "subagents":
                sid = parent_dir.parent.name
            agents.append((f, sid))
            continue
        unit = ImportUnit("claude-code", [f])
        stem = f.path.name.split(".")[0]
        key = sid or stem
        if key in mains:  # a second file of one session id (resumed): a trace of its own
            units.append(unit)
            continue
        mains[key] = unit
        if stem != key and stem not in mains:
            mains[stem] = unit
    for f, sid in agents:
        parent = mains.get(sid or "")
        if parent is None:
            units.append(ImportUnit("claude-code", [f]))
            continue
        is_compact = f.path.name.startswith("agent-acompact")
        parent.files.append(f)
        parent.roles.append("compaction" if is_compact else "subagent")
    seen: set[int] = set()
    for unit in mains.values():
        if id(unit) not in seen:
            seen.add(id(unit))
            units.append(unit)
    return units
