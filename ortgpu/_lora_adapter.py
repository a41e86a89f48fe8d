"""LoRA adapters in onnxruntime's Python spelling: :class:`AdapterFormat` (write and read ``.onnx_adapter`` files) and
:class:`LoraAdapter` (a loaded file, made active for a run with ``RunOptions.add_active_adapter``).

An adapter is a set of named tensors; a run with active adapters feeds each one as the model input of its name,
which in LoRA models is an initializer also listed as a graph input (onnxruntime's "overridable initializer", whose
value is the default when nothing is fed).  How a session runs them is in :mod:`ortgpu._adapter_runs`; the file
format in :mod:`ortgpu._adapter_format`.  Parameters are host values (``OrtValue[CPU]``): a run uploads them as it
uploads host feeds.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from ortgpu_core import CPU, ArgumentTypeError, DtypeError, OrtValue, WebGPU
from ortgpu_core._dtypes import dtype_from_onnx, onnx_element_type

from ._adapter_format import (
    FORMAT_VERSION,
    LORA_ELEMENT_SIZES,
    AdapterFileError,
    AdapterParameter,
    decode_adapter,
    encode_adapter,
)

__all__ = ["AdapterFormat", "LoraAdapter", "AdapterFileError"]


def _checked_path(file_path: object, method: str) -> str:
    if isinstance(file_path, (bytes, bytearray)) or not isinstance(file_path, (str, os.PathLike)):
        raise ArgumentTypeError(f"{method} takes a file path (str or os.PathLike), got {type(file_path).__name__}")
    return os.fspath(file_path)


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise AdapterFileError(f"adapter file {path!r} does not exist; check the path") from None
    except OSError as error:
        raise AdapterFileError(f"cannot read adapter file {path!r}: {error.strerror or error}") from error


def _read_parameters(path: str) -> tuple[int, int, int, dict[str, OrtValue[CPU]]]:
    """The versions and parameters (host values, file order) of the adapter file at ``path``."""
    contents = decode_adapter(_read_file(path), f"adapter file {path!r}")
    values: dict[str, OrtValue[CPU]] = {}
    for param in contents.parameters:
        try:
            dtype = dtype_from_onnx(param.element_type)
        except DtypeError:
            raise DtypeError(
                f"adapter file {path!r}: parameter {param.name!r} has ONNX element type {param.element_type} "
                "(float8), which ortgpu cannot hold; convert the adapter's parameters to float16 or float32"
            ) from None
        array = np.frombuffer(param.raw_data, dtype=dtype).reshape(param.dims).copy()
        values[param.name] = OrtValue.ortvalue_from_numpy(array)
    return contents.format_version, contents.adapter_version, contents.model_version, values


def _checked_version(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{what} must be an int, got {type(value).__name__}")
    if not -(2**31) <= int(value) < 2**31:
        raise AdapterFileError(f"{what} {int(value)} does not fit the adapter format's int32 field")
    return int(value)


def _check_parameter_value(name: object, value: object) -> None:
    """Raise unless ``value`` can be written as adapter parameter ``name`` (and read back by onnxruntime)."""
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"adapter parameter names must be non-empty strings, got {name!r}")
    if not isinstance(value, OrtValue):
        hint = " (wrap it: OrtValue.ortvalue_from_numpy(array))" if isinstance(value, np.ndarray) else ""
        raise ArgumentTypeError(f"adapter parameter {name!r} must be an OrtValue, got {type(value).__name__}{hint}")
    if not value.is_tensor():
        raise ArgumentTypeError(f"adapter parameter {name!r} must be a tensor, not a sequence of tensors")
    if value.released:
        raise AdapterFileError(f"adapter parameter {name!r}: its value was released; give a live OrtValue")
    if value.dtype == object or onnx_element_type(value.dtype) not in LORA_ELEMENT_SIZES:
        raise DtypeError(
            f"adapter parameter {name!r} has dtype {value.dtype}, which is not a LoRA parameter type (onnxruntime "
            "reads numeric tensors only: no bool or strings); cast it, e.g. to float32"
        )
    if not value.shape():
        raise AdapterFileError(
            f"adapter parameter {name!r} is a scalar; onnxruntime requires rank 1 or more: reshape it to (1,)"
        )


class AdapterFormat:
    """Writes and reads onnxruntime's adapter files: versions plus named tensors (onnxruntime's ``AdapterFormat``).

    >>> fmt = AdapterFormat()
    >>> fmt.set_adapter_version(1); fmt.set_model_version(1)
    >>> fmt.set_parameters({"lora_param_a": OrtValue.ortvalue_from_numpy(a)})
    >>> fmt.export_adapter("model.onnx_adapter")
    >>> AdapterFormat.read_adapter("model.onnx_adapter").get_parameters()
    """

    def __init__(self) -> None:
        self._format_version = FORMAT_VERSION
        self._adapter_version = 0
        self._model_version = 0
        self._parameters: dict[str, OrtValue[Any]] = {}

    @staticmethod
    def read_adapter(file_path: str | os.PathLike[str]) -> AdapterFormat:
        """The adapter file at ``file_path``, its parameters as host values (copies of the file's data).

        Raises
        ------
        AdapterFileError
            The file is missing, unreadable, not an adapter file, truncated or corrupt (checked before any read).
        DtypeError
            A parameter's element type has no numpy dtype in ortgpu (float8).
        """
        path = _checked_path(file_path, "AdapterFormat.read_adapter")
        format_version, adapter_version, model_version, values = _read_parameters(path)
        result = AdapterFormat()
        result._format_version = format_version
        result._adapter_version = adapter_version
        result._model_version = model_version
        result._parameters = dict(values)
        return result

    def export_adapter(self, file_path: str | os.PathLike[str]) -> None:
        """Write the versions and parameters to ``file_path`` in onnxruntime's adapter format (device values are
        read back to the host first).  Nothing is written when a parameter cannot be.

        Raises
        ------
        AdapterFileError
            The file cannot be written, or a parameter was released since :meth:`set_parameters`.
        """
        path = _checked_path(file_path, "AdapterFormat.export_adapter")
        params: list[AdapterParameter] = []
        for name, value in self._parameters.items():
            _check_parameter_value(name, value)
            array = np.ascontiguousarray(value.to_numpy())
            params.append(AdapterParameter(name, value.element_type(), tuple(array.shape), array.tobytes()))
        data = encode_adapter(self._adapter_version, self._model_version, params)
        try:
            with open(path, "wb") as file:
                file.write(data)
        except OSError as error:
            raise AdapterFileError(f"cannot write adapter file {path!r}: {error.strerror or error}") from error

    def get_format_version(self) -> int:
        """The file format's version (1, the only one onnxruntime writes and reads)."""
        return self._format_version

    def set_adapter_version(self, adapter_version: int) -> None:
        """The adapter's own version number, stored in the file (int32)."""
        self._adapter_version = _checked_version(adapter_version, "adapter_version")

    def get_adapter_version(self) -> int:
        """The adapter's version number (0 unless set or read)."""
        return self._adapter_version

    def set_model_version(self, model_version: int) -> None:
        """The version of the model the adapter was made for, stored in the file (int32)."""
        self._model_version = _checked_version(model_version, "model_version")

    def get_model_version(self) -> int:
        """The model version number (0 unless set or read)."""
        return self._model_version

    def set_parameters(self, params: Mapping[str, OrtValue[CPU] | OrtValue[WebGPU]]) -> None:
        """The parameters to export: name -> tensor (host or device values, kept by reference and read when
        exporting).  Each is checked now, so a bad one changes nothing.

        Raises
        ------
        ArgumentTypeError
            ``params`` is not a mapping of non-empty names to tensor ``OrtValue`` objects.
        DtypeError
            A value's dtype is not a LoRA parameter type (bool, strings).
        AdapterFileError
            A value is a scalar (onnxruntime reads rank 1 or more) or was released.
        """
        if not isinstance(params, Mapping):
            raise ArgumentTypeError(f"set_parameters takes a dict of name -> OrtValue, got {type(params).__name__}")
        for name, value in params.items():
            _check_parameter_value(name, value)
        self._parameters = dict(params)

    def get_parameters(self) -> dict[str, OrtValue[Any]]:
        """The parameters, name -> ``OrtValue`` (a new dict; the values are shared)."""
        return dict(self._parameters)

    def __repr__(self) -> str:
        return (
            f"<AdapterFormat version {self._adapter_version} for model version {self._model_version}, "
            f"{len(self._parameters)} parameters>"
        )


