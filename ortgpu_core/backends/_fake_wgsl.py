"""What a kernel's WGSL declares, as far as the fake backend reads it, and the checks made against it.

The fake never compiles WGSL (a pipeline runs its numpy twin), but reads it for its group-0 bindings (address
space and access mode), its compute entry points and their literal workgroup sizes, so that a pipeline or bind
group WebGPU would reject is rejected here too; WGSL the fake cannot parse (or ``""``) skips these checks.
Functions over text and plain values: no state, no lock.
"""

from __future__ import annotations

import re
from typing import Sequence

from .._errors import ValidationError
from ._fake_handles import _BoundRange, _DeclaredBinding
from .protocol import DeviceLimits

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_BINDING = re.compile(
    r"@(group|binding)\s*\(\s*(\d+)\s*\)\s*@(group|binding)\s*\(\s*(\d+)\s*\)\s*"
    r"var\s*<\s*(uniform|storage)\s*(?:,\s*(read_write|read)\s*)?>"
)
_ENTRY_POINT = re.compile(r"@compute\b(.*?)\bfn\s+([A-Za-z_]\w*)", re.DOTALL)
_WORKGROUP_SIZE = re.compile(r"@workgroup_size\s*\(([^)]*)\)")


def _declared_bindings(wgsl: str) -> dict[int, _DeclaredBinding]:
    bindings: dict[int, _DeclaredBinding] = {}
    for match in _BINDING.finditer(wgsl):
        numbers = {match.group(1): int(match.group(2)), match.group(3): int(match.group(4))}
        if numbers.get("group") != 0 or "binding" not in numbers:
            continue
        uniform = match.group(5) == "uniform"
        bindings[numbers["binding"]] = _DeclaredBinding(uniform, not uniform and match.group(6) == "read_write")
    return bindings


def _check_entry_point(wgsl: str, entry_point: str, limits: DeviceLimits, label: str) -> None:
    entry_points = {m.group(2): m.group(1) for m in _ENTRY_POINT.finditer(wgsl)}
    if not entry_points:
        return  # nothing the fake can read: trust the twin
    if entry_point not in entry_points:
        raise ValidationError(
            f"pipeline {label!r}: the WGSL has no compute entry point {entry_point!r} "
            f"(it declares {sorted(entry_points)})"
        )
    size = _WORKGROUP_SIZE.search(entry_points[entry_point])
    if size is None:
        return
    parts = [p.strip() for p in size.group(1).split(",") if p.strip()]
    if not all(p.rstrip("iu").isdigit() for p in parts):
        return  # overridable or constant-expression sizes: not checked
    dims = [int(p.rstrip("iu")) for p in parts] + [1] * (3 - len(parts))
    maxima = (
        limits.max_compute_workgroup_size_x,
        limits.max_compute_workgroup_size_y,
        limits.max_compute_workgroup_size_z,
    )
    if (
        any(d > m for d, m in zip(dims, maxima))
        or dims[0] * dims[1] * dims[2] > limits.max_compute_invocations_per_workgroup
    ):
        raise ValidationError(
            f"pipeline {label!r}: @workgroup_size{tuple(dims)} exceeds the device limits "
            f"(per dimension {maxima}, {limits.max_compute_invocations_per_workgroup} invocations)"
        )


def _writable_aliasing(ranges: Sequence[_BoundRange], declared: dict[int, _DeclaredBinding]) -> str | None:
    # A read_write storage binding is an exclusive usage of its buffer within a
    # dispatch.  wgpu-native tracks usages per *buffer*, so it rejects two
    # bindings of one buffer even on disjoint ranges (the WebGPU spec only
    # forbids overlapping ones); the fake follows wgpu-native, which is what
    # ortgpu runs on.  Only checked when the WGSL says which bindings are writable.
    for i, first in enumerate(ranges):
        for second in ranges[i + 1 :]:
            writable = any(b in declared and declared[b].writable for b in (first.binding, second.binding))
            if first.buffer == second.buffer and writable:
                return (
                    f"bindings {first.binding} and {second.binding} both use buffer {first.buffer} and one is "
                    "read_write storage, an exclusive usage within a dispatch (wgpu-native rejects it even for "
                    "disjoint ranges); use a separate buffer"
                )
    return None
