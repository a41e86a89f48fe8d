"""The contract between operators and the executor.

An operator (one file per ONNX op in :mod:`ortgpu.ops`) provides two things:

* ``reference``: the numpy twin of the operator: exact ONNX semantics on the
  CPU.  It runs nodes placed on the CPU, and it is what tests compare against.
* ``plan``: for given input/output tensor infos, attributes and constant
  inputs, the WGSL kernels that compute the node on a WebGPU device, as an
  :class:`OpPlan`.  It raises :class:`NotOnDevice` when the device cannot run
  this variant (a dtype WGSL lacks, a missing feature): the executor then
  places the node on the CPU and says so.

Device memory layout is numpy's C-contiguous layout for every dtype, bit for
bit (bool and uint8 are bytes, int64 is 8 bytes little-endian, float16 is 2
bytes), so uploads and readbacks never convert.  Kernels read and write
sub-word types by packing them into ``u32`` words, and read int64 indices
through their low word (valid for indices in int32 range); kernels reading
indices at run time also check the high word and flag any index out of range
in the program's status words (``Binding("status")``).

Each :class:`KernelSpec` carries its own numpy twin (``twin``) that does to the
bound byte arrays what its WGSL does: the fake backend runs twins instead of
compiling WGSL.  ``reference_twin`` builds one from a function on typed arrays.

Generated WGSL never contains strings from the model (node or tensor names);
``KernelSpec.name`` is the op type only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence

import numpy as np

from ortgpu_core.backends.protocol import DeviceLimits, KernelTwin

from .._types import TensorInfo, computable

__all__ = [
    "TensorInfo",
    "DeviceCaps",
    "Binding",
    "KernelSpec",
    "ElementwiseExpression",
    "GatherExpression",
    "OpPlan",
    "Operator",
    "NotOnDevice",
    "reference_twin",
    "STATUS_BYTES",
    "flagging_twin",
]


class NotOnDevice(Exception):
    """Raised by ``Operator.plan``: this node variant must run on the CPU (the message says why)."""


@dataclass(frozen=True)
class DeviceCaps:
    """What a kernel generator may rely on: the device's features and limits.

    ``loop_budget``: the most loop iterations one invocation may run in all, where the driver caps them (None:
    no cap).  Mesa's llvmpipe (lavapipe, the software Vulkan driver of CI machines) silently stops every loop of
    an invocation once 65535 iterations have run, counted over all its loops (measured here: two loops of 40000
    iterations ran 65534 in all; an int32 ReduceSum over 100000 ones returned 65535).  Kernels whose loops could
    run longer raise :class:`NotOnDevice` there (see :func:`check_loop_budget`), so the node runs on the CPU with
    that reason instead of computing a wrong result.
    """

    features: frozenset[str]
    limits: DeviceLimits
    loop_budget: int | None = None

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features


#: llvmpipe's cap on the loop iterations of one invocation (its LP_MAX_TGSI_LOOP_ITERATIONS).
LLVMPIPE_LOOP_BUDGET = 65535


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for positive ``denominator``, in exact integer arithmetic."""
    return -(-numerator // denominator)


def loop_budget_for(adapter_name: str) -> int | None:
    """:attr:`DeviceCaps.loop_budget` of an adapter, from its name (llvmpipe/lavapipe: 65535; others: None)."""
    return LLVMPIPE_LOOP_BUDGET if "llvmpipe" in adapter_name.lower() else None


def check_loop_budget(op_type: str, iterations: int, caps: DeviceCaps) -> None:
    """Raise :class:`NotOnDevice` when a kernel's invocations would run more loop ``iterations`` (over all their
    loops) than the device's driver completes (:attr:`DeviceCaps.loop_budget`)."""
    budget = caps.loop_budget
    if budget is not None and iterations >= budget:
        raise NotOnDevice(
            f"{op_type}: its kernel would run {iterations} loop iterations per invocation, and this device's driver "
            f"(llvmpipe/lavapipe) silently stops loops after {budget}, which would give wrong results; it runs on "
            "the CPU (a hardware GPU has no such cap)"
        )


BindingKind = Literal["input", "output", "scratch", "params", "status"]

#: Bytes of a program's status buffer (see :class:`Binding`).
STATUS_BYTES = 16


@dataclass(frozen=True)
class Binding:
    """What ``@binding(i)`` of a kernel is bound to.

    ``input``/``output``: the node's i-th input/output tensor (whole buffer).
    ``scratch``: the plan's i-th scratch buffer.  ``params``: the kernel's
    ``params`` bytes in a uniform buffer (``index`` unused).  ``status``: the
    program's status words (``array<atomic<u32>>``, :data:`STATUS_BYTES`; ``index``
    unused), cleared before every run: a kernel that finds invalid *data* (a
    Gather index out of range, which ONNX makes an error) sets word 0 to nonzero,
    and the run raises ``InvalidArgumentError`` instead of returning its outputs.
    """

    kind: BindingKind
    index: int = 0


@dataclass(frozen=True)
class KernelSpec:
    """One compute dispatch: WGSL (entry point ``main``, group 0), its grid, its bindings, its twin."""

    name: str
    wgsl: str
    grid: tuple[int, int, int]
    bindings: tuple[Binding, ...]
    twin: KernelTwin
    params: bytes = b""
    #: For a plain elementwise kernel: what it computes per output element, so the planner can fuse a chain of
    #: them into one kernel (:mod:`ortgpu._elementwise_fusion`); None for every other kernel.
    elementwise: ElementwiseExpression | None = None
    #: For a data-movement kernel of 4-byte elements reading no auxiliary input: where each output element comes
    #: from, for the same fusion; None for every other kernel.
    gather: GatherExpression | None = None


@dataclass(frozen=True)
class ElementwiseExpression:
    """An elementwise kernel's per-element function: ``expression`` (WGSL of the output's compute type) over
    ``j`` (the output index) and ``x0, x1, ...``, the values of the node's inputs ``input_indices`` (their compute
    types, read with numpy broadcasting), calling the functions in ``helpers``."""

    input_indices: tuple[int, ...]
    expression: str
    helpers: str


@dataclass(frozen=True)
class GatherExpression:
    """A data-movement kernel's per-element rule: ``source_function`` defines WGSL ``fn source(j: u32) ->
    vec2<u32>`` (and the helpers it calls), giving for output element ``j`` the pair (``s``, ``k``): element ``k`` of
    the node's input ``input_indices[s]``."""

    input_indices: tuple[int, ...]
    source_function: str


@dataclass(frozen=True)
class OpPlan:
    """How a node runs on the device.

    ``kernels`` run in order.  ``scratch_sizes`` are byte sizes of temporary
    buffers the kernels share.  ``alias`` maps an output index to the input
    index whose buffer it reuses unchanged (Reshape, Squeeze, Identity...):
    such outputs need no kernel and no buffer of their own.
    """

    kernels: tuple[KernelSpec, ...] = ()
    scratch_sizes: tuple[int, ...] = ()
    alias: Mapping[int, int] = field(default_factory=dict)


class Operator:
    """Base class of an operator implementation, registered by domain, op type and the opset it starts at.

    Subclasses set ``op_type`` and ``since_version`` (``domain`` too, outside ai.onnx) and implement
    ``reference``; ``plan`` may raise :class:`NotOnDevice`.  As in onnx's reference evaluator, a class implements
    its operator from ``since_version`` up to the next registered class's ``since_version``: where two versions
    differ in shape (inputs, outputs, semantics) they are separate classes.  Where they differ by an attribute
    that became an input, a default or an accepted value, one class covers them, names those versions in
    ``opset_changes`` and reads ``self.opset``.

    Parameters
    ----------
    opset
        The version of the operator's domain the model imports (``get_operator`` passes it).
    """

    op_type: ClassVar[str] = ""
    #: The opset of the domain this implementation starts at (required: the registry refuses a class without it).
    since_version: ClassVar[int]
    domain: ClassVar[str] = ""
    #: The later versions of the operator within this class's range whose differences it handles by reading
    #: ``self.opset`` (each an opset at which onnx changed the operator; a test checks them against onnx's schemas).
    opset_changes: ClassVar[tuple[int, ...]] = ()
    #: (input position, output position) pairs one value may be bound to at once (a cache read as its past and
    #: written as its present): the operator's contract that its plan reads the input before writing the output.
    #: The run still checks that the model's whole plan does (:meth:`ExecutionPlan.reads_before_writes`).
    in_place_pairs: ClassVar[tuple[tuple[int, int], ...]] = ()
    #: What a run's invalid-data error adds where this operator's kernels flag the status word: which input values
    #: must fit what (the default message says an index or a length was out of range).
    data_error_hint: ClassVar[str] = ""

    def __init__(self, opset: int = 0) -> None:
        #: The opset the model imports for this operator's domain; fixed for the instance's life.
        self.opset = opset

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        raise NotImplementedError

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type} has no WebGPU kernel")

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        """The output shapes for these inputs (all shapes known), where the operator's own shape rule must win over
        onnx's shape inference (which differs from onnxruntime at some edges: ceil-mode windows that would start in
        the end padding, ConvTranspose's SAME padding); None: use onnx's inference."""
        return None

    def output_infos_from_values(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any], values: Mapping[int, np.ndarray]
    ) -> list[TensorInfo] | None:
        """The outputs' shapes and dtypes where onnx cannot infer them and they follow from the input shapes and
        the ``values`` known when planning (constant inputs, by position), so the loader need not learn them by
        running the reference on zeros (which a node whose inputs must agree, say sequence lengths with a cache,
        may refuse); None: run it on zeros."""
        return None


