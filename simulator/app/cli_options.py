"""What the `ctxsim` commands share (simulator/app/cli.py and cli_sweep.py): the exit on bad
input, the cache models, and the options every command that reads traces takes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any, NoReturn

import click

#: Exit status of a run stopped by bad input (one line on stderr, nothing written).
EXIT_BAD_INPUT = 2

#: The prompt-cache models `--cache` chooses from ("auto": the trace's provider).
CACHE_CHOICES = ("auto", "anthropic", "openai", "google")


def fail(message: str) -> NoReturn:
    """Stop with one line on stderr and EXIT_BAD_INPUT, never a traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


paths = click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
#: SRC of the commands that find the user's sessions when none is given (traces/home.py).
sources = click.argument(
    "src", nargs=-1, required=False, type=click.Path(exists=True, path_type=Path)
)
#: Damaged lines (a line that does not parse, impossible usage) are skipped and counted by
#: default: every real corpus tried had some (issue 15: 36 and 349), and a first command
#: that stops on line 4,012 of someone's transcript teaches nothing. `--strict` stops at
#: the first, for CI; `--lenient`, once needed, is kept as a no-op so scripts keep working.
#: Input that is not a damaged line (not a trace at all, a bad compiled file) always stops.
lenient = click.option(
    "--lenient/--strict",
    "lenient",
    default=True,
    help="--strict: stop at the first damaged line (for CI). By default damaged lines are "
    "skipped and counted (`ctxsim traces validate` lists them); --lenient is that default.",
)


def _date(ctx: click.Context, param: click.Parameter, value: str | None) -> date | None:
    from traces.select import parse_date

    if value is None:
        return None
    try:
        return parse_date(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def selection(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that choose which sessions a command reads (traces/select.py,
    traces/home.py), passed to the command as one `filters` argument."""
    from traces.home import AGENTS

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        since: date | None,
        until: date | None,
        project: tuple[str, ...],
        session: tuple[str, ...],
        agent: str,
        **kwargs: Any,
    ) -> Any:
        from traces.select import Filters

        if since is not None and until is not None and until < since:
            fail(f"--until {until.isoformat()} is before --since {since.isoformat()}")
        filters = Filters(since, until, tuple(project), tuple(session), agent)
        return func(*args, filters=filters, **kwargs)

    options = [
        click.option(
            "--since",
            callback=_date,
            metavar="DATE",
            help="Sessions that started on or after DATE (YYYY-MM-DD, UTC, trace time).",
        ),
        click.option(
            "--until",
            callback=_date,
            metavar="DATE",
            help="Sessions that started on or before DATE (YYYY-MM-DD, UTC, trace time).",
        ),
        click.option(
            "--project",
            multiple=True,
            metavar="NAME",
            help="Sessions of this project: the last folder of the session's working "
            "directory; * and ? match any text (repeatable).",
        ),
        click.option(
            "--session",
            multiple=True,
            metavar="ID",
            help="The session whose id (or file name) starts with ID (repeatable).",
        ),
        click.option(
            "--agent",
            type=click.Choice(AGENTS),
            default="all",
            show_default=True,
            help="Whose sessions: with no SRC, where they are looked for "
            "($CLAUDE_CONFIG_DIR or ~/.claude/projects, $CODEX_HOME or ~/.codex/sessions).",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


no_cache = click.option("--no-cache", is_flag=True, help="Always compile; ignore the cache.")
jobs = click.option(
    "--jobs", "-j", type=click.IntRange(0), default=0, help="Traces compiled at once (0: auto)."
)
