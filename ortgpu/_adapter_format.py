"""onnxruntime's LoRA adapter file format (``.onnx_adapter``), read and written without a FlatBuffers dependency.

The file is a FlatBuffers buffer with file identifier ``TORT`` whose root table is onnxruntime's ``Adapter``
(schema ``onnxruntime/lora/adapter_format/adapter_schema.fbs``)::

    table Parameter { name:string; dims:[int64]; data_type:TensorDataType (int32); raw_data:[uint8] (force_align: 8); }
    table Adapter   { format_version:int; adapter_version:int; model_version:int; parameters:[Parameter]; }

Only this fixed schema is needed, so the encoder and the decoder below are small and specific: the encoder lays the
buffer out front to back (every forward reference an unsigned offset, as the format requires) and writes every field,
defaults included; the decoder checks every offset, size and alignment it follows before reading, as FlatBuffers'
verifier does, so a truncated or corrupt file is a typed error and never a read past the end.  Files written here are
read by onnxruntime's ``AdapterFormat.read_adapter`` and ``LoraAdapter.Load`` and the other way round (tested).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ortgpu_core import InvalidArgumentError

__all__ = [
    "FILE_IDENTIFIER",
    "FORMAT_VERSION",
    "AdapterFileError",
    "AdapterParameter",
    "AdapterContents",
    "encode_adapter",
    "decode_adapter",
    "LORA_ELEMENT_SIZES",
]

FILE_IDENTIFIER = b"TORT"
#: The format version onnxruntime writes and the only one it reads (``kAdapterFormatVersion``).
FORMAT_VERSION = 1

#: Element types a LoRA parameter may have, with their item sizes: onnxruntime's reader refuses the others (bool,
#: strings, complex), so neither writes nor reads them.  float8 types (17-20) are readable by onnxruntime but have no
#: numpy dtype in ortgpu (see ``ortgpu_core._dtypes``): the session layer refuses them with a ``DtypeError``.
LORA_ELEMENT_SIZES: dict[int, int] = {
    1: 4,  # float
    2: 1,  # uint8
    3: 1,  # int8
    4: 2,  # uint16
    5: 2,  # int16
    6: 4,  # int32
    7: 8,  # int64
    10: 2,  # float16
    11: 8,  # double
    12: 4,  # uint32
    13: 8,  # uint64
    16: 2,  # bfloat16
    17: 1,  # float8e4m3fn
    18: 1,  # float8e4m3fnuz
    19: 1,  # float8e5m2
    20: 1,  # float8e5m2fnuz
}


class AdapterFileError(InvalidArgumentError, RuntimeError):
    """An adapter file is missing, unreadable, or not a valid onnxruntime adapter (``.onnx_adapter``) file, or
    adapter contents cannot be written as one.  Also a ``RuntimeError``: onnxruntime raises that for the same
    faults, so code written for it keeps catching them."""


@dataclass(frozen=True)
class AdapterParameter:
    """One parameter as stored: its name, ONNX element type, dims and little-endian raw bytes."""

    name: str
    element_type: int
    dims: tuple[int, ...]
    raw_data: bytes


@dataclass(frozen=True)
class AdapterContents:
    """A decoded adapter file: its three version numbers and its parameters in file order."""

    format_version: int
    adapter_version: int
    model_version: int
    parameters: tuple[AdapterParameter, ...]


_INT32 = (-(2**31), 2**31 - 1)


def _check_parameter(param: AdapterParameter, source: str) -> None:
    """The rules onnxruntime's reader applies to a parameter (plus a consistent byte count), checked on both sides so
    that nothing is written that onnxruntime could not read, and nothing read that it would refuse."""
    if not param.name:
        raise AdapterFileError(f"{source}: a parameter has no name; every adapter parameter must name a model input")
    if param.element_type not in LORA_ELEMENT_SIZES:
        raise AdapterFileError(
            f"{source}: parameter {param.name!r} has ONNX element type {param.element_type}, which is not a LoRA "
            f"parameter type (supported: {sorted(LORA_ELEMENT_SIZES)}; bool and strings are not)"
        )
    if not param.dims:
        raise AdapterFileError(
            f"{source}: parameter {param.name!r} has no dims (a scalar); onnxruntime requires adapter parameters of "
            "rank 1 or more: reshape it to (1,)"
        )
    count = 1
    for dim in param.dims:
        if dim < 0:
            raise AdapterFileError(f"{source}: parameter {param.name!r} has a negative dimension in {list(param.dims)}")
        count *= dim
    expected = count * LORA_ELEMENT_SIZES[param.element_type]
    if expected != len(param.raw_data):
        raise AdapterFileError(
            f"{source}: parameter {param.name!r} of dims {list(param.dims)} and element type {param.element_type} "
            f"needs {expected} bytes of data but holds {len(param.raw_data)}; the file is corrupt"
        )


# -- encoding -------------------------------------------------------------------------------------------------------


class _Writer:
    """Appends to a bytearray with alignment; offsets are patched once their targets are placed."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def align(self, alignment: int, extra: int = 0) -> None:
        """Pad so that ``len(buf) + extra`` is a multiple of ``alignment``."""
        self.buf.extend(b"\0" * (-(len(self.buf) + extra) % alignment))

    def put(self, fmt: str, *values: int) -> int:
        at = len(self.buf)
        self.buf.extend(struct.pack("<" + fmt, *values))
        return at

    def patch_offset(self, field_at: int) -> None:
        """Point the uoffset at ``field_at`` to the current end (where its target is written next)."""
        struct.pack_into("<I", self.buf, field_at, len(self.buf) - field_at)

    def table(self, fields: list[tuple[str, int]]) -> tuple[int, list[int]]:
        """A vtable, then a table of ``fields`` (struct format, value): each field 4 or 8 bytes wide, laid out in
        order after the table's soffset.  Returns the table's position and each field's position."""
        sizes = [struct.calcsize("<" + fmt) for fmt, _ in fields]
        offsets, at = [], 4
        for size in sizes:
            at += -at % size  # natural alignment within the table (the table itself starts 8-aligned)
            offsets.append(at)
            at += size
        table_size = at
        self.align(2)
        vtable_at = self.put("HH" + "H" * len(fields), 4 + 2 * len(fields), table_size, *offsets)
        self.align(8)
        table_at = len(self.buf)
        self.buf.extend(b"\0" * table_size)
        struct.pack_into("<i", self.buf, table_at, table_at - vtable_at)  # soffset: the vtable lies before
        positions = [table_at + offset for offset in offsets]
        for (fmt, value), position in zip(fields, positions):
            struct.pack_into("<" + fmt, self.buf, position, value)
        return table_at, positions

    def vector(self, element_fmt: str, values: list[int] | bytes, data_alignment: int) -> None:
        """A length-prefixed vector whose first element is ``data_alignment``-aligned."""
        count = len(values)
        self.align(max(4, data_alignment), extra=4)
        self.put("I", count)
        if isinstance(values, bytes):
            self.buf.extend(values)
        elif count:
            self.put(f"{count}{element_fmt}", *values)

    def string(self, text: str) -> None:
        data = text.encode("utf-8")
        self.align(4)
        self.put("I", len(data))
        self.buf.extend(data + b"\0")


