"""The optimizer steps of the ``ai.onnx.preview.training`` domain: Adagrad, Adam and Momentum (version 1).

Each takes a scalar learning rate ``R`` and a scalar int64 update count ``T``, then groups of tensors of one
length ``n`` each: the tensors to optimize ``X_1..X_n``, their gradients ``G_1..G_n`` and the optimizer's state
(Adagrad: ``H``; Momentum: ``V``; Adam: ``V`` then ``H``).  The outputs are the new ``X`` group followed by the
new state groups.  The update follows the pseudo code of the ONNX operator documents, elementwise and
independently per tensor; it runs in float64 and each output is rounded once to its input's type.

They run on the CPU: training steps are outside what ortgpu's device kernels cover (``plan`` says so).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["Adagrad", "Adam", "Momentum"]

DOMAIN = "ai.onnx.preview.training"
Array = np.ndarray


class _Optimizer(Operator):
    domain = DOMAIN
    since_version = 1
    #: tensor groups after R and T: X, G and the state groups
    groups = 3

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type}: the training-domain optimizer steps run on the CPU")

    def _split(self, inputs: Sequence[np.ndarray | None]) -> tuple[float, int, list[list[Array]]]:
        """``R`` and ``T`` as Python scalars, and the tensor groups (each of ``n`` arrays)."""
        op = self.op_type
        if len(inputs) < 2 + self.groups or (len(inputs) - 2) % self.groups:
            raise ShapeError(
                f"{op}: expected R, T and {self.groups} groups of equally many tensors; got {len(inputs)} inputs"
            )
        if any(value is None for value in inputs):
            raise ShapeError(f"{op}: no input may be omitted")
        rate, count = inputs[0], inputs[1]
        assert rate is not None and count is not None
        if rate.size != 1 or count.size != 1:
            raise ShapeError(f"{op}: R and T must be scalars (got shapes {rate.shape} and {count.shape})")
        n = (len(inputs) - 2) // self.groups
        tensors = [value for value in inputs[2:] if value is not None]
        groups = [tensors[g * n : (g + 1) * n] for g in range(self.groups)]
        for index in range(n):
            x = groups[0][index]
            if x.dtype.kind != "f":
                raise UnsupportedOpError(f"{op}: tensor type {x.dtype} is not supported (float32, float64 are)")
            for group in groups[1:]:
                if group[index].shape != x.shape:
                    raise ShapeError(
                        f"{op}: tensor {index} has shape {x.shape} but its companion has shape {group[index].shape}"
                    )
        return float(rate.reshape(())), int(count.reshape(())), groups

    def _coefficient(self, attrs: Mapping[str, Any], name: str, default: float | None = None) -> float:
        if name not in attrs:
            if default is None:
                raise UnsupportedOpError(f"{self.op_type}: attribute {name!r} is required (it has no default)")
            # The schema's defaults are FLOAT attributes: float32 values, as an explicit attribute would hold.
            return float(np.float32(default))
        return float(attrs[name])


@register
class Adagrad(_Optimizer):
    """Adagrad-1: inputs R, T, X..., G..., H...; outputs X_new..., H_new..."""

    op_type = "Adagrad"
    groups = 3

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        rate, count, (xs, gs, hs) = self._split(inputs)
        decay = self._coefficient(attrs, "decay_factor", 0.0)
        epsilon = self._coefficient(attrs, "epsilon", 1e-6)
        norm = self._coefficient(attrs, "norm_coefficient", 0.0)
        r = rate / (1.0 + count * decay)
        new_x, new_h = [], []
        for x, g, h in zip(xs, gs, hs):
            wx = x.astype(np.float64)
            regularized = norm * wx + g.astype(np.float64)
            h_new = h.astype(np.float64) + regularized * regularized
            new_x.append((wx - r * regularized / (np.sqrt(h_new) + epsilon)).astype(x.dtype))
            new_h.append(h_new.astype(h.dtype))
        return new_x + new_h


@register
class Momentum(_Optimizer):
    """Momentum-1 (``mode`` standard or nesterov): inputs R, T, X..., G..., V...; outputs X_new..., V_new..."""

    op_type = "Momentum"
    groups = 3

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        rate, count, (xs, gs, vs) = self._split(inputs)
        alpha = self._coefficient(attrs, "alpha")
        beta = self._coefficient(attrs, "beta")
        norm = self._coefficient(attrs, "norm_coefficient")
        mode = attrs.get("mode")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode not in ("standard", "nesterov"):
            raise UnsupportedOpError(f"Momentum: mode {mode!r} is not defined (standard or nesterov)")
        # The first update (T == 0) takes the whole gradient.
        beta_adjusted = beta if count > 0 else 1.0
        new_x, new_v = [], []
        for x, g, v in zip(xs, gs, vs):
            wx = x.astype(np.float64)
            regularized = norm * wx + g.astype(np.float64)
            v_new = alpha * v.astype(np.float64) + beta_adjusted * regularized
            direction = v_new if mode == "standard" else regularized + alpha * v_new
            new_x.append((wx - rate * direction).astype(x.dtype))
            new_v.append(v_new.astype(v.dtype))
        return new_x + new_v


@register
class Adam(_Optimizer):
    """Adam-1: inputs R, T, X..., G..., V..., H...; outputs X_new..., V_new..., H_new..."""

    op_type = "Adam"
    groups = 4

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        rate, count, (xs, gs, vs, hs) = self._split(inputs)
        alpha = self._coefficient(attrs, "alpha", 0.9)
        beta = self._coefficient(attrs, "beta", 0.999)
        epsilon = self._coefficient(attrs, "epsilon", 1e-6)
        norm = self._coefficient(attrs, "norm_coefficient", 0.0)
        norm_post = self._coefficient(attrs, "norm_coefficient_post", 0.0)
        # Bias correction of the averages from the second update on.
        adjusted = rate * math.sqrt(1.0 - beta**count) / (1.0 - alpha**count) if count > 0 else rate
        new_x, new_v, new_h = [], [], []
        for x, g, v, h in zip(xs, gs, vs, hs):
            wx = x.astype(np.float64)
            regularized = norm * wx + g.astype(np.float64)
            v_new = alpha * v.astype(np.float64) + (1.0 - alpha) * regularized
            h_new = beta * h.astype(np.float64) + (1.0 - beta) * regularized * regularized
            x_new = wx - adjusted * v_new / (np.sqrt(h_new) + epsilon)
            new_x.append(((1.0 - norm_post) * x_new).astype(x.dtype))
            new_v.append(v_new.astype(v.dtype))
            new_h.append(h_new.astype(h.dtype))
        return new_x + new_v + new_h
