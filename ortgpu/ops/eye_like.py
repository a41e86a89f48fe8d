"""EyeLike: ones on diagonal ``k`` of a 2-D tensor shaped like the input, zeros elsewhere (CPU; a constant-like
output the planner folds when the input shape is known)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx.helper

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["EyeLike"]


@register
class EyeLike(Operator):
    op_type = "EyeLike"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.ndim != 2:
            raise ShapeError(f"EyeLike: the input must be 2-D, got shape {x.shape}")
        dtype = x.dtype
        if "dtype" in attrs:
            try:
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(attrs["dtype"])))
            except Exception as error:  # noqa: BLE001 - an unknown or unrepresentable element type
                raise UnsupportedOpError(f"EyeLike: dtype {attrs['dtype']} is not supported ({error})") from None
            if dtype.kind not in "biuf":
                raise UnsupportedOpError(f"EyeLike: dtype {dtype} is not supported")
        k = int(attrs.get("k", 0))
        rows, cols = x.shape
        return [np.eye(rows, cols, k=k, dtype=dtype)]