def encode_adapter(adapter_version: int, model_version: int, parameters: list[AdapterParameter]) -> bytes:
    """The bytes of an adapter file holding ``parameters`` (format version :data:`FORMAT_VERSION`).

    Raises
    ------
    AdapterFileError
        A parameter onnxruntime could not read back (no name, an unsupported element type, no dims, a byte count
        that does not match its dims), two parameters of one name, or a version outside int32.
    """
    for label, version in (("adapter_version", adapter_version), ("model_version", model_version)):
        if not _INT32[0] <= version <= _INT32[1]:
            raise AdapterFileError(f"{label} {version} does not fit the format's int32 field")
    seen: set[str] = set()
    for param in parameters:
        _check_parameter(param, "adapter parameters")
        if param.name in seen:
            raise AdapterFileError(f"adapter parameters: {param.name!r} is given twice")
        seen.add(param.name)
    w = _Writer()
    w.put("I", 0)  # root offset, patched below
    w.buf.extend(FILE_IDENTIFIER)
    root_at, (_, _, _, params_field) = w.table(
        [("i", FORMAT_VERSION), ("i", adapter_version), ("i", model_version), ("I", 0)]
    )
    struct.pack_into("<I", w.buf, 0, root_at)
    w.align(4)
    w.patch_offset(params_field)
    w.put("I", len(parameters))
    slots = [w.put("I", 0) for _ in parameters]
    for slot, param in zip(slots, parameters):
        table_at, (name_field, dims_field, _, data_field) = w.table(
            [("I", 0), ("I", 0), ("i", param.element_type), ("I", 0)]
        )
        struct.pack_into("<I", w.buf, slot, table_at - slot)
        w.align(4)
        w.patch_offset(name_field)
        w.string(param.name)
        w.align(8, extra=4)
        w.patch_offset(dims_field)
        w.vector("q", list(param.dims), 8)
        w.align(8, extra=4)
        w.patch_offset(data_field)
        w.vector("B", param.raw_data, 8)
    w.align(8)
    return bytes(w.buf)


# -- decoding -------------------------------------------------------------------------------------------------------


