"""MaxUnpool-9/11/22: scatter X into zeros at the flat indices I (MaxPool's Indices output).

The output shape is ``output_shape`` when given, else ``(N, C, (in - 1) * stride - pad_begin - pad_end +
kernel)`` per spatial axis.  Indices are flat positions in the whole output (batch and channel included), as
MaxPool writes them; an index outside the output is an error.  An output_shape other than the default is
refused: the ONNX reference and onnxruntime disagree on where its values go.  Computed on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["MaxUnpool"]


@register
class MaxUnpool(Operator):
    op_type = "MaxUnpool"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, indices = inputs[0], inputs[1]
        assert x is not None and indices is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"MaxUnpool: X of dtype {x.dtype} is not supported (float only)")
        if x.ndim < 3:
            raise ShapeError(f"MaxUnpool: X must have rank >= 3, got {x.shape}")
        if indices.shape != x.shape:
            raise ShapeError(f"MaxUnpool: I of shape {indices.shape} differs from X {x.shape}")
        if attrs.get("kernel_shape") is None:
            raise ShapeError("MaxUnpool: kernel_shape is required")
        rank = x.ndim - 2
        kernel = [int(v) for v in attrs["kernel_shape"]]
        strides = [int(v) for v in attrs.get("strides", [1] * rank)]
        pads = [int(v) for v in attrs.get("pads", [0] * (2 * rank))]
        if len(kernel) != rank or len(strides) != rank or len(pads) != 2 * rank:
            raise ShapeError(f"MaxUnpool: kernel_shape/strides/pads do not fit {rank} spatial axes")
        default = tuple(x.shape[:2]) + tuple(
            (size - 1) * s - b - e + k
            for size, s, b, e, k in zip(x.shape[2:], strides, pads[:rank], pads[rank:], kernel)
        )
        shape_input = inputs[2] if len(inputs) > 2 else None
        if shape_input is not None and shape_input.size:
            out_shape = tuple(int(v) for v in np.asarray(shape_input).reshape(-1))
            if len(out_shape) != x.ndim or out_shape[:2] != x.shape[:2]:
                raise ShapeError(f"MaxUnpool: output_shape {out_shape} does not fit X {x.shape}")
            if any(o < d for o, d in zip(out_shape[2:], default[2:])):
                raise ShapeError(f"MaxUnpool: output_shape {out_shape} is smaller than the default {default}")
            if out_shape != default:
                # The spec's text (and onnxruntime) read the indices as flat positions in the output; the ONNX
                # node test test_maxunpool_export_with_output_shape expects them unravelled in the default shape
                # and placed at the same coordinates.  The two differ whenever output_shape does, so ortgpu
                # refuses rather than pick one.
                raise UnsupportedOpError(
                    f"MaxUnpool: output_shape {out_shape} differing from the default {default} is not supported "
                    "(the ONNX reference and onnxruntime place the values differently)"
                )
        else:
            out_shape = default
        if any(d < 0 for d in out_shape):
            raise ShapeError(f"MaxUnpool: the output shape {out_shape} is negative")
        out = np.zeros(out_shape, dtype=x.dtype)
        flat = indices.astype(np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= out.size):
            raise ShapeError(f"MaxUnpool: an index is outside the output of {out.size} elements")
        out.reshape(-1)[flat] = x.reshape(-1)
        return [out]
