"""``python -m bench.transfers --phases``: where the time of a large upload or download goes, call by call.

A staged upload is, per chunk, one C call (``UnlockedCalls.staged_write``: the threaded host copy into the mapped
staging buffer, its unmap, the copy's submission and the request to map it again) after taking a mapped staging
buffer from the pool (``_take_upload_staging``, which first collects the buffers whose map requests completed); then
the application waits for the device.  A chunked download is, per chunk, ``copy_and_map`` (encode and submit the copy
into a staging buffer, request its map), then for each chunk in turn the wait for its map (``_wait_map``) and the
threaded copy out of the mapping with its unmap (``_copy_out_locked``).  This module wraps those calls on one device
(the instance's attributes, nothing global), times each, and reports their sums per transfer next to the transfer's
own time: what is left over is Python and locking between the calls.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

import ortgpu

__all__ = ["PHASES", "measure_phases", "format_phases"]

#: The calls timed: (where, name), where "device" is the backend device and "unlocked" its ``_unlocked`` calls.
PHASES = (
    ("device", "_take_upload_staging"),
    ("unlocked", "staged_write"),
    ("unlocked", "queue_write"),
    ("device", "wait_idle"),
    ("unlocked", "copy_and_map"),
    ("device", "_wait_map"),
    ("device", "_copy_out_locked"),
)


class _TimedCalls:
    """A stand-in for the device's ``_unlocked`` calls that times the named ones and passes everything through."""

    def __init__(self, inner: Any, names: set[str], record: Callable[[str, float], None]) -> None:
        self._inner = inner
        self._names = names
        self._record = record

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in self._names:
            return attribute
        return _timed(attribute, name, self._record)


def _timed(function: Callable[..., Any], name: str, record: Callable[[str, float], None]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(name, time.perf_counter() - start)

    return call


def measure_phases(env: ortgpu.Env, megabytes: float, iterations: int, warmup: int) -> dict[str, Any]:
    """Upload then download one float32 value of ``megabytes`` MB ``warmup + iterations`` times with the calls of
    :data:`PHASES` timed; per direction the median transfer time and, per call, the mean seconds and calls per
    transfer (over the timed iterations).  The bytes read back are checked."""
    count = max(1, int(megabytes * (1 << 20)) // 4)
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    out = np.empty(count, np.float32)
    value = env.shared_allocator().from_numpy(hosts[1])
    device: Any = env.default_device._native_device()  # its private layers are what is timed
    sums: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    timing = [False]

    def record(name: str, seconds: float) -> None:
        if timing[0]:
            sums[name] += seconds
            calls[name] += 1

    unlocked_names = {name for where, name in PHASES if where == "unlocked"}
    saved_unlocked = getattr(device, "_unlocked", None)  # the fake device has no native calls to time
    wrapped = [name for where, name in PHASES if where == "device" and hasattr(device, name)]
    try:
        if saved_unlocked is not None:
            device._unlocked = _TimedCalls(saved_unlocked, unlocked_names, record)
        for name in wrapped:
            setattr(device, name, _timed(getattr(device, name), name, record))
        up: list[float] = []
        down: list[float] = []
        for index in range(warmup + iterations):
            timing[0] = index >= warmup
            start = time.perf_counter()
            value.update_inplace(hosts[index % 2])
            device.wait_idle()
            middle = time.perf_counter()
            value.to_numpy(out=out)
            end = time.perf_counter()
            if timing[0]:
                up.append(middle - start)
                down.append(end - middle)
        timing[0] = False
        if not np.array_equal(out, hosts[(warmup + iterations - 1) % 2]):
            raise SystemExit(f"{megabytes} MB: the bytes read back differ from those written; no phases reported")
    finally:
        for name in wrapped:
            if name in vars(device):
                delattr(device, name)  # the class's methods again
        if saved_unlocked is not None:
            device._unlocked = saved_unlocked
        value.release()
    phases = {
        name: {"ms_per_transfer": sums[name] / iterations * 1e3, "calls_per_transfer": calls[name] / iterations}
        for _, name in PHASES
        if calls[name]
    }
    return {
        "megabytes": megabytes,
        "upload_p50_ms": float(np.median(up)) * 1e3,
        "download_p50_ms": float(np.median(down)) * 1e3,
        "phases": phases,
    }


def format_phases(rows: list[dict[str, Any]]) -> str:
    """A table per size: each timed call's mean ms and calls per transfer."""
    lines = []
    for row in rows:
        lines.append(
            f"{row['megabytes']:g} MB: upload p50 {row['upload_p50_ms']:.3f} ms (with wait_idle), "
            f"download p50 {row['download_p50_ms']:.3f} ms"
        )
        lines.append("| call | ms per transfer | calls per transfer |")
        lines.append("|---|---:|---:|")
        for name, phase in row["phases"].items():
            lines.append(f"| {name} | {phase['ms_per_transfer']:.3f} | {phase['calls_per_transfer']:.2f} |")
    return "\n".join(lines)
