"""Seeded mutation fuzzing of every reader and of the compiled-trace loader (issue 17).

The corpus is the project's own samples (traces/samples: Claude Code, Codex, SWE-agent) and
a compiled trace made from one of them. Each case mutates one seed (a JSON value replaced by
a hostile one, a line cut, doubled, dropped or filled with bytes; for `.ctxt` files a column
value or a byte of the archive changed) and reads it strict and lenient. Every outcome must
be one of:

* a TraceError whose message is one line naming the file (and, for a JSONL line or a
  SWE-agent element, a line of the file, the trajectory written indented or not), of a
  category other than `internal-error` (a reader bug caught at the last moment);
* a Trace whose every number is possible (traces/bounds.py), the skipped lines counted.

One case in twenty instead compiles a source into a compile cache, damages the entry (bytes
flipped or cut) and reads the source again through the cache: it must give the trace a
fresh compile gives (the entry discarded and rebuilt, R18), never an error.

Nothing else: no other exception, no case taking more than CASE_SECONDS. The suite runs
DEFAULT_CASES cases from a fixed seed; `CTXSIM_FUZZ_SECONDS=600` runs fresh seeds for that
long instead, and `CTXSIM_FUZZ_REPORT=FILE` writes the run's figures there as JSON.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from simulator.model import NEVER, Trace
from tests.support import SAMPLES
from traces import compiled
from traces.bounds import MAX_CONTEXT_TOKENS, MAX_OUTPUT_TOKENS, MAX_TS_MS
from traces.cache import CompileCache
from traces.discover import discover
from traces.errors import TraceError
from traces.load import load_unit

DEFAULT_CASES = 1200
CASE_SECONDS = 10

#: Values a damaged or crafted file may hold where a count, a time or a name belongs.
HOSTILE: list[Any] = [
    -1,
    0,
    2**31,
    2**32 + 5,
    2**62,
    2**63,
    2**64,
    10**12,
    -(10**12),
    1e308,
    -0.0,
    1.5,
    True,
    None,
    "",
    "x" * 20_000,
    "cat " + "a" * 400_000,
    [],
    [[]],
    {},
    {"type": []},
    "0001-01-01T00:00:00Z",
    "3000-01-01T00:00:00.000Z",
    "2026-01-01T00:00:00",
    "9999-12-31T23:59:59.999999+14:00",
    "not a time",
    "\u0000\ud7ff\n",
]


#: Error categories about a whole JSONL file, which name no line.
LINE_FREE = ("empty-file", "unknown-format", "bad-gzip", "too-large", "unreadable")


class Hang(Exception):
    """Raised by the alarm when a case runs past CASE_SECONDS."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang


def _seeds() -> list[tuple[str, bytes]]:
    """(file name, bytes) of every sample trace, and one compiled trace."""
    seeds = []
    for path in sorted(SAMPLES.rglob("*")):
        if path.suffix in (".jsonl", ".traj"):
            seeds.append((path.name, path.read_bytes()))
    for i, unit in enumerate(discover([SAMPLES])):
        seeds.append((f"sample{i}.ctxt", compiled.to_bytes(load_unit(unit).trace)))
    assert {Path(n).suffix for n, _ in seeds} == {".jsonl", ".traj", ".ctxt"}
    return seeds


# -- mutations -----------------------------------------------------------------------------


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    value[head] = _replace(value[head], rest, new)
    return value


def _mutate_json(rng: random.Random, doc: Any) -> Any:
    paths = list(_leaves(doc))
    path = rng.choice(paths)
    roll = rng.random()
    if roll < 0.8:
        return _replace(doc, path, rng.choice(HOSTILE))
    if roll < 0.9 and path:  # a key renamed (a field missing)
        parent = _replace(doc, (), doc)
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict):
            parent[f"{path[-1]}_gone"] = parent.pop(path[-1])
        return doc
    return _replace(doc, path, rng.choice([2**40, -5, "", None]))


