"""HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix: constant-like generators (CPU).

Their sizes are inputs (shape-deciding: planned only where known), so the
planner usually folds them into constants.  Values are computed in float64 and
rounded once to ``output_datatype`` (float32 by default; integer types truncate
toward zero, as a C cast does).

Windows: ``w[n] = sum_k (-1)^k a_k cos(2 pi k n / N)`` for ``n < size`` with
``N = size`` (``periodic=1``, the default) or ``size - 1`` (symmetric).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx.helper

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import numpy_dtype_of
from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"]


def _output_dtype(op_type: str, attrs: Mapping[str, Any]) -> np.dtype[Any]:
    element_type = int(attrs.get("output_datatype", onnx.TensorProto.FLOAT))
    dtype = numpy_dtype_of(element_type)
    if dtype is None or dtype.kind not in "iuf":
        raise UnsupportedOpError(f"{op_type}: output_datatype {element_type} is not supported (a numeric type)")
    return dtype


def _scalar(op_type: str, value: np.ndarray | None, what: str) -> float:
    if value is None or value.size != 1:
        raise ShapeError(f"{op_type}: {what} must be a scalar")
    return float(np.asarray(value).reshape(-1)[0])


def _cast(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind in "iu":
        values = np.trunc(values)
    return np.array(values.astype(dtype), order="C")


class _Window(Operator):
    since_version = 17
    #: cosine-sum coefficients a_0, a_1, ...
    coefficients: tuple[float, ...] = ()

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        size = int(_scalar(self.op_type, inputs[0], "size"))
        if size < 0:
            raise ShapeError(f"{self.op_type}: size {size} is negative")
        periodic = bool(int(attrs.get("periodic", 1)))
        dtype = _output_dtype(self.op_type, attrs)
        period = size if periodic else size - 1
        if size == 1 and period == 0:
            # 2 pi n / (size - 1) is 0 / 0: onnxruntime returns NaN, which no integer type holds.
            if dtype.kind != "f":
                raise UnsupportedOpError(
                    f"{self.op_type}: a symmetric window of one sample is NaN; {dtype} cannot hold it"
                )
            return [np.full(1, np.nan, dtype=dtype)]
        n = np.arange(size, dtype=np.float64)
        phase = 2 * np.pi * n / max(period, 1)
        values = np.zeros(size, dtype=np.float64)
        # Highest term first: the peaks then sum to exactly 1 (0.08 + 0.5 + 0.42), as onnxruntime's do, so that
        # integer output types truncate them to 1 as it does.
        for k in reversed(range(len(self.coefficients))):
            values += (-1) ** k * self.coefficients[k] * np.cos(k * phase)
        return [_cast(values, dtype)]


@register
class HannWindow(_Window):
    op_type = "HannWindow"
    coefficients = (0.5, 0.5)


@register
class HammingWindow(_Window):
    op_type = "HammingWindow"
    coefficients = (25 / 46, 21 / 46)


@register
class BlackmanWindow(_Window):
    op_type = "BlackmanWindow"
    coefficients = (0.42, 0.5, 0.08)


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * float(np.log10(1.0 + hz / 700.0))


def _mel_to_hz(mel: float) -> float:
    return 700.0 * (float(10.0 ** (mel / 2595.0)) - 1.0)


@register
class MelWeightMatrix(Operator):
    """``[dft_length // 2 + 1, num_mel_bins]`` triangular filters with peaks of 1.

    Edge ``i`` (of ``num_mel_bins + 2``) is ``lower_mel + i * (upper_mel - lower_mel) / (num_mel_bins + 2)`` in mel,
    placed on DFT bin ``floor((dft_length + 1) * hz / sample_rate)``; filter ``i`` rises from edge ``i`` to 1 at edge
    ``i + 1`` (inclusive) and falls to edge ``i + 2`` (exclusive).  This is onnxruntime's construction, which the
    ONNX test data follow.
    """

    op_type = "MelWeightMatrix"
    since_version = 17

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        mel_bins = int(_scalar(self.op_type, inputs[0], "num_mel_bins"))
        dft_length = int(_scalar(self.op_type, inputs[1], "dft_length"))
        sample_rate = _scalar(self.op_type, inputs[2], "sample_rate")
        lower = _scalar(self.op_type, inputs[3], "lower_edge_hertz")
        upper = _scalar(self.op_type, inputs[4], "upper_edge_hertz")
        if mel_bins < 0 or dft_length < 1 or sample_rate <= 0:
            raise ShapeError(f"{self.op_type}: {mel_bins} bins, dft_length {dft_length}, sample_rate {sample_rate}")
        spectrum_bins = dft_length // 2 + 1
        low_mel, high_mel = _hz_to_mel(lower), _hz_to_mel(upper)
        # The mel range is cut into num_mel_bins + 2 steps (as onnxruntime does), the last edge one step short of it.
        step = (high_mel - low_mel) / (mel_bins + 2)
        edges = [
            int(np.floor((dft_length + 1) * _mel_to_hz(low_mel + i * step) / sample_rate)) for i in range(mel_bins + 2)
        ]
        if edges and (edges[0] < 0 or edges[-1] >= spectrum_bins):
            # onnxruntime refuses filters that reach past the spectrum; cutting them off would change their shape.
            raise ShapeError(
                f"{self.op_type}: the filters span DFT bins {edges[0]}..{edges[-1]}, outside the {spectrum_bins} "
                "bins of dft_length; lower upper_edge_hertz or raise dft_length"
            )
        matrix = np.zeros((spectrum_bins, mel_bins), dtype=np.float64)
        for i in range(mel_bins):
            low, center, high = edges[i], edges[i + 1], edges[i + 2]
            if center == low:
                if 0 <= center < spectrum_bins:
                    matrix[center, i] = 1.0
            else:
                for j in range(max(low, 0), min(center + 1, spectrum_bins)):
                    matrix[j, i] = (j - low) / (center - low)
            if high > center:
                for j in range(max(center, 0), min(high, spectrum_bins)):
                    matrix[j, i] = (high - j) / (high - center)
        return [_cast(matrix, _output_dtype(self.op_type, attrs))]
