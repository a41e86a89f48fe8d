"""The small value types of the session API: :class:`RunOptions`, :class:`NodeArg`, :class:`NodePlacement`.

They follow onnxruntime's Python API and hold no device state, so they live apart from
:class:`~ortgpu.InferenceSession`, which returns and accepts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ortgpu_core import ArgumentTypeError, InvalidArgumentError

from ._lora_adapter import LoraAdapter
from .loader._model import ValueInfo

__all__ = ["RunOptions", "NodeArg", "NodePlacement"]


@dataclass
class RunOptions:
    """Per-run options.  ``gpu_graph_id``: -1 for an ordinary run; N >= 0 to capture
    graph N on first use and replay it afterwards (``run_with_iobinding`` on a session
    created with ``graph_capture=True``); None: the session's default (0 on a capture
    session's ``run_with_iobinding``, as in onnxruntime; ordinary otherwise)."""

    gpu_graph_id: int | None = None
    #: onnxruntime's fields, accepted with no effect on results: ``logid``, ``log_severity_level``,
    #: ``log_verbosity_level`` (ortgpu logs nothing per run), ``only_execute_path_to_fetches`` (ortgpu plans the
    #: whole graph; outputs not fetched are still computed).  ``terminate`` is refused when set (a run cannot be
    #: cancelled part way through its device submissions).
    logid: str = ""
    log_severity_level: int = -1
    log_verbosity_level: int = 0
    only_execute_path_to_fetches: bool = False
    terminate: bool = False
    _other_entries: dict[str, str] = field(default_factory=dict, repr=False)
    _active_adapters: list[LoraAdapter] = field(default_factory=list, repr=False)

    def add_active_adapter(self, adapter: LoraAdapter) -> None:
        """Make ``adapter`` active for runs with these options: ``run()`` and ``run_with_ort_values()`` feed each of
        its parameters as the model input of that name (see :mod:`ortgpu._adapter_runs` for the rules).

        Raises
        ------
        ArgumentTypeError
            ``adapter`` is not an :class:`ortgpu.LoraAdapter`.
        InvalidArgumentError
            ``adapter`` was never loaded (call ``adapter.Load(path)`` first).
        """
        if not isinstance(adapter, LoraAdapter):
            raise ArgumentTypeError(f"add_active_adapter takes an ortgpu.LoraAdapter, got {type(adapter).__name__}")
        if not adapter.loaded:
            raise InvalidArgumentError("this LoraAdapter holds no parameters: call adapter.Load(path) before use")
        self._active_adapters.append(adapter)

    @property
    def active_adapters(self) -> tuple[LoraAdapter, ...]:
        """The adapters made active by :meth:`add_active_adapter`, in the order they were added."""
        return tuple(self._active_adapters)

    def add_run_config_entry(self, key: str, value: str) -> None:
        """onnxruntime's spelling: ``add_run_config_entry("gpu_graph_id", "1")``.  Other keys are kept (no effect)."""
        if key != "gpu_graph_id":
            self._other_entries[str(key)] = str(value)
            return
        try:
            self.gpu_graph_id = int(value)
        except ValueError:
            raise InvalidArgumentError(f"gpu_graph_id must be an integer string, got {value!r}") from None

    def get_run_config_entry(self, key: str) -> str:
        """The value set for ``key`` (``gpu_graph_id``: the graph id as a string, ``""`` when none).

        Raises
        ------
        InvalidArgumentError
            No value was set for ``key``.
        """
        if key != "gpu_graph_id":
            if key not in self._other_entries:
                raise InvalidArgumentError(f"RunOptions does not have configuration with key: {key}")
            return self._other_entries[key]
        return "" if self.gpu_graph_id is None else str(self.gpu_graph_id)


@dataclass(frozen=True)
class NodeArg:
    """A model input or output: ``name``, ``shape`` (ints, or str/None for dynamic dims), ``type``."""

    name: str
    shape: list[int | str | None]
    type: str
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class NodePlacement:
    """Where one node runs: ``placement`` is "webgpu" or "cpu"; ``reason`` says why (on the CPU), or how (a kernel,
    a fused step, control flow expanded when planning).

    Nodes inside control flow are listed too, named ``owner/part/node`` (``part``: ``then``, ``else``, ``body``, or
    ``iterN`` for an unrolled iteration).  ``capturable``: whether a captured graph can replay this node (device
    work only: a graph with any node on the CPU cannot be captured).
    """

    node: str
    op_type: str
    placement: Literal["webgpu", "cpu"]
    reason: str
    #: The control-flow node whose subgraph this node belongs to, where that node runs whole on the CPU; else "".
    inside: str = ""

    @property
    def capturable(self) -> bool:
        """Whether the node runs on the device: a graph can be captured only when every node can."""
        return self.placement == "webgpu"


def _node_arg(info: ValueInfo) -> NodeArg:
    from ortgpu_core._dtypes import onnx_type_name

    from ._host_values import element_dtype_of

    # Strings (object arrays, host values only) are no device dtype of the core: named here, as onnxruntime does.
    type_name = "tensor(string)" if info.dtype == object else onnx_type_name(info.dtype)
    element = element_dtype_of(info.dtype)
    if element is not None:  # a sequence of tensors (a host value), named as onnxruntime does
        inner = "tensor(string)" if element.kind == "O" else onnx_type_name(element)
        type_name = f"seq({inner})"
    return NodeArg(info.name, list(info.shape), type_name, info.dtype)