class LoraAdapter:
    """A LoRA adapter read from an adapter file, for ``RunOptions.add_active_adapter`` (onnxruntime's
    ``LoraAdapter``): create it empty, then :meth:`Load` a file."""

    def __init__(self) -> None:
        self._parameters: dict[str, OrtValue[CPU]] | None = None
        self._path = ""

    def Load(self, file_path: str | os.PathLike[str]) -> None:  # noqa: N802 - onnxruntime's name
        """Read the adapter file at ``file_path`` (replacing what an earlier ``Load`` read; on an error the adapter
        keeps what it had).

        Raises
        ------
        AdapterFileError
            The file is missing, unreadable, not an adapter file, truncated or corrupt.
        DtypeError
            A parameter's element type has no numpy dtype in ortgpu (float8).
        """
        path = _checked_path(file_path, "LoraAdapter.Load")
        _, _, _, values = _read_parameters(path)
        self._parameters, self._path = values, path

    @property
    def loaded(self) -> bool:
        """Whether :meth:`Load` succeeded (an adapter is usable only then)."""
        return self._parameters is not None

    def get_parameters(self) -> dict[str, OrtValue[CPU]]:
        """The parameters a run with this adapter feeds, name -> host value (a new dict; the values are shared, do
        not modify them).  Empty before :meth:`Load`."""
        return dict(self._parameters or {})

    def __repr__(self) -> str:
        if self._parameters is None:
            return "<LoraAdapter (not loaded)>"
        return f"<LoraAdapter {self._path!r}: {sorted(self._parameters)}>"
