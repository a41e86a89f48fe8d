"""ScatterElements, its deprecated alias Scatter (opsets 9-10), and ScatterND: CPU references.

``reduction`` (ScatterElements/ScatterND from opset 16; ``max``/``min`` from 18)
combines each update with what is already at its destination, in index order
(numpy's unbuffered ``ufunc.at``), so duplicate indices accumulate as ONNX says.
With ``none`` and duplicate indices ONNX leaves the result undefined; here the
last update wins, as in onnxruntime.  Out-of-range indices are a typed error.

They run on the device: each output element scans its candidate updates in
order (for ScatterElements, the positions along the axis; for ScatterND, every
index tuple) and is a bit-exact copy of the data or of the last update aimed at
it (so duplicate indices without a reduction give the last update, in index
order, deterministically, whether the indices are constant or read at run time:
no two invocations write one element), or, with a reduction, the data combined
with those updates in the reference's order (8/16/32-bit integers, which wrap
alike; float32 add/mul, correctly rounded at each step).  Constant indices are
range-checked when planned; indices read at run time are checked by the kernel:
an out-of-range one (or an int64 whose high word is not the sign extension of
its low word) flags the run in the program's status words, so it raises
``InvalidArgumentError`` as the reference does.  Float16 reductions (rounded at
every step), float max/min (NaN) and 64-bit reductions run on the CPU.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    flagging_twin,
    reference_twin,
)
from .._registry import register
from .._run_time_indices import STATUS_DECLARATION, index_lines, require_index_dtype
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_count,
    check_binding_sizes,
    contiguous_strides,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    wgsl_compute_type,
    wgsl_int,
    workgroup_size_for,
)
from .._wgsl_kernels import gather_kernel

__all__ = ["ScatterElements", "Scatter", "ScatterND"]

_UFUNCS: dict[str, np.ufunc] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(op_type: str, attrs: Mapping[str, Any], opset: int) -> str:
    reduction = str(attrs.get("reduction", "none"))
    allowed = (
        ("none",) if opset < 16 else ("none", "add", "mul") if opset < 18 else ("none", "add", "mul", "max", "min")
    )
    if reduction not in allowed:
        raise UnsupportedOpError(
            f"{op_type} (opset {opset}): reduction {reduction!r} is not one of {', '.join(allowed)}"
        )
    return reduction


def _normalised(indices: np.ndarray, size: int | np.ndarray, op_type: str) -> np.ndarray:
    if indices.dtype not in (np.int32, np.int64):
        raise UnsupportedOpError(f"{op_type}: indices of dtype {indices.dtype} (int32 or int64 expected)")
    wide = indices.astype(np.int64)
    bad = (wide < -size) | (wide >= size)
    if np.any(bad):
        raise InvalidArgumentError(f"{op_type}: an index is out of range (the first: {int(wide[bad].flat[0])})")
    return np.where(wide < 0, wide + size, wide)


def _apply(output: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        # Fancy assignment keeps the last of duplicate destinations.
        output[where] = updates
    elif output.dtype == np.bool_:
        raise UnsupportedOpError(f"scatter reduction {reduction!r} on bool tensors is not supported")
    else:
        _UFUNCS[reduction].at(output, where, updates)


def _elements_destinations(
    data_shape: tuple[int, ...], indices: np.ndarray, updates_shape: tuple[int, ...], axis: int, op_type: str
) -> tuple[np.ndarray, ...]:
    """Where each update of a ScatterElements goes (checked shapes and indices)."""
    rank = len(data_shape)
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{op_type}: axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if indices.shape != updates_shape or indices.ndim != rank:
        raise ShapeError(
            f"{op_type}: indices {indices.shape} and updates {updates_shape} must have one shape of the data's rank"
        )
    if any(n > s for d, (n, s) in enumerate(zip(indices.shape, data_shape)) if d != axis):
        raise ShapeError(f"{op_type}: indices {indices.shape} exceed the data {data_shape} off the axis")
    index = _normalised(indices, data_shape[axis], op_type)
    where: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    where[axis] = index
    return tuple(np.broadcast_arrays(*where))


def scatter_elements(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int, reduction: str, op_type: str
) -> np.ndarray:
    where = _elements_destinations(data.shape, indices, updates.shape, axis, op_type)
    output = np.array(data, order="C", copy=True)
    _apply(output, where, updates, reduction)
    return output


@register
class ScatterElements(Operator):
    op_type = "ScatterElements"
    since_version = 11
    opset_changes: ClassVar[tuple[int, ...]] = (16, 18)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset)
        return [scatter_elements(data, indices, updates, int(attrs.get("axis", 0)), reduction, self.op_type)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset) if self.op_type == "ScatterElements" else "none"
        _check_device_reduction(self.op_type, reduction, data.dtype)
        axis = int(attrs.get("axis", 0))
        checked = 1 not in constants
        if checked:
            require_index_dtype(self.op_type, indices.dtype)
            # the reference checks the shapes (a typed error when planned); zeros are valid unless the axis is empty
            shape_only = np.zeros(indices.shape, indices.dtype)
            try:
                _elements_destinations(data.shape, shape_only, updates.shape, axis, self.op_type)
            except InvalidArgumentError:
                raise NotOnDevice(
                    f"{self.op_type}: every index into an empty axis is invalid; the CPU refuses them"
                ) from None
        else:
            # The reference checks the shapes and every index (a typed error when planned).
            _elements_destinations(data.shape, np.asarray(constants[1]), updates.shape, axis, self.op_type)
        out = outputs[0]
        if out.size == 0:
            if checked and indices.size:
                raise NotOnDevice(f"{self.op_type}: the indices of an empty output are checked on the CPU")
            return OpPlan()
        rank = len(data.shape)
        axis = axis + rank if axis < 0 else axis
        size = data.shape[axis]
        steps = indices.shape[axis]
        check_loop_budget(self.op_type, steps * elements_per_invocation(out.dtype.itemsize), caps)
        index_strides = contiguous_strides(indices.shape)
        lines = ["fn source(j: u32) -> vec2<u32> {\n", "  var rest = j;\n", "  var base = 0u;\n"]
        inside = ["true"]
        for d in range(rank - 1, -1, -1):
            lines.append(f"  let c{d} = rest % {data.shape[d]}u;\n  rest = rest / {data.shape[d]}u;\n")
            if d != axis:
                inside.append(f"c{d} < {indices.shape[d]}u")
                lines.append(f"  base = base + c{d} * {index_strides[d]}u;\n")
        lines.append("  var found = vec2<u32>(0u, j);\n")
        lines.append(f"  if ({' && '.join(inside)}) {{\n")
        lines.append(f"    for (var t = 0u; t < {steps}u; t = t + 1u) {{\n")
        lines.append(f"      let u = base + t * {index_strides[axis]}u;\n")
        # every index is scanned by the output elements sharing its off-axis coordinates (the axis is not empty)
        lines.append(
            index_lines("index", "u", indices.dtype, -size, size - 1, checked=checked, wrap=size, indent="      ")
        )
        lines.append(f"      if (u32(index) == c{axis}) {{ found = vec2<u32>(1u, u); }}\n")
        lines.append("    }\n  }\n  return found;\n}\n")
        return _scatter_kernel(self.op_type, inputs, outputs, "".join(lines), caps, attrs, self, reduction, checked)


@register
class Scatter(ScatterElements):
    """Scatter (opsets 9 and 10): ScatterElements without reductions, deprecated in opset 11."""

    op_type = "Scatter"
    since_version = 9
    opset_changes = ()  # no reduction attribute: Scatter was deprecated (opset 11) before reductions came

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        return [scatter_elements(data, indices, updates, int(attrs.get("axis", 0)), "none", self.op_type)]


@register
class ScatterND(Operator):
    op_type = "ScatterND"
    since_version = 11
    opset_changes = (16, 18)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset)
        if indices.ndim < 1:
            raise ShapeError("ScatterND: indices must have rank >= 1")
        depth = indices.shape[-1]
        if depth > data.ndim:
            raise ShapeError(f"ScatterND: index tuples of length {depth} for data of rank {data.ndim}")
        expected = indices.shape[:-1] + data.shape[depth:]
        if updates.shape != expected:
            raise ShapeError(f"ScatterND: updates have shape {updates.shape}, expected {expected}")
        tuples = indices.reshape(-1, depth)
        bounds = np.array(data.shape[:depth], dtype=np.int64)
        tuples = _normalised(tuples, bounds, self.op_type)
        where = tuple(tuples[:, d] for d in range(depth))
        output = np.array(data, order="C", copy=True)
        _apply(output, where, updates.reshape((len(tuples),) + data.shape[depth:]), reduction)
        return [output]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset)
        _check_device_reduction("ScatterND", reduction, data.dtype)
        if len(indices.shape) < 1 or indices.shape[-1] > len(data.shape):
            raise ShapeError(f"ScatterND: indices {indices.shape} for data of rank {len(data.shape)}")
        depth = indices.shape[-1]
        expected = tuple(indices.shape[:-1]) + tuple(data.shape[depth:])
        if tuple(updates.shape) != expected:
            raise ShapeError(f"ScatterND: updates have shape {updates.shape}, expected {expected}")
        checked = 1 not in constants
        if checked:
            require_index_dtype("ScatterND", indices.dtype)
        else:
            constant = np.asarray(constants[1]).reshape(-1, depth)
            _normalised(constant, np.array(data.shape[:depth], dtype=np.int64), "ScatterND")
        out = outputs[0]
        if out.size == 0:
            if checked and indices.size:
                raise NotOnDevice("ScatterND: the indices of an empty output are checked on the CPU")
            return OpPlan()
        tuples = element_count(indices.shape[:-1])
        slice_size = max(element_count(data.shape[depth:]), 1)
        check_loop_budget("ScatterND", tuples * elements_per_invocation(out.dtype.itemsize), caps)
        slice_strides = contiguous_strides(data.shape[:depth])
        # every output element scans every index tuple, so each entry is checked
        lines = [
            "fn source(j: u32) -> vec2<u32> {\n",
            f"  let wanted = i32(j / {slice_size}u);\n",
            "  var found = vec2<u32>(0u, j);\n",
            f"  for (var u = 0u; u < {tuples}u; u = u + 1u) {{\n",
            "    var offset = 0;\n",
        ]
        for d in range(depth):
            size = data.shape[d]
            position = f"u * {depth}u + {d}u"
            lines.append(
                index_lines(
                    f"i{d}", position, indices.dtype, -size, size - 1, checked=checked, wrap=size, indent="    "
                )
            )
            lines.append(f"    offset = offset + i{d} * {wgsl_int(slice_strides[d])};\n")
        lines.append(f"    if (offset == wanted) {{ found = vec2<u32>(1u, u * {slice_size}u + j % {slice_size}u); }}\n")
        lines.append("  }\n  return found;\n}\n")
        return _scatter_kernel("ScatterND", inputs, outputs, "".join(lines), caps, attrs, self, reduction, checked)


#: WGSL of each reduction on two values of the element's compute type.
_COMBINE = {"add": "a + b", "mul": "a * b", "max": "max(a, b)", "min": "min(a, b)"}


def _check_device_reduction(op_type: str, reduction: str, dtype: np.dtype[Any]) -> None:
    """Raise NotOnDevice unless the kernel computes ``reduction`` on ``dtype`` exactly as the reference does."""
    if reduction == "none":
        return
    if dtype.name in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
        return  # i32/u32 arithmetic wraps like numpy's, and the store keeps the low bits
    if dtype.name == "float32" and reduction in ("add", "mul"):
        return  # correctly rounded f32 steps, in the reference's order
    raise NotOnDevice(
        f"{op_type}: reduction {reduction!r} on {dtype.name} runs on the CPU (float16 rounds every step, NaN has no "
        "WGSL max/min order, 64-bit values need word pairs)"
    )


def _scatter_kernel(
    op_type: str,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    source: str,
    caps: DeviceCaps,
    attrs: Mapping[str, Any],
    operator: Operator,
    reduction: str = "none",
    checked: bool = False,
) -> OpPlan:
    """The kernel of a scatter: ``source`` is a WGSL ``fn source(j) -> vec2<u32>`` scanning the candidate updates of
    output element ``j`` in order, ``found = vec2<u32>(1u, k)`` on each update ``k`` aimed at it.  Without a reduction
    it is a gather kernel (the last update wins, bit-exact); with one, the same scan combines the updates into the
    data element.  ``checked``: ``source`` flags invalid run-time indices in the status words (bound last)."""
    data, indices, updates = inputs[0], inputs[1], inputs[2]
    assert data is not None and indices is not None and updates is not None
    if updates.dtype != data.dtype:
        raise ShapeError(f"{op_type}: updates of dtype {updates.dtype} for data of dtype {data.dtype}")
    bindings = [Binding("input", 0), Binding("input", 2), Binding("input", 1), Binding("output", 0)]
    attributes = dict(attrs)

    def function(array: np.ndarray, update_array: np.ndarray, index_array: np.ndarray) -> np.ndarray:
        return operator.reference([array, index_array, update_array], attributes, outputs)[0]

    twin = reference_twin(function, bindings, inputs, outputs)
    if checked:
        # the reference's InvalidArgumentError becomes the status flag, as in the WGSL
        bindings.append(Binding("status"))
        twin = flagging_twin(twin, bindings)
    out = outputs[0]
    if reduction == "none":
        kernel = gather_kernel(
            op_type,
            [(bindings[0], data), (bindings[1], updates)],
            [(bindings[2], indices)],
            out,
            source,
            caps,
            twin,
            status=checked,
        )
        return OpPlan(kernels=(kernel,))
    compute = wgsl_compute_type(data.dtype)
    value = (
        source.replace("fn source(j: u32) -> vec2<u32> {", f"fn value(j: u32) -> {compute} {{")
        .replace("var found = vec2<u32>(0u, j);", "var acc = load_data(j);")
        .replace("return found;", "return acc;")
    )
    value = re.sub(r"found = vec2<u32>\(1u, ([^;]*)\);", r"acc = combine(acc, load_update(\1));", value)
    check_binding_count(op_type, len(bindings), caps)
    check_binding_sizes(op_type, [data, updates, indices, out], caps)
    count = out.size
    invocations = -(-count // elements_per_invocation(out.dtype.itemsize))
    workgroup = workgroup_size_for(caps.limits)
    wgsl = (
        storage_declaration(0, "data", writable=False)
        + storage_declaration(1, "updates", writable=False)
        + storage_declaration(2, "auxbuf0", writable=False)
        + storage_declaration(3, "dst", writable=True)
        + (STATUS_DECLARATION.format(binding=4) if checked else "")
        + load_function("load_data", "data", data.dtype)
        + load_function("load_update", "updates", updates.dtype)
        + load_function("aux0", "auxbuf0", indices.dtype)
        + f"fn combine(a: {compute}, b: {compute}) -> {compute} {{ return {_COMBINE[reduction]}; }}\n"
        + value
        + kernel_entry(
            workgroup,
            f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
            + store_statements(out.dtype, count, "value"),
        )
    )
    kernel = KernelSpec(
        name=op_type,
        wgsl=wgsl,
        grid=grid_for(invocations, workgroup, caps.limits),
        bindings=tuple(bindings),
        twin=twin,
    )
    return OpPlan(kernels=(kernel,))
