"""Which sessions a command reads: `--since`, `--until`, `--project`, `--session`, and the
facts they test (session id, project name, start time), read from the start of each file
before anything is compiled, so that a filter over a year of sessions costs one short read
per file.

- Start time: the earliest `timestamp` among the first lines of the unit's main and resumed
  files (trace time, UTC; a resumed file copies the earlier file's first lines, so the
  earliest is the session's first). A compiled `.ctxt` file: its first request. A session
  with no time (SWE-agent trajectories log none) is left out by `--since` and `--until`.
- Session id: Claude Code's `sessionId` (Codex: `session_meta.payload.id`), else the file
  name's stem; `--session` matches the start of either (a uuid prefix, as git takes one).
- Project: the last component of the session's working directory (`cwd`, Codex
  `session_meta.payload.cwd`); without one, the name of the folder the main file is in,
  with the encoded home folder taken off a Claude Code project folder's name (Claude Code
  names it by the cwd with every character but letters and digits turned into `-`, which
  cannot be decoded exactly). `--project` matches names case-insensitively, with `*` and
  `?` wildcards.

Project names come from the user's paths, so they are shown in terminal tables only and
never written to a file (tests/test_no_content_leak.py, issue 15).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from traces import compiled
from traces.claude_code import parse_ts
from traces.discover import head_objects
from traces.source import ImportUnit, SourceFile

#: Lines read from the start of a file to find its session id, cwd and first timestamp
#: (2.1.x writes up to a few dozen metadata lines first).
HEAD_LINES = 200
#: Bytes read at most from the start of a file for those facts (a first line may hold a
#: long pasted prompt; what is not found in this many bytes is taken as absent).
HEAD_BYTES = 8 << 20
_ENCODED = re.compile(r"[^A-Za-z0-9]")
_DAY_MS = 86_400_000


@dataclass(frozen=True)
class SessionInfo:
    """What the filters and the terminal tables know of one import unit."""

    session: str
    stem: str
    project: str | None
    start_ms: int | None
    format: str = ""

    @property
    def start_text(self) -> str:
        """The start time as `YYYY-MM-DD HH:MM` UTC, `-` when unknown."""
        if self.start_ms is None:
            return "-"
        return datetime.fromtimestamp(self.start_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def parse_date(text: str) -> date:
    """`YYYY-MM-DD` or `YYYYMMDD` (as ccusage takes them); ValueError otherwise."""
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            return datetime.strptime(text.strip(), fmt).date()
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a date (YYYY-MM-DD or YYYYMMDD)")


def _day_ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


@dataclass(frozen=True)
class Filters:
    """The sessions a command keeps: started on or after `since` and on or before `until`
    (whole UTC days), of any of `projects`, with an id starting with any of `sessions`,
    recorded by `agent` ("all", or a format: "claude-code", "codex")."""

    since: date | None = None
    until: date | None = None
    projects: tuple[str, ...] = ()
    sessions: tuple[str, ...] = ()
    agent: str = "all"

    @property
    def active(self) -> bool:
        return bool(self.since or self.until or self.projects or self.sessions) or (
            self.agent != "all"
        )

    def keeps(self, info: SessionInfo) -> bool:
        if self.agent != "all" and info.format != self.agent:
            return False
        if self.since is not None or self.until is not None:
            if info.start_ms is None:
                return False
            if self.since is not None and info.start_ms < _day_ms(self.since):
                return False
            if self.until is not None and info.start_ms >= _day_ms(self.until) + _DAY_MS:
                return False
        if self.projects:
            name = (info.project or "").lower()
            if not any(fnmatch.fnmatchcase(name, p.lower()) for p in self.projects):
                return False
        if self.sessions:
            ids = (info.session.lower(), info.stem.lower())
            if not any(i.startswith(s.lower()) for s in self.sessions for i in ids):
                return False
        return True

    def describe(self) -> str:
        """The filters as the user gave them, for the line saying what was read."""
        parts = []
        if self.since is not None:
            parts.append(f"since {self.since.isoformat()}")
        if self.until is not None:
            parts.append(f"until {self.until.isoformat()}")
        if self.projects:
            parts.append("project " + ", ".join(self.projects))
        if self.sessions:
            parts.append("session " + ", ".join(self.sessions))
        if self.agent != "all":
            parts.append(f"agent {self.agent}")
        return "; ".join(parts)


def _last_component(cwd: str) -> str | None:
    name = re.split(r"[\\/]", cwd.rstrip("\\/"))[-1]
    return name or None


def folder_project(folder: str, home: Path | None) -> str:
    """A project name from the folder a session file is in: a Claude Code project folder
    (`-home-me-src-app`) without its encoded home prefix (`src-app`), else the name."""
    if home is not None and folder.startswith("-"):
        prefix = _ENCODED.sub("-", str(home)).rstrip("-") + "-"
        if folder.startswith(prefix) and len(folder) > len(prefix):
            return folder[len(prefix) :]
    return folder


@dataclass
class _Head:
    session: str | None = None
    cwd: str | None = None
    start: int | None = None


def _read_head(f: SourceFile) -> _Head:
    head = _Head()
    for obj in head_objects(f, HEAD_LINES, HEAD_BYTES):
        if not isinstance(obj, dict):
            continue
        _take(head, obj)
        payload = obj.get("payload")
        if obj.get("type") == "session_meta" and isinstance(payload, dict):
            if head.session is None and isinstance(payload.get("id"), str):
                head.session = payload["id"]
            if head.cwd is None and isinstance(payload.get("cwd"), str):
                head.cwd = payload["cwd"]
        if head.session is not None and head.cwd is not None and head.start is not None:
            break
    return head


def _take(head: _Head, obj: dict[str, Any]) -> None:
    if head.session is None and isinstance(obj.get("sessionId"), str):
        head.session = obj["sessionId"]
    if head.cwd is None and isinstance(obj.get("cwd"), str):
        head.cwd = obj["cwd"]
    ts = parse_ts(obj.get("timestamp"))
    if ts is not None and (head.start is None or ts < head.start):
        head.start = ts


def unit_info(unit: ImportUnit, home: Path | None = None) -> SessionInfo:
    """The session id, project and start time of `unit` (see the module docstring)."""
    main = unit.files[0]
    stem = main.path.name.split(".")[0]
    if unit.format == "compiled":
        trace = compiled.read(main.path, unit.label)
        starts = [int(s.requests["ts"].min()) for s in trace.sessions if s.n_requests]
        sid = trace.sessions[0].id if trace.sessions else stem
        return SessionInfo(sid, stem, None, min(starts) if starts else None, trace.format)
    if unit.format == "swe-agent":
        folder = folder_project(main.path.parent.name, home)
        return SessionInfo(stem, stem, folder, None, unit.format)
    heads = [_read_head(main)]
    resumed = [f for f, role in zip(unit.files[1:], unit.roles, strict=True) if role == "resume"]
    heads += [_read_head(f) for f in resumed]
    starts = [h.start for h in heads if h.start is not None]
    first = heads[0]
    project = _last_component(first.cwd) if first.cwd else None
    if project is None:
        project = folder_project(main.path.parent.name, home)
    start = min(starts) if starts else None
    return SessionInfo(first.session or stem, stem, project, start, unit.format)


@dataclass
class Selection:
    """The units a command reads, what is known of each (by label), and how many the
    filters left out."""

    units: list[ImportUnit]
    info: dict[str, SessionInfo] = field(default_factory=dict)
    left_out: int = 0


def select(units: Sequence[ImportUnit], filters: Filters, home: Path | None = None) -> Selection:
    """The units `filters` keeps, in the given order. Facts are read for every unit (the
    tables show them); a file that cannot be read stops here with the reader's TraceError."""
    out = Selection([])
    for unit in units:
        info = unit_info(unit, home)
        if filters.keeps(info):
            out.units.append(unit)
            out.info[unit.label] = info
        else:
            out.left_out += 1
    return out


def read_line(infos: Iterable[SessionInfo]) -> str:
    """What was read, in one line: "412 sessions in 37 projects, 2026-05-02 to 2026-11-30"."""
    items = list(infos)
    projects = {i.project for i in items if i.project}
    starts = [i.start_ms for i in items if i.start_ms is not None]
    text = f"{len(items)} session(s) in {len(projects)} project(s)"
    if starts:
        first, last = (
            datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()
            for ms in (min(starts), max(starts))
        )
        text += f", {first} to {last}"
    return text
