"""Dropout-1/6/7/10/12/13/22 for inference: ``output`` is the input and ``mask`` all ones (true).

Random dropout (``is_test=0`` before opset 7, a true ``training_mode`` input from opset 12) with a ratio above 0
is refused: its result is random, and ortgpu does not reproduce onnxruntime's generator (seeded node tests
expect one specific draw).  With ratio 0 training mode drops nothing (scale 1), so it runs.

On the device the output aliases the input (no kernel) and the mask is one fill kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import wgsl_compute_type
from .._wgsl_kernels import elementwise_kernel

__all__ = ["Dropout"]


@register
class Dropout(Operator):
    """Dropout, every opset (inference)."""

    op_type = "Dropout"
    since_version = 1
    opset_changes = (7, 10, 12)

    def _ratio(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> float:
        if self.opset >= 12:
            ratio = inputs[1] if len(inputs) > 1 else None
            return 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        return float(attrs.get("ratio", 0.5))

    def _training(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> bool:
        if self.opset >= 12:
            mode = inputs[2] if len(inputs) > 2 else None
            return mode is not None and bool(np.asarray(mode).reshape(-1)[0])
        if self.opset < 7:
            return not int(attrs.get("is_test", 0))
        return False

    def _check(self, training: bool, ratio: float) -> None:
        if training and ratio != 0.0:
            raise UnsupportedOpError(
                f"Dropout: random dropout (training mode, ratio {ratio}) is not supported: its result is random and "
                "ortgpu does not reproduce onnxruntime's generator; run the model for inference (training_mode "
                "false / is_test=1) or with ratio 0"
            )

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        self._check(self._training(inputs, attrs), self._ratio(inputs, attrs))
        results = [x.copy()]
        if len(outputs) > 1:
            # the mask is bool from opset 10, the data's type before
            results.append(np.ones(x.shape, dtype=np.bool_ if self.opset >= 10 else x.dtype))
        return results

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        values: list[np.ndarray | None] = [None] * len(inputs)
        if len(inputs) > 2 and inputs[2] is not None:
            if 2 not in constants:
                raise NotOnDevice("Dropout: training_mode is a computed value; the CPU checks it")
            values[2] = constants[2]
        training = self._training(values, attrs)
        if training:
            # the ratio matters in training mode only (ratio 0 drops nothing)
            if len(inputs) > 1 and inputs[1] is not None:
                if 1 not in constants:
                    raise NotOnDevice("Dropout: the ratio is a computed value; the CPU checks it")
                values[1] = constants[1]
            self._check(training, self._ratio(values, attrs))
        if len(outputs) < 2 or outputs[1].size == 0:
            return OpPlan(alias={0: 0})
        mask = outputs[1]
        one = "true" if mask.dtype == np.bool_ else f"{wgsl_compute_type(mask.dtype)}(1)"

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            arrays[0][: mask.nbytes] = np.ones(mask.shape, mask.dtype).reshape(-1).view(np.uint8)

        spec = elementwise_kernel("Dropout", [], mask, one, caps, twin)
        return OpPlan(kernels=(dataclasses.replace(spec, bindings=(Binding("output", 1),)),), alias={0: 0})
