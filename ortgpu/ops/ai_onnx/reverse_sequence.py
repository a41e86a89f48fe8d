"""ReverseSequence: reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch ``b``.

On the device (a bit-exact copy, any dtype).  A constant ``sequence_lens`` is
checked when planned; lengths read at run time are checked by the kernel: one
outside ``[0, steps]`` (or an int64 whose high word is not the sign extension
of its low word) is clamped, so reads stay inside the input, and flags the run
in the program's status words, so it raises ``InvalidArgumentError`` (as the
reference does) instead of returning the clamped reversal.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, flagging_twin, reference_twin
from .._registry import register
from .._run_time_indices import index_lines, require_index_dtype
from .._wgsl_kernels import gather_kernel

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
        steps = x.shape[time_axis]
        if tuple(lengths.shape) != (x.shape[batch_axis],):
            raise ShapeError(f"ReverseSequence: sequence_lens {lengths.shape} for batch size {x.shape[batch_axis]}")
        checked = 1 not in constants
        if checked:
            require_index_dtype("ReverseSequence", lengths.dtype)
        else:
            constant = np.asarray(constants[1])
            if constant.size and (constant.min() < 0 or constant.max() > steps):
                raise InvalidArgumentError(f"ReverseSequence: a sequence length is outside [0, {steps}]")
        out = outputs[0]
        if out.size == 0:
            if checked and lengths.size:
                # no invocation would read (and check) the lengths
                raise NotOnDevice("ReverseSequence: the lengths of an empty input are checked on the CPU")
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
            + index_lines("count", coordinate_batch, lengths.dtype, 0, steps, checked=checked)
            + "  let length = u32(count);\n"
            f"  let t = select({coordinate_time}, length - 1u - {coordinate_time}, {coordinate_time} < length);\n"
            f"  return vec2<u32>(0u, t * {time_stride}u + {coordinate_batch} * {batch_stride}u + j % {inner}u);\n"
            "}\n"
        )
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]
        operator, attributes = ReverseSequence(), dict(attrs)

        def function(array: np.ndarray, length_array: np.ndarray) -> np.ndarray:
            return operator.reference([array, length_array], attributes, outputs)[0]

        twin = reference_twin(function, bindings, inputs, outputs)
        kernel = gather_kernel(
            "ReverseSequence",
            [(bindings[0], x)],
            [(bindings[1], lengths)],
            out,
            source,
            caps,
            # the reference's InvalidArgumentError becomes the status flag, as in the WGSL
            flagging_twin(twin, bindings + [Binding("status")]) if checked else twin,
            status=checked,
        )
        return OpPlan(kernels=(kernel,))
