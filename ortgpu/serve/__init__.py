"""Serving ortgpu models behind Ray Serve (``pip install 'ortgpu[serve]'``).

:class:`ModelServer` is one replica's model: captured graphs per batch size, requests padded into the smallest that
holds them (it needs no Ray).  :func:`application` makes the Ray Serve deployment of replicas around it, with
dynamic batching, health checks and metrics; :func:`run` starts Ray and Serve locally (:func:`start_local`, which
also chooses the HTTP ingress) and deploys it.  See the
README's "Serving" section.
"""

from __future__ import annotations

from typing import Any

from ._server import DEFAULT_BUCKETS, ModelServer, ReplicaFailedError

__all__ = ["ModelServer", "ReplicaFailedError", "DEFAULT_BUCKETS", "application", "run", "start_local"]


def application(*args: Any, **kwargs: Any) -> Any:
    """See :func:`ortgpu.serve._deployment.application` (imports Ray Serve on first use)."""
    from ._deployment import application as make

    return make(*args, **kwargs)


def run(*args: Any, **kwargs: Any) -> Any:
    """See :func:`ortgpu.serve._deployment.run` (imports Ray Serve on first use)."""
    from ._deployment import run as start

    return start(*args, **kwargs)


def start_local(*args: Any, **kwargs: Any) -> None:
    """See :func:`ortgpu.serve._deployment.start_local` (imports Ray Serve on first use)."""
    from ._deployment import start_local as start

    start(*args, **kwargs)
