"""What the tests share, in one place: where things are, the corpus helpers, scripted
sessions (support/scripted.py), report fixtures (support/report_helpers.py) and the words
a compiled file must never hold (support/leak_words.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from simulator.model import Trace

ROOT = Path(__file__).resolve().parents[2]
#: ../shared/traces beside the checkout: tests that read it skip where it is absent.
SHARED = ROOT.parent / "shared" / "traces"
SAMPLES = ROOT / "traces" / "samples"
FIXTURES = ROOT / "tests" / "fixtures"

#: (name, trace) pairs, in the order `units` finds them.
Named = list[tuple[str, Trace]]


def source_folders(shared: Path, fmt: str = "") -> list[str]:
    """The source folders of ../shared/traces ("claude-code/vsla", ...), sorted: each holds
    one published source (SOURCES.tsv), the unit of leave-one-source-out measurement."""
    formats = [fmt] if fmt else sorted(p.name for p in shared.iterdir() if p.is_dir())
    return [
        f"{f}/{d.name}"
        for f in formats
        if (shared / f).is_dir() and f != "LICENSES"
        for d in sorted((shared / f).iterdir())
        if d.is_dir()
    ]


def stable_pick(items: list[str], k: int, salt: str) -> list[str]:
    """k items chosen by a keyed hash of each: the same choice on every machine and run."""
    ranked = sorted(items, key=lambda s: hashlib.sha256(f"{salt}\0{s}".encode()).digest())
    return ranked[:k]
