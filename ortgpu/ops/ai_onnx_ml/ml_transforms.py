"""``ai.onnx.ml`` feature transforms: Binarizer and ArrayFeatureExtractor (CPU references).

Traditional-ML graphs (scikit-learn exports) put these around a model; they are small and run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["Binarizer", "ArrayFeatureExtractor"]

_ML_DOMAIN = "ai.onnx.ml"


@register
class Binarizer(Operator):
    """Binarizer-1 (ai.onnx.ml): 1 where ``x > threshold``, else 0, in the input's dtype."""

    op_type = "Binarizer"
    domain = _ML_DOMAIN
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fi":
            raise UnsupportedOpError(f"Binarizer: dtype {x.dtype.name} is not float32/float64/int32/int64")
        threshold = float(attrs.get("threshold", 0.0))
        return [(x > threshold).astype(x.dtype)]


@register
class ArrayFeatureExtractor(Operator):
    """ArrayFeatureExtractor-1 (ai.onnx.ml): the columns ``Y`` (int64) of ``X`` along its last axis; a 1-D ``X``
    reads as one row, so the output is ``[1, len(Y)]``."""

    op_type = "ArrayFeatureExtractor"
    domain = _ML_DOMAIN
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, indices = inputs[0], inputs[1]
        assert x is not None and indices is not None
        if x.ndim == 0:
            raise ShapeError("ArrayFeatureExtractor: X must have at least one axis")
        columns = np.asarray(indices, dtype=np.int64).reshape(-1)
        width = x.shape[-1]
        if columns.size and (columns.min() < 0 or columns.max() >= width):
            raise ShapeError(
                f"ArrayFeatureExtractor: column indices must lie in [0, {width}); got {columns.min()}..{columns.max()}"
            )
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        return [np.ascontiguousarray(rows[..., columns])]
