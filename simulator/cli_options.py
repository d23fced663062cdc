"""What the `ctxsim` commands share (simulator/cli.py and cli_sweep.py): the exit on bad
input, the cache models, and the options every command that reads traces takes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

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
lenient = click.option(
    "--lenient", is_flag=True, help="Skip and count bad lines instead of stopping at the first."
)
no_cache = click.option("--no-cache", is_flag=True, help="Always compile; ignore the cache.")
jobs = click.option(
    "--jobs", "-j", type=click.IntRange(0), default=0, help="Traces compiled at once (0: auto)."
)
