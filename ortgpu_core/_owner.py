"""What bindings and captured graphs need from the session that owns them: the seam between core and session.

The core never imports :mod:`ortgpu` and never calls a session's private methods.  A binding calls its
:class:`BindingOwner`; a captured graph calls its :class:`GraphOwner`, and submits through the
:class:`~ortgpu_core._replay.GraphSubmitter` it was given at capture.  In ortgpu one object implements both: the
session's runner (``ortgpu._runner.SessionRunner``), which holds the session's plans, programs and buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._graph import CapturedGraph

__all__ = ["BindingOwner", "GraphOwner"]


class BindingOwner(Protocol):
    """What an :class:`~ortgpu_core._binding.IOBinding` asks of its session."""

    @property
    def session_id(self) -> int: ...

    @property
    def output_names(self) -> list[str]: ...

    def check_bind(self, name: str, value: object, kind: str) -> None:
        """Raise a typed error unless ``value`` may be bound as ``kind`` ("input", "output" or "cpu-input")
        ``name``: the name exists, the session is open, provenance, dtype and static shape match."""
        ...

    def check_output_name(self, name: str) -> None:
        """Raise a typed error unless the session is open and has an output ``name`` whose values it can allocate
        (for ``bind_output(name)``: the session allocates the value)."""
        ...


class GraphOwner(Protocol):
    """What a :class:`~ortgpu_core._graph.CapturedGraph` asks of its session: the checks around a replay, verify
    mode, and forgetting the graph.  Submission is not here: the graph submits through the
    :class:`~ortgpu_core._replay.GraphSubmitter` the session gave it at capture."""

    @property
    def verify_replays(self) -> bool:
        """Whether every replay is verified (the session was created with ``verify_replays=True``)."""
        ...

    def check_open(self, what: str = ...) -> None:
        """Raise ``ReleasedValueError`` if the session or its Env is closed."""
        ...

    def closed_reason(self) -> str | None:
        """Why the session can no longer replay (its Env or itself closed, and what to do), or None."""
        ...

    def verify_replay(self, graph: CapturedGraph) -> None:
        """Replay ``graph`` with poisoned outputs and compare with an uncaptured run."""
        ...

    def forget_graph(self, graph: CapturedGraph) -> None:
        """``graph`` was released: drop it from the session's registry."""
        ...
