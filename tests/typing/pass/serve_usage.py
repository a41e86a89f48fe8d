"""User code that must type-check under mypy --strict: one replica's ModelServer, without Ray."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ortgpu.serve import DEFAULT_BUCKETS, ModelServer, ReplicaFailedError


def answer(model: bytes, rows: npt.NDArray[np.float32]) -> npt.NDArray[Any] | None:
    server = ModelServer(model, buckets=DEFAULT_BUCKETS, backend="fake", capture=True, device=0)
    try:
        request = server.validate({"X": rows})
        (reply,) = server.infer([request])
        status: dict[str, Any] = server.status()
        assert status["healthy"]
        return reply["Y"]
    except ReplicaFailedError:
        return None
    finally:
        server.close()
