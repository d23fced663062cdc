"""What the readers' no-content tests look for: the words of a source's content, and the
strings of a compiled trace those words must not appear in."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection
from typing import Any

from simulator.model import Trace


def content_words(
    obj: Any, keys: Collection[str], out: set[str], *, quotes: str = '"', inside: bool = False
) -> None:
    """Every string of 8+ characters under one of `keys` in a parsed source (and inside
    JSON-encoded strings there), whole and split at whitespace and `quotes`."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            content_words(value, keys, out, quotes=quotes, inside=inside or key in keys)
    elif isinstance(obj, list):
        for value in obj:
            content_words(value, keys, out, quotes=quotes, inside=inside)
    elif isinstance(obj, str) and inside:
        if obj.startswith("{"):
            with contextlib.suppress(ValueError):
                content_words(json.loads(obj), keys, out, quotes=quotes, inside=True)
        spaced = obj
        for quote in quotes:
            spaced = spaced.replace(quote, " ")
        for word in [obj, *spaced.split()]:
            if len(word) >= 8:
                out.add(word)


def trace_strings(trace: Trace) -> list[str]:
    """The strings a compiled trace holds in clear (metadata)."""
    out = [trace.format, trace.source_digest, *trace.skipped, *trace.skipped_at, *trace.stats]
    for s in trace.sessions:
        out += [s.id, s.kind, s.client, *s.tools, *s.models]
    return out