def _mutate_jsonl(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    k = rng.randrange(len(lines))
    roll = rng.random()
    if roll < 0.6:
        try:
            doc = json.loads(lines[k])
        except ValueError:
            doc = None
        if doc is not None:
            lines[k] = json.dumps(_mutate_json(rng, doc)).encode()
        return b"\n".join(lines)
    if roll < 0.7:
        cut = rng.randrange(len(data) + 1)
        return data[:cut]
    if roll < 0.78:
        lines.insert(k, lines[k])
    elif roll < 0.86:
        del lines[k]
    elif roll < 0.93:
        lines.insert(k, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
    else:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def _mutate_traj(rng: random.Random, data: bytes) -> bytes:
    if rng.random() < 0.85:
        try:
            doc = json.loads(data)
        except ValueError:  # an earlier mutation cut it: cut again
            doc = None
        if doc is not None:  # indented or not: problems must name the line they are on
            return json.dumps(_mutate_json(rng, doc), indent=rng.choice([None, 1, 2])).encode()
    cut = rng.randrange(len(data) + 1)
    return data[:cut]


def _rezip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, raw in entries.items():
            zf.writestr(name, raw)
    return out.getvalue()


def _mutate_ctxt(rng: random.Random, data: bytes) -> bytes:
    try:
        return _mutate_entries(rng, data)
    except Exception:  # an earlier mutation broke the archive: flip bytes instead
        return _flip(rng, data)


def _flip(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randrange(1, 8)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw)


def _mutate_entries(rng: random.Random, data: bytes) -> bytes:
    zf = zipfile.ZipFile(io.BytesIO(data))
    entries = {name: zf.read(name) for name in zf.namelist()}
    roll = rng.random()
    if roll < 0.5:  # one value of one column: a crafted file that still decodes
        meta = json.loads(entries["meta.json"])
        rows = [sum(s[k] for s in meta["sessions"]) for k in ("n_blocks", "n_requests")]
        layout, size = compiled._layout(*rows)
        codec = pa.Codec("zstd")
        raw = bytearray(codec.decompress(entries["columns.zst"], size, asbytes=True))
        _, _, dtype, offset, n = rng.choice([c for c in layout if c[4]] or layout)
        if n:
            values = np.frombuffer(raw, dtype=dtype, count=n, offset=offset).copy()
            if values.dtype != np.bool_:
                info = np.iinfo(values.dtype)
                pick = rng.choice([-1, -(2**31), 2**31 - 1, 2**62, NEVER, 10**9, 0, 1])
                values[rng.randrange(len(values))] = np.clip(pick, info.min, info.max)
            raw[offset : offset + values.nbytes] = values.tobytes()
            entries["columns.zst"] = codec.compress(bytes(raw), asbytes=True)
        return _rezip(entries)
    if roll < 0.8:  # one meta.json value
        try:
            meta = json.loads(entries["meta.json"])
        except ValueError:
            return data
        entries["meta.json"] = json.dumps(_mutate_json(rng, meta)).encode()
        return _rezip(entries)
    return _flip(rng, data)


MUTATORS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    ".jsonl": _mutate_jsonl,
    ".traj": _mutate_traj,
    ".ctxt": _mutate_ctxt,
}


# -- the checks ----------------------------------------------------------------------------


def impossible(trace: Trace) -> str | None:
    """The first impossible number of a trace, or None."""
    for s in trace.sessions:
        r, b = s.requests, s.blocks
        context = r["input"] + r["cache_read"] + r["cache_write_5m"] + r["cache_write_1h"]
        for name in ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output"):
            if len(r[name]) and int(r[name].min()) < 0:
                return f"negative {name}"
        if len(context) and int(context.max()) > MAX_CONTEXT_TOKENS:
            return "context above the bound"
        if len(r["output"]) and int(r["output"].max()) > MAX_OUTPUT_TOKENS:
            return "output above the bound"
        # A synthetic clock (SWE-agent) starts at 0; recorded times are checked by
        # test_bad_input.py against MIN_TS_MS.
        if len(r["ts"]) and (int(r["ts"].min()) < 0 or int(r["ts"].max()) > MAX_TS_MS):
            return "request time out of range"
        if len(b["tokens"]) and (int(b["tokens"].min()) < 0 or int(b["tokens_raw"].min()) < 0):
            return "negative block tokens"
        if len(b["tokens"]) and int(b["tokens"].max()) > MAX_CONTEXT_TOKENS:
            return "block above the bound"
    return None


def run_case(name: str, data: bytes, tmp: Path, lenient: bool) -> str:
    """The outcome of reading one file: 'error', 'accepted', or a failure starting 'FAIL'."""
    path = tmp / name
    path.write_bytes(data)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        if path.suffix == ".ctxt":
            trace = compiled.read(path)
        else:
            units = discover([path])
            if len(units) != 1:
                return f"FAIL {len(units)} units"
            trace = load_unit(units[0], lenient=lenient).trace
    except TraceError as exc:
        text = str(exc)
        if exc.category == "internal-error":
            return f"FAIL internal-error: {text[:200]}"
        if "\n" in text or len(text) > 600 or not text.startswith(name):
            return f"FAIL error line: {text[:200]}"
        located = path.suffix in (".jsonl", ".traj") and exc.category not in LINE_FREE
        if located and (not text.startswith(f"{name}:") or exc.line < 1):
            return f"FAIL no line: {text[:200]}"
        if exc.line > data.count(b"\n") + 1:
            return f"FAIL line past the end: {text[:200]}"
        return "error"
    except Hang:
        return "FAIL hang"
    except Exception as exc:  # the defect this test exists to find
        return f"FAIL {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
        path.unlink()
    problem = impossible(trace)
    if problem is not None:
        return f"FAIL impossible number: {problem}"
    return "accepted"


def run_cache_case(rng: random.Random, name: str, data: bytes, tmp: Path) -> str:
    """A source compiled into a compile cache whose entry is then damaged (bytes flipped or
    cut, as a disk or a kill damages it): reading the source again through the cache must
    give the trace a fresh compile gives, never an error (R18)."""
    folder = tmp / "cached"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    cache = CompileCache(tmp / "cache", note=lambda _: None)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        (unit,) = discover([path])
        fresh = load_unit(unit, cache=cache).trace
        (entry,) = cache.directory.rglob("*.ctxt")
        damaged = entry.read_bytes()
        if rng.random() < 0.7:
            damaged = _flip(rng, damaged)
        else:
            damaged = damaged[: rng.randrange(len(damaged))]
        entry.write_bytes(damaged)
        (unit,) = discover([path])
        healed = load_unit(unit, cache=cache).trace
    except Hang:
        return "FAIL hang"
    except Exception as exc:
        return f"FAIL {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
        shutil.rmtree(tmp / "cache", ignore_errors=True)
        path.unlink()
    return "accepted" if healed.equals(fresh) else "FAIL the damaged entry was served"


def fuzz(seed: int, cases: int | None, seconds: float | None, tmp: Path) -> dict[str, Any]:
    """Run cases from `seed` (a count, or for a time); the run's figures."""
    seeds = _seeds()
    rng = random.Random(seed)
    save = Path(os.environ["CTXSIM_FUZZ_SAVE"]) if os.environ.get("CTXSIM_FUZZ_SAVE") else None
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    slowest = 0.0
    start = time.monotonic()
    n = 0
    while (cases is not None and n < cases) or (
        seconds is not None and time.monotonic() - start < seconds
    ):
        name, data = rng.choice(seeds)
        suffix = Path(name).suffix
        if suffix != ".ctxt" and rng.random() < 0.05:
            t0 = time.monotonic()
            outcome = run_cache_case(rng, name, data, tmp)
            slowest = max(slowest, time.monotonic() - t0)
            outcomes[f"cache-entry {outcome.split(':')[0]}"] += 1
            if outcome.startswith("FAIL"):
                failures.append(f"case {n} (cache entry of {name}): {outcome}")
            n += 1
            continue
        mutated = data
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            mutated = MUTATORS[suffix](rng, mutated)
        lenient = rng.random() < 0.5
        t0 = time.monotonic()
        outcome = run_case(name, mutated, tmp, lenient)
        slowest = max(slowest, time.monotonic() - t0)
        key = f"{suffix} {'lenient' if lenient else 'strict'} {outcome.split(':')[0]}"
        outcomes[key] += 1
        if outcome.startswith("FAIL"):
            failures.append(f"case {n} ({name}, lenient={lenient}): {outcome}")
            if save:
                (save / f"case{n}-{name}").write_bytes(mutated)
        n += 1
    return {
        "seed": seed,
        "cases": n,
        "seconds": round(time.monotonic() - start, 1),
        "slowest_case_s": round(slowest, 2),
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures,
    }


def test_fuzz_readers_and_compiled_loader(tmp_path: Path) -> None:
    seconds = float(os.environ.get("CTXSIM_FUZZ_SECONDS", "0"))
    if seconds > 0:
        seed = int(os.environ.get("CTXSIM_FUZZ_SEED", str(time.time_ns())))
        figures = fuzz(seed, None, seconds, tmp_path)
    else:
        figures = fuzz(17, DEFAULT_CASES, None, tmp_path)
    report = os.environ.get("CTXSIM_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    assert figures["failures"] == [], "\n".join(figures["failures"][:20])
    # The mutations must reach both outcomes for every kind of file, or they test nothing.
    kinds = {k.rsplit(" ", 1)[1] for k in figures["outcomes"]}
    assert {"error", "accepted"} <= kinds, figures["outcomes"]
    assert figures["outcomes"].get("cache-entry accepted", 0) > 0, figures["outcomes"]


@pytest.mark.parametrize("suffix", [".jsonl", ".traj", ".ctxt"])
def test_the_mutators_change_every_kind_of_seed(suffix: str) -> None:
    rng = random.Random(3)
    for name, data in _seeds():
        if name.endswith(suffix):
            assert any(MUTATORS[suffix](rng, data) != data for _ in range(5))
