"""TensorScatter-24: write ``update`` into a copy of ``past_cache`` along the sequence ``axis`` (default -2, never
the batch axis), each batch row from its ``write_indices`` entry (default 0); ``mode="circular"`` wraps the
positions modulo the cache length, ``"linear"`` requires them to fit.

The device kernel is a gather (:func:`._wgsl_kernels.gather_kernel`): each output element is copied from the
update when its position was written, else from the past cache.  Write indices outside the cache in linear mode
are refused: constant ones when planning, ones read at run time by the kernel, which flags the run in the program's
status words (it raises ``InvalidArgumentError``, as the reference does; the writes are dropped meanwhile).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, flagging_twin, reference_twin
from .._registry import register
from .._wgsl_kernels import gather_kernel

__all__ = ["TensorScatter"]


def _settings(
    cache: Sequence[int], update: Sequence[int], indices: Sequence[int] | None, attrs: Mapping[str, Any]
) -> tuple[int, bool]:
    """(axis, circular) after checking the shapes."""
    rank = len(cache)
    axis = int(attrs.get("axis", -2))
    if rank < 2 or axis < -rank or axis >= rank or axis % rank == 0:
        raise UnsupportedOpError(f"TensorScatter: axis {axis} must name a non-batch axis of rank {rank}")
    axis %= rank
    mode = attrs.get("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("linear", "circular"):
        raise UnsupportedOpError(f"TensorScatter: mode {mode!r} is not defined (linear, circular)")
    if len(update) != rank or any(int(u) != int(c) for a, (u, c) in enumerate(zip(update, cache)) if a != axis):
        raise ShapeError(
            f"TensorScatter: update {tuple(update)} must match past_cache {tuple(cache)} but on axis {axis}"
        )
    if int(update[axis]) > int(cache[axis]):
        raise ShapeError(f"TensorScatter: update is longer ({update[axis]}) than the cache ({cache[axis]})")
    if indices is not None and tuple(indices) != (int(cache[0]),):
        raise ShapeError(f"TensorScatter: write_indices must have shape ({cache[0]},), got {tuple(indices)}")
    return axis, mode == "circular"


@register
class TensorScatter(Operator):
    """TensorScatter-24."""

    op_type = "TensorScatter"
    since_version = 24

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        past, update = inputs[0], inputs[1]
        assert past is not None and update is not None
        indices = inputs[2] if len(inputs) > 2 else None
        axis, circular = _settings(past.shape, update.shape, None if indices is None else indices.shape, attrs)
        length, steps = past.shape[axis], update.shape[axis]
        starts = np.zeros(past.shape[0], np.int64) if indices is None else indices.astype(np.int64)
        if steps and length == 0:
            raise ShapeError("TensorScatter: cannot write into an empty cache")
        if not circular and steps and (np.any(starts < 0) or np.any(starts + steps > length)):
            raise InvalidArgumentError(
                f"TensorScatter: linear mode needs 0 <= write index and index + {steps} <= {length}"
            )
        present = past.copy()
        for b in range(past.shape[0]):
            positions = starts[b] + np.arange(steps)
            if circular:
                positions = positions % length
            target = np.moveaxis(present[b], axis - 1, 0)
            target[positions] = np.moveaxis(update[b], axis - 1, 0)
        return [present]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        past, update = inputs[0], inputs[1]
        assert past is not None and update is not None
        indices = inputs[2] if len(inputs) > 2 else None
        axis, circular = _settings(past.shape, update.shape, None if indices is None else indices.shape, attrs)
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        if 2 in constants:
            # the reference checks constant write indices now (linear mode's bounds)
            self.reference(
                [np.zeros(past.shape, past.dtype), np.zeros(update.shape, update.dtype), constants[2]], attrs, outputs
            )
        length, steps = int(past.shape[axis]), int(update.shape[axis])
        inner = element_count(past.shape[axis + 1 :])
        per_batch = element_count(past.shape[1:])
        start = "0" if indices is None else "aux0(b)"
        # Linear mode with write indices read at run time: one that does not fit is flagged (the run raises
        # InvalidArgumentError, as the reference does), its writes dropped meanwhile.
        checked = indices is not None and not circular and 2 not in constants and steps > 0
        check = f"\n  if (w < 0 || w > {length - steps}) {{ atomicOr(&status[0], 1u); }}" if checked else ""
        # unsigned remainders only (the signed-remainder form was wrong on NVIDIA's driver): w wraps into
        # [0, length) first, so c - w + length is never negative
        offset = (
            f"i32((u32(c) + {length}u - select(u32(w) % {length}u, ({length}u - u32(-w) % {length}u) % {length}u, "
            f"w < 0)) % {length}u)"
            if circular
            else "c - w"
        )
        source = f"""fn source(j: u32) -> vec2<u32> {{
  let b = j / {per_batch}u;
  let c = i32((j / {inner}u) % {length}u);
  let w = i32({start});
  let o = {offset};{check}
  if (o < 0 || o >= {steps}) {{ return vec2<u32>(0u, j); }}
  let outer = j / {inner * length}u;
  let k = (outer * {steps}u + u32(o)) * {inner}u + j % {inner}u;
  return vec2<u32>(1u, k);
}}
"""
        sources = [(Binding("input", 0), past), (Binding("input", 1), update)]
        auxiliaries = [] if indices is None else [(Binding("input", 2), indices)]
        bindings = [b for b, _ in sources] + [b for b, _ in auxiliaries] + [Binding("output", 0)]
        compute = lambda *arrays: self.reference(list(arrays), attrs, outputs)[0]  # noqa: E731
        if checked:
            bindings.append(Binding("status"))
            twin = flagging_twin(reference_twin(compute, bindings, inputs, outputs), bindings)
        else:
            twin = reference_twin(compute, bindings, inputs, outputs)
        kernel = gather_kernel("TensorScatter", sources, auxiliaries, out, source, caps, twin, status=checked)
        return OpPlan(kernels=(kernel,))
