"""LabelEncoder (ai.onnx.ml): a lookup table from keys to values, element by element, with a default.

* opset 1: ``classes_strings``; a string input maps to its index in the list (``default_int64``, -1 when
  absent), an int64 input to the string at that index (``default_string``, "_Unused", when out of range);
* opset 2: parallel ``keys_*`` / ``values_*`` lists (strings, int64s, floats) and ``default_*`` of the values'
  type (-1, "_Unused", -0.0);
* opset 4: also ``keys_tensor`` / ``values_tensor`` (any of the types above, plus e.g. int16 or float64) and
  ``default_tensor``.

Float keys: from opset 4 a NaN key matches any NaN input (before, NaN equals nothing, as onnxruntime does).  A
repeated key is refused: the spec maps it to its last value, onnxruntime to its first.  A host operator: string
tensors live on the host, and a table lookup has no kernel here (it runs on the CPU for numeric types too).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["LabelEncoder"]

_ML_DOMAIN = "ai.onnx.ml"


def _key(value: Any, nan_matches: bool) -> Any:
    """A hashable key: numbers by value, strings as themselves; NaN as one key where NaN keys match any NaN
    (opset 4), else a key no input ever has (NaN equals nothing)."""
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, (float, np.floating)) and math.isnan(float(value)):
        return ("nan",) if nan_matches else ("nan", object())
    if isinstance(value, (bool, np.bool_)):
        return ("n", int(value))
    return ("n", value.item() if isinstance(value, np.generic) else value)


@register
class LabelEncoder(Operator):
    op_type = "LabelEncoder"
    domain = _ML_DOMAIN
    since_version = 1
    opset_changes = (2, 4)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        if x is None:
            raise UnsupportedOpError(f"LabelEncoder (opset {self.opset}): the input is absent")
        if self.opset < 2:
            keys, values, default = self._classes(x, attrs)
        else:
            keys, values, default = self._table(attrs)
        if len(keys) != len(values):
            raise UnsupportedOpError(
                f"LabelEncoder (opset {self.opset}): {len(keys)} keys but {len(values)} values; they must match"
            )
        out_dtype = values.dtype
        keys_are_strings = keys.dtype == object
        if (x.dtype == object) != keys_are_strings:
            raise UnsupportedOpError(
                f"LabelEncoder (opset {self.opset}): the input is {x.dtype.name} but the keys are "
                f"{'strings' if keys_are_strings else keys.dtype.name}"
            )
        nan_matches = self.opset >= 4
        table = {_key(k, nan_matches): v for k, v in zip(keys.tolist(), values.tolist())}
        if len(table) != len(keys):
            # The spec makes the last of repeated keys win, onnxruntime the first: refused rather than guessed.
            raise UnsupportedOpError(
                f"LabelEncoder (opset {self.opset}): a key is repeated; the spec maps it to its last value and "
                "onnxruntime to its first, so ortgpu refuses it: remove the repeated keys"
            )
        out = np.empty(x.shape, dtype=out_dtype)
        for index, item in np.ndenumerate(x):
            out[index] = table.get(_key(item, nan_matches), default)
        return [out]

    def _classes(self, x: np.ndarray, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, Any]:
        """Opset 1: strings <-> their index in ``classes_strings``."""
        classes = np.array([str(c) for c in attrs.get("classes_strings", [])], dtype=object)
        indices = np.arange(len(classes), dtype=np.int64)
        if x.dtype == object:
            return classes, indices, int(attrs.get("default_int64", -1))
        if x.dtype != np.int64:
            raise UnsupportedOpError(f"LabelEncoder (opset 1): input dtype {x.dtype.name} is not string or int64")
        return indices, classes, str(attrs.get("default_string", "_Unused"))

    def _table(self, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, Any]:
        """Opsets 2 and 4: the keys, the values and the default (of the values' type)."""
        keys = self._one_of(attrs, "keys")
        values = self._one_of(attrs, "values")
        if values.dtype == object:
            default: Any = str(attrs.get("default_string", "_Unused"))
        elif values.dtype.kind == "f":
            default = float(attrs.get("default_float", -0.0))
        else:
            default = int(attrs.get("default_int64", -1))
        tensor = attrs.get("default_tensor")
        if tensor is not None:
            tensor = np.asarray(tensor)
            if tensor.size != 1:
                raise UnsupportedOpError(
                    f"LabelEncoder (opset {self.opset}): default_tensor must hold one value, got shape {tensor.shape}"
                )
            if tensor.dtype != values.dtype:
                raise UnsupportedOpError(
                    f"LabelEncoder (opset {self.opset}): default_tensor is {tensor.dtype.name}, the values "
                    f"{values.dtype.name}"
                )
            default = tensor.reshape(()).item()
        return keys, values, default

    def _one_of(self, attrs: Mapping[str, Any], prefix: str) -> np.ndarray:
        names = [f"{prefix}_strings", f"{prefix}_int64s", f"{prefix}_floats", f"{prefix}_tensor"]
        found = [name for name in names if name in attrs]
        if len(found) != 1:
            raise UnsupportedOpError(
                f"LabelEncoder (opset {self.opset}): exactly one of {names} must be set, got {found}"
            )
        name, value = found[0], attrs[found[0]]
        if name.endswith("_tensor") and self.opset < 4:
            raise UnsupportedOpError(f"LabelEncoder (opset {self.opset}): {name} needs ai.onnx.ml opset 4")
        if name.endswith("_strings"):
            return np.array([str(s) for s in value], dtype=object)
        if name.endswith("_int64s"):
            return np.array(value, dtype=np.int64)
        if name.endswith("_floats"):
            return np.array(value, dtype=np.float32)
        return np.asarray(value).reshape(-1)
