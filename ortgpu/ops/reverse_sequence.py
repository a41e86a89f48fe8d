"""ReverseSequence: reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch ``b``.

On the device (a bit-exact copy, any dtype) when ``sequence_lens`` is a
constant, checked when planned; lengths computed at run time run on the CPU,
where a length outside ``[0, steps]`` is a typed error (a kernel could only
clamp it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from .._limits import element_count
from ._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from ._registry import register
from ._wgsl_kernels import gather_kernel

__all__ = ["ReverseSequence"]


@register
class ReverseSequence(Operator):
    op_type = "ReverseSequence"
    since_version = 10

    def _axes(self, rank: int, attrs: Mapping[str, Any]) -> tuple[int, int]:
        batch_axis = int(attrs.get("batch_axis", 1))
        time_axis = int(attrs.get("time_axis", 0))
        if rank < 2 or sorted((batch_axis, time_axis)) != [0, 1]:
            raise UnsupportedOpError(
                f"ReverseSequence: batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 (in some order) "
                f"of an input of rank >= 2 (rank {rank})"
            )
        return batch_axis, time_axis

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, lengths = inputs[0], inputs[1]
        assert x is not None and lengths is not None
        batch_axis, time_axis = self._axes(x.ndim, attrs)
        if lengths.shape != (x.shape[batch_axis],):
            raise ShapeError(f"ReverseSequence: sequence_lens {lengths.shape} for batch size {x.shape[batch_axis]}")
        steps = x.shape[time_axis]
        if lengths.size and (lengths.min() < 0 or lengths.max() > steps):
            raise InvalidArgumentError(f"ReverseSequence: a sequence length is outside [0, {steps}]")
        # Work in (time, batch, ...) order.
        view = np.moveaxis(x, (time_axis, batch_axis), (0, 1))
        output = view.copy()
        for b, length in enumerate(lengths.astype(np.int64)):
            output[:length, b] = view[:length, b][::-1]
        return [np.array(np.moveaxis(output, (0, 1), (time_axis, batch_axis)), order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, lengths = inputs[0], inputs[1]
        assert x is not None and lengths is not None
        batch_axis, time_axis = self._axes(len(x.shape), attrs)
        if 1 not in constants:
            raise NotOnDevice(
                "ReverseSequence: lengths computed at run time cannot be range-checked by a kernel; it runs on the CPU"
            )
        steps = x.shape[time_axis]
        constant = np.asarray(constants[1])
        if constant.shape != (x.shape[batch_axis],):
            raise ShapeError(f"ReverseSequence: sequence_lens {constant.shape} for batch size {x.shape[batch_axis]}")
        if constant.size and (constant.min() < 0 or constant.max() > steps):
            raise InvalidArgumentError(f"ReverseSequence: a sequence length is outside [0, {steps}]")
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        inner = element_count(x.shape[2:])
        time_stride = inner * (x.shape[1] if time_axis == 0 else 1)
        batch_stride = inner * (x.shape[1] if batch_axis == 0 else 1)
        coordinate_time, coordinate_batch = ("c0", "c1") if time_axis == 0 else ("c1", "c0")
        source = (
            "fn source(j: u32) -> vec2<u32> {\n"
            f"  let rest = j / {inner}u;\n"
            f"  let c1 = rest % {x.shape[1]}u;\n"
            f"  let c0 = rest / {x.shape[1]}u;\n"
            f"  let length = u32(aux0({coordinate_batch}));\n"
            f"  let t = select({coordinate_time}, length - 1u - {coordinate_time}, {coordinate_time} < length);\n"
            f"  return vec2<u32>(0u, t * {time_stride}u + {coordinate_batch} * {batch_stride}u + j % {inner}u);\n"
            "}\n"
        )
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]
        operator, attributes = ReverseSequence(), dict(attrs)

        def function(array: np.ndarray, length_array: np.ndarray) -> np.ndarray:
            return operator.reference([array, length_array], attributes, outputs)[0]

        kernel = gather_kernel(
            "ReverseSequence",
            [(bindings[0], x)],
            [(bindings[1], lengths)],
            out,
            source,
            caps,
            reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
