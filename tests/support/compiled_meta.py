"""Compiled files with one field of a session's metadata rewritten, for the tests that check
how the reader of compiled traces takes a damaged or older file."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import orjson

from traces import compiled

#: `with_session_meta`'s value that removes the field (an older file without it).
ABSENT = object()


def with_session_meta(data: bytes, key: str, value: Any) -> bytes:
    """The compiled file `data` with session 0's metadata `key` set to `value` (ABSENT:
    the key removed), every other entry as it was."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            raw = zin.read(info.filename)
            if info.filename == compiled.META:
                meta = orjson.loads(raw)
                meta["sessions"][0].pop(key, None)
                if value is not ABSENT:
                    meta["sessions"][0][key] = value
                raw = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
            zout.writestr(info, raw)
    return out.getvalue()
