"""WGSL for indices read at run time by the indexing kernels (GatherElements, GatherND, scatters, ReverseSequence).

An index fed or computed at run time may be invalid (out of range, or an int64 whose high word is not the sign
extension of its low word: ``2**32 + 1`` must not read as 1).  ONNX makes that an error; a kernel cannot raise, so it
sets the program's status word (``atomicOr(&status[0], 1u)``, the run then raises ``InvalidArgumentError``) and
clamps the index so that whatever it reads stays inside the tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._kernel import NotOnDevice
from ._wgsl import wgsl_int

__all__ = ["STATUS_DECLARATION", "index_lines", "require_index_dtype"]

#: The status words, for kernels that declare their own bindings (``binding`` filled in by the caller).
STATUS_DECLARATION = "@group(0) @binding({binding}) var<storage, read_write> status: array<atomic<u32>>;\n"


def require_index_dtype(op_type: str, dtype: np.dtype[Any]) -> None:
    """Kernels read int32 and int64 indices; others run on the CPU, whose reference refuses them (typed)."""
    if np.dtype(dtype).name not in ("int32", "int64"):
        raise NotOnDevice(f"{op_type}: indices of dtype {np.dtype(dtype).name} are read on the CPU only")


def index_lines(
    name: str,
    position: str,
    dtype: np.dtype[Any],
    low: int,
    high: int,
    *,
    checked: bool,
    wrap: int | None = None,
    indent: str = "  ",
) -> str:
    """WGSL lines declaring ``var <name>: i32``: element ``position`` of ``auxbuf0`` (read by ``aux0``).

    Valid values lie in ``[low, high]`` (``high >= 0``); negative ones then get ``wrap`` added (the axis size, for
    indices that count from the end; None: no wrapping), and the result is clamped into ``[0, high]`` (or
    ``[0, wrap - 1]``) so that an invalid index still addresses the tensor.  With ``checked`` (indices read at run
    time), an invalid one sets the status word; constant indices were checked when planned.
    """
    last = high if wrap is None else wrap - 1
    lines = [f"{indent}var {name} = aux0({position});\n"]
    if checked:
        invalid = f"{name} < {wgsl_int(low)} || {name} > {wgsl_int(high)}"
        if np.dtype(dtype).itemsize == 8:
            # aux0 reads the low word: the high word must be its sign extension
            invalid += f" || auxbuf0[2u * ({position}) + 1u] != select(0u, 0xffffffffu, {name} < 0)"
        lines.append(f"{indent}if ({invalid}) {{ atomicOr(&status[0], 1u); }}\n")
    if wrap is not None:
        lines.append(f"{indent}if ({name} < 0) {{ {name} = {name} + {wgsl_int(wrap)}; }}\n")
    lines.append(f"{indent}{name} = clamp({name}, 0, {wgsl_int(last)});\n")
    return "".join(lines)
