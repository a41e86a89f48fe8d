"""The pieces of the recurrent operators (RNN, GRU, LSTM): activation functions and per-direction cells.

Everything here works on float64 arrays (the operators widen their inputs once and round the outputs once), so
a long sequence accumulates no float32/float16 rounding of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

__all__ = ["Activation", "activations_for", "decode_names"]

Array = np.ndarray
Function = Callable[[Array], Array]


def _sigmoid(x: Array) -> Array:
    # exp of a non-positive argument only: no overflow warnings for large |x|.
    e = np.exp(-np.abs(x))
    return np.asarray(np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)))


def _softplus(x: Array) -> Array:
    # log(1 + exp(x)) written so large x neither overflows nor loses precision.
    return np.asarray(np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))))


@dataclass(frozen=True)
class _Kind:
    """An activation name: how many of ``activation_alpha`` / ``activation_beta`` it takes, and its defaults."""

    takes_alpha: bool
    takes_beta: bool
    #: the default where one is agreed on; None: the node must list the value (see ``_KINDS``)
    alpha: float | None
    beta: float | None
    make: Callable[[float, float], Function]


# Defaults are those of the ONNX operators of the same name where onnxruntime agrees (LeakyRelu, HardSigmoid,
# Elu).  Where they disagree the node must list the value, else it is refused rather than guessed: onnxruntime
# takes 0 for every unlisted Affine / ScaledTanh / ThresholdedRelu parameter, while ThresholdedRelu's default is
# 1.0 and the former experimental Affine's was alpha 1.0 (ScaledTanh had none).
_KINDS: dict[str, _Kind] = {
    "relu": _Kind(False, False, 0.0, 0.0, lambda a, b: lambda x: np.maximum(x, 0.0)),
    "tanh": _Kind(False, False, 0.0, 0.0, lambda a, b: np.tanh),
    "sigmoid": _Kind(False, False, 0.0, 0.0, lambda a, b: _sigmoid),
    "affine": _Kind(True, True, None, None, lambda a, b: lambda x: a * x + b),
    "leakyrelu": _Kind(True, False, 0.01, 0.0, lambda a, b: lambda x: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": _Kind(True, False, None, 0.0, lambda a, b: lambda x: np.where(x > a, x, 0.0)),
    "scaledtanh": _Kind(True, True, None, None, lambda a, b: lambda x: a * np.tanh(b * x)),
    "hardsigmoid": _Kind(True, True, 0.2, 0.5, lambda a, b: lambda x: np.clip(a * x + b, 0.0, 1.0)),
    "elu": _Kind(True, False, 1.0, 0.0, lambda a, b: lambda x: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))),
    "softsign": _Kind(False, False, 0.0, 0.0, lambda a, b: lambda x: x / (1.0 + np.abs(x))),
    "softplus": _Kind(False, False, 0.0, 0.0, lambda a, b: _softplus),
}


@dataclass(frozen=True)
class Activation:
    """One activation function with its parameters bound, and an optional clip of its argument."""

    name: str
    function: Function
    clip: float | None
    #: the bound parameters (0.0 where the function takes none): the WGSL kernels bake them in
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, x: Array) -> Array:
        if self.clip is not None:
            x = np.clip(x, -self.clip, self.clip)
        return self.function(x)


def decode_names(value: Any) -> list[str]:
    """A STRINGS attribute as a list of str (the loader may give bytes)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = [value]
    return [v.decode() if isinstance(v, bytes) else str(v) for v in value]


def activations_for(
    op_type: str,
    defaults: Sequence[str],
    num_directions: int,
    names: Sequence[str],
    alphas: Sequence[float],
    betas: Sequence[float],
    clip: float | None,
) -> list[list[Activation]]:
    """The activations of each direction (``len(defaults)`` per direction).

    ``activation_alpha`` / ``activation_beta`` are consumed in the order of the activations, each by the
    activations that take that parameter; an activation whose value is not listed takes its default.  A
    bidirectional node lists both directions' activations, forward first (onnxruntime refuses fewer too).
    """
    per_direction = len(defaults)
    names = list(names) if names else list(defaults) * num_directions
    if len(names) != per_direction * num_directions:
        raise UnsupportedOpError(
            f"{op_type}: 'activations' lists {len(names)} functions; {per_direction * num_directions} are needed "
            f"({per_direction} per direction, {num_directions} direction(s))"
        )
    alpha_iter, beta_iter = iter(alphas), iter(betas)
    bound: list[Activation] = []
    for name in names:
        kind = _KINDS.get(name.lower())
        if kind is None:
            raise UnsupportedOpError(
                f"{op_type}: activation {name!r} is not supported (supported: Relu, Tanh, Sigmoid, Affine, "
                "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)"
            )
        alpha = next(alpha_iter, kind.alpha) if kind.takes_alpha else 0.0
        beta = next(beta_iter, kind.beta) if kind.takes_beta else 0.0
        if alpha is None or beta is None:
            raise UnsupportedOpError(
                f"{op_type}: activation {name!r} needs its activation_alpha"
                + (" and activation_beta" if kind.takes_beta else "")
                + " listed: its default is not agreed on (onnxruntime takes 0, the ONNX operator's default "
                "differs), so ortgpu does not guess; give the values explicitly"
            )
        bound.append(Activation(name, kind.make(float(alpha), float(beta)), clip, float(alpha), float(beta)))
    return [bound[d * per_direction : (d + 1) * per_direction] for d in range(num_directions)]
