"""Where a user's recorded sessions live when no SRC is given on the command line.

The places are the agents' own, as the tools Claude Code and Codex users already run
(ccusage) read them:

- Claude Code: `$CLAUDE_CONFIG_DIR/projects` when the variable is set (a comma-separated
  list of folders is read as ccusage reads it), else both `~/.config/claude/projects`
  (the XDG location ccusage's documentation calls Claude Code's newer default) and
  `~/.claude/projects` (the older one), whichever exist.
- Codex: `$CODEX_HOME/sessions` when set, else `~/.codex/sessions` (rollout files under
  YYYY/MM/DD/).

With no SRC every agent whose folder exists is read (`--agent` narrows it): a user of both
tools asks "what did my sessions cost", not "what did one tool's". The folders are shown
with `~` for the home folder; nothing here is written to a file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CLAUDE_CONFIG_ENV = "CLAUDE_CONFIG_DIR"
CODEX_HOME_ENV = "CODEX_HOME"
#: `--agent` choices: which agents' folders a command with no SRC reads.
AGENTS = ("all", "claude-code", "codex")


class HomeError(ValueError):
    """No agent folder exists where one was looked for."""


@dataclass(frozen=True)
class Place:
    """A folder an agent writes its sessions to, and how to show it to the user."""

    agent: str
    path: Path
    shown: str


def shown(path: Path, home: Path) -> str:
    """`path` with the home folder as `~`, for terminal messages."""
    try:
        return str(Path("~") / path.relative_to(home))
    except ValueError:
        return str(path)


def candidates(agent: str, env: Mapping[str, str], home: Path) -> list[Place]:
    """Every folder `agent` ("all", "claude-code" or "codex") may keep sessions in."""
    places: list[Place] = []
    if agent in ("all", "claude-code"):
        configured = env.get(CLAUDE_CONFIG_ENV, "").strip()
        if configured:
            roots = [Path(p.strip()).expanduser() for p in configured.split(",") if p.strip()]
        else:
            roots = [home / ".config" / "claude", home / ".claude"]
        places += [Place("claude-code", r / "projects", shown(r / "projects", home)) for r in roots]
    if agent in ("all", "codex"):
        configured = env.get(CODEX_HOME_ENV, "").strip()
        root = Path(configured).expanduser() if configured else home / ".codex"
        places.append(Place("codex", root / "sessions", shown(root / "sessions", home)))
    return places


def default_places(
    agent: str = "all", env: Mapping[str, str] | None = None, home: Path | None = None
) -> list[Place]:
    """The existing folders of `agent`, in the order of `candidates`; raise HomeError
    naming every folder looked in when none exists."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    looked = candidates(agent, env, home)
    found: list[Place] = []
    seen: set[Path] = set()
    for place in looked:
        if place.path.is_dir() and place.path.resolve() not in seen:
            seen.add(place.path.resolve())
            found.append(place)
    if not found:
        where = ", ".join(p.shown for p in looked)
        raise HomeError(
            f"no SRC given and no sessions found in {where}; "
            f"name a folder or file, or set {CLAUDE_CONFIG_ENV} / {CODEX_HOME_ENV}"
        )
    return found
