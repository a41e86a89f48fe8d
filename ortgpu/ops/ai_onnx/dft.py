"""DFT and STFT: discrete Fourier transforms on the CPU (numpy's FFT, in single precision for float16/32 inputs and
double for float64: the precision the ONNX test data were computed in).

DFT's input is ``[..., 1 or 2]``: the last axis holds the real part (1) or
the real and imaginary parts (2); the transform runs along ``axis`` (an
attribute in opsets 17-19, default 1; an optional input from opset 20, default
-2), counted over every axis including that last one (valid: ``[-r, -2]`` and
``[0, r - 2]``).  ``dft_length`` zero-pads or truncates the signal first.
``onesided=1`` keeps the ``n // 2 + 1`` non-redundant bins of a real signal's
transform; with ``inverse=1`` it is the inverse of that: the onesided input
expands by conjugate symmetry and the output is real (``[..., n, 1]``, ``n`` the
``dft_length`` or ``2 * (bins - 1)``).  The inverse is scaled by ``1 / n``.

STFT: frames of ``frame_length`` samples every ``frame_step`` samples of
``signal`` ``[batch, length, 1 or 2]``, each multiplied by ``window`` and
transformed: ``[batch, frames, bins, 2]``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["DFT", "STFT"]


def _complex(signal: np.ndarray, op_type: str) -> np.ndarray:
    if signal.dtype not in (np.float32, np.float16, np.float64):
        raise UnsupportedOpError(f"{op_type}: inputs of dtype {signal.dtype} (float16/32/64 expected)")
    if signal.ndim < 2 or signal.shape[-1] not in (1, 2):
        raise ShapeError(f"{op_type}: the last axis must have length 1 (real) or 2 (complex), got {signal.shape}")
    complex_dtype = np.complex128 if signal.dtype == np.float64 else np.complex64
    values = np.zeros(signal.shape[:-1], dtype=complex_dtype)
    values.real = signal[..., 0]
    if signal.shape[-1] == 2:
        values.imag = signal[..., 1]
    return values


def _as_pairs(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    return np.array(np.stack([values.real, values.imag], axis=-1).astype(dtype), order="C")


def _scalar_int(value: np.ndarray, op_type: str, what: str) -> int:
    if value.size != 1 or value.dtype.kind not in "iu":
        raise ShapeError(f"{op_type}: {what} must be an integer scalar")
    return int(value.reshape(-1)[0])


def dft(
    signal: np.ndarray, length: int | None, axis: int, inverse: bool, onesided: bool, op_type: str = "DFT"
) -> np.ndarray:
    rank = signal.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise UnsupportedOpError(f"{op_type}: axis {axis} is outside [-{rank}, -2] and [0, {rank - 2}]")
    axis = axis + rank if axis < 0 else axis
    values = _complex(signal, op_type)  # the complex axis is gone: `axis` still indexes the signal axes
    if length is not None and length < 1:
        raise ShapeError(f"{op_type}: dft_length {length} must be positive")
    if inverse and onesided:
        if signal.shape[-1] != 2:
            raise ShapeError(f"{op_type}: an inverse onesided DFT needs a complex (onesided) input")
        n = length if length is not None else 2 * (values.shape[axis] - 1)
        if n < 1:
            raise ShapeError(f"{op_type}: an inverse onesided DFT of {values.shape[axis]} bins has no length")
        real = np.fft.irfft(values, n=n, axis=axis)
        return np.array(real[..., np.newaxis].astype(signal.dtype), order="C")
    if onesided and signal.shape[-1] == 2:
        raise UnsupportedOpError(f"{op_type}: onesided output needs a real input (the last axis of length 1)")
    transform = np.fft.ifft(values, n=length, axis=axis) if inverse else np.fft.fft(values, n=length, axis=axis)
    if onesided:
        bins = transform.shape[axis] // 2 + 1
        transform = np.take(transform, np.arange(bins), axis=axis)
    return _as_pairs(transform, signal.dtype)


@register
class DFT(Operator):
    op_type = "DFT"
    since_version = 17
    opset_changes = (20,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        signal = inputs[0]
        assert signal is not None
        length_input = inputs[1] if len(inputs) > 1 else None
        length = None if length_input is None else _scalar_int(length_input, self.op_type, "dft_length")
        if self.opset >= 20:
            axis_input = inputs[2] if len(inputs) > 2 else None
            axis = -2 if axis_input is None else _scalar_int(axis_input, self.op_type, "axis")
        else:
            axis = int(attrs.get("axis", 1))
        inverse = bool(int(attrs.get("inverse", 0)))
        onesided = bool(int(attrs.get("onesided", 0)))
        return [dft(signal, length, axis, inverse, onesided)]


@register
class STFT(Operator):
    op_type = "STFT"
    since_version = 17

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        signal, step_input = inputs[0], inputs[1]
        assert signal is not None and step_input is not None
        window = inputs[2] if len(inputs) > 2 else None
        length_input = inputs[3] if len(inputs) > 3 else None
        if signal.ndim != 3:
            raise ShapeError(f"STFT: the signal must be [batch, length, 1 or 2], got {signal.shape}")
        values = _complex(signal, self.op_type)  # [batch, length]
        step = _scalar_int(step_input, self.op_type, "frame_step")
        if window is not None and window.ndim != 1:
            raise ShapeError(f"STFT: the window must be 1-D, got {window.shape}")
        if length_input is not None:
            frame_length = _scalar_int(length_input, self.op_type, "frame_length")
            if window is not None and window.shape[0] != frame_length:
                raise ShapeError(f"STFT: a window of {window.shape[0]} for frame_length {frame_length}")
        elif window is not None:
            frame_length = window.shape[0]
        else:
            raise ShapeError("STFT: either window or frame_length is needed")
        onesided = bool(int(attrs.get("onesided", 1)))
        if onesided and signal.shape[-1] == 2:
            raise UnsupportedOpError("STFT: onesided output needs a real signal (the last axis of length 1)")
        if step < 1 or frame_length < 1 or frame_length > values.shape[1]:
            raise ShapeError(f"STFT: frame_step {step} / frame_length {frame_length} for {values.shape[1]} samples")
        frames = (values.shape[1] - frame_length) // step + 1
        starts = np.arange(frames) * step
        framed = values[:, starts[:, None] + np.arange(frame_length)[None, :]]  # [batch, frames, frame_length]
        if window is not None:
            framed = framed * window.astype(framed.real.dtype)
        transform = np.fft.fft(framed, axis=-1)
        if onesided:
            transform = transform[..., : frame_length // 2 + 1]
        return [_as_pairs(transform, signal.dtype)]