def reference_twin(
    function: Callable[..., Sequence[np.ndarray] | np.ndarray],
    bindings: Sequence[Binding],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
) -> KernelTwin:
    """A twin that views the bound input bytes as typed arrays, calls ``function``
    with them (in input order) and writes its results into the bound outputs.

    For kernels that compute whole outputs from whole inputs, which is most of them.
    """
    input_slots = [(slot, b.index) for slot, b in enumerate(bindings) if b.kind == "input"]
    output_slots = [(slot, b.index) for slot, b in enumerate(bindings) if b.kind == "output"]

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        args = []
        for slot, index in input_slots:
            info = inputs[index]
            assert info is not None
            args.append(computable(arrays[slot][: info.nbytes].view(info.dtype).reshape(info.shape)))
        results = function(*args)
        if isinstance(results, np.ndarray):
            results = [results]
        for slot, index in output_slots:
            info = outputs[index]
            value = np.ascontiguousarray(np.asarray(results[index], dtype=info.dtype).reshape(info.shape))
            arrays[slot][: info.nbytes] = value.reshape(-1).view(np.uint8)

    return twin


def flagging_twin(twin: KernelTwin, bindings: Sequence[Binding]) -> KernelTwin:
    """``twin`` for a kernel that binds the program's status words: where ``twin`` raises
    ``InvalidArgumentError`` (invalid data, say an index out of range), the wrapped twin sets the status word
    instead, as the WGSL does (the outputs are then not valid, and the run raises)."""
    from ortgpu_core._errors import InvalidArgumentError

    slot = next(slot for slot, binding in enumerate(bindings) if binding.kind == "status")

    def flagging(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        try:
            twin(arrays, grid)
        except InvalidArgumentError:
            arrays[slot][:4] = np.frombuffer(np.uint32(1).tobytes(), dtype=np.uint8)

    return flagging