class _Reader:
    """Bounds- and alignment-checked reads of one buffer; every failure is an :class:`AdapterFileError`."""

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.source = source

    def fail(self, what: str) -> AdapterFileError:
        return AdapterFileError(
            f"{self.source} is not a valid onnxruntime adapter file ({what}); it may be truncated or corrupt: "
            "write it again, e.g. with AdapterFormat.export_adapter"
        )

    def read(self, fmt: str, at: int, alignment: int) -> int:
        size = struct.calcsize("<" + fmt)
        if at < 0 or at + size > len(self.data) or at % alignment:
            raise self.fail(f"a {size}-byte field at byte {at} lies outside the file or is misaligned")
        value: int = struct.unpack_from("<" + fmt, self.data, at)[0]
        return value

    def table(self, at: int) -> tuple[int, int, int]:
        """The table at ``at``: (its position, its vtable's position, the vtable's size)."""
        vtable_at = at - self.read("i", at, 4)
        vtable_size = self.read("H", vtable_at, 2)
        if vtable_size < 4 or vtable_size % 2 or vtable_at + vtable_size > len(self.data):
            raise self.fail(f"a table's field list at byte {vtable_at} is malformed")
        # The vtable's record of the table's size is not trusted (nor checked, as FlatBuffers' verifier does not):
        # each field read is bounds-checked on its own.
        return at, vtable_at, vtable_size

    def field(self, table: tuple[int, int, int], index: int) -> int | None:
        """The position of field ``index`` of ``table``, or None when the field is absent (its default)."""
        at, vtable_at, vtable_size = table
        entry = 4 + 2 * index
        if entry + 2 > vtable_size:
            return None
        offset = self.read("H", vtable_at + entry, 2)
        return None if offset == 0 else at + offset

    def scalar(self, table: tuple[int, int, int], index: int, default: int = 0) -> int:
        position = self.field(table, index)
        return default if position is None else self.read("i", position, 4)

    def target(self, table: tuple[int, int, int], index: int) -> int | None:
        """Where the uoffset field ``index`` points, or None when absent."""
        position = self.field(table, index)
        return None if position is None else position + self.read("I", position, 4)

    def vector(self, at: int, element_size: int) -> tuple[int, int]:
        """A vector at ``at``: (its first element's position, its length)."""
        count = self.read("I", at, 4)
        start = at + 4
        if start + count * element_size > len(self.data):
            raise self.fail(f"a vector of {count} elements at byte {at} runs past the end")
        return start, count

    def string(self, at: int) -> str:
        start, length = self.vector(at, 1)
        if start + length >= len(self.data) or self.data[start + length] != 0:
            raise self.fail(f"the string at byte {at} is not terminated")
        try:
            return self.data[start : start + length].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"the string at byte {at} is not UTF-8") from None


def decode_adapter(data: bytes, source: str) -> AdapterContents:
    """The contents of an adapter file's bytes (``source`` names it in errors).

    Raises
    ------
    AdapterFileError
        Not an adapter file (too short, another file identifier), a structure that fails the checks FlatBuffers'
        verifier makes, a format version other than :data:`FORMAT_VERSION`, or a parameter onnxruntime's reader
        refuses (see :func:`encode_adapter`), or two parameters of one name.
    """
    reader = _Reader(data, source)
    if len(data) <= 8 or data[4:8] != FILE_IDENTIFIER:
        raise AdapterFileError(
            f"{source} is not an onnxruntime adapter file: it does not start with the format's header (file "
            f"identifier {FILE_IDENTIFIER.decode()!r}); load a .onnx_adapter file written by AdapterFormat.export_adapter"
        )
    root = reader.table(reader.read("I", 0, 4))
    format_version = reader.scalar(root, 0)
    if format_version != FORMAT_VERSION:
        raise AdapterFileError(
            f"{source} has adapter format version {format_version}; only version {FORMAT_VERSION} is supported"
        )
    parameters: list[AdapterParameter] = []
    vector_at = reader.target(root, 3)
    if vector_at is not None:
        start, count = reader.vector(vector_at, 4)
        for i in range(count):
            slot = start + 4 * i
            table = reader.table(slot + reader.read("I", slot, 4))
            name_at = reader.target(table, 0)
            name = "" if name_at is None else reader.string(name_at)
            dims: tuple[int, ...] = ()
            dims_at = reader.target(table, 1)
            if dims_at is not None:
                first, rank = reader.vector(dims_at, 8)
                dims = struct.unpack_from(f"<{rank}q", data, first)
            raw = b""
            raw_at = reader.target(table, 3)
            if raw_at is not None:
                first, size = reader.vector(raw_at, 1)
                raw = data[first : first + size]
            param = AdapterParameter(name, reader.scalar(table, 2), dims, raw)
            _check_parameter(param, source)
            if any(p.name == name for p in parameters):
                raise AdapterFileError(f"{source}: parameter {name!r} appears twice; the file is corrupt")
            parameters.append(param)
    return AdapterContents(format_version, reader.scalar(root, 1), reader.scalar(root, 2), tuple(parameters))
