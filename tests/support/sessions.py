"""Sessions written out by hand, column by column, for tests that need exact blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.model import Session, block_columns, request_columns


def hand_session(blocks: dict[str, Any], requests: dict[str, Any], model: str) -> Session:
    """One main session on `model` from its block and request columns (lists or arrays),
    with no system prefix (prefix_tokens 0: no prefix inference comes in)."""
    return Session(
        id="hand",
        kind="main",
        parent=-1,
        client="ctxsim-test",
        prefix_tokens=0,
        tools=[],
        models=[model],
        blocks=block_columns({k: np.asarray(v) for k, v in blocks.items()}),
        requests=request_columns({k: np.asarray(v) for k, v in requests.items()}),
    )
