"""NonZero: the indices of the non-zero elements, one row per axis, in C order (CPU).

Its output size depends on the input's values (a shape-deciding input): the
node is planned only where the input is known.  A scalar input is refused:
onnx's shape inference gives it 0 rows, onnxruntime returns one row.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["NonZero"]


@register
class NonZero(Operator):
    op_type = "NonZero"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.ndim == 0:
            raise UnsupportedOpError(
                "NonZero of a scalar is not supported (onnx infers a (0, n) output, onnxruntime returns (1, n)); "
                "reshape the input to 1-D"
            )
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]
