"""Session 7 probe: which backend primitive loses throughput when K threads share one wgpu device?

Each of K threads has its own buffers and a frozen list of 16 dispatches (a scale kernel over 64K floats) and
repeats one primitive: write (4 KB write_buffer), read (4 KB read_buffer_into), run (submit + wait_idle),
e2e (write + submit_and_read of 4 KB).  Aggregate ops/s and p50/p99 per K.  Variants: the default backend,
spin_wait_us=0 (block at once), encode_ahead off, and sys.setswitchinterval(1e-4).
Usage: python probe_threads.py OUT.json
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import numpy as np

from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend

KERNEL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&y)) { y[i] = x[i] * 2.0 + 1.0; }
}
"""
COUNT = 65536
OPS = ("write", "read", "run", "e2e")


def measure(device: Any, pipeline: int, op: str, k: int, n: int) -> dict[str, Any]:
    times: list[list[float]] = [[] for _ in range(k)]
    barrier = threading.Barrier(k)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        x = device.create_buffer(4 * COUNT)
        y = device.create_buffer(4 * COUNT)
        group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)])
        commands = CommandList()
        for _ in range(16):
            commands.add_dispatch(pipeline, group, COUNT // 256)
        commands.freeze()
        data = np.full(1024, index, np.float32)
        out = np.empty(1024, np.float32)
        step: Any = {
            "write": lambda: device.write_buffer(x, 0, data),
            "read": lambda: device.read_buffer_into(y, 0, out),
            "run": lambda: (device.submit(commands), device.wait_idle()),
            "e2e": lambda: (device.write_buffer(x, 0, data), device.submit_and_read(commands, [(y, 0, out)])),
        }[op]
        try:
            for _ in range(20):
                step()
            barrier.wait(30)
            clock = time.perf_counter
            mine = times[index]
            for _ in range(n):
                t0 = clock()
                step()
                mine.append(clock() - t0)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
        finally:
            del commands
            device.release_bind_group(group)
            device.destroy_buffer(x)
            device.destroy_buffer(y)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    flat = np.array([t for ts in times for t in ts])
    busy = max(sum(ts) for ts in times)
    return {
        "op": op,
        "k": k,
        "ops_per_s": k * n / busy,
        "p50_us": float(np.median(flat) * 1e6),
        "p99_us": float(np.percentile(flat, 99) * 1e6),
        "wall_s": wall,
    }


def main() -> None:
    results: list[dict[str, Any]] = []
    variants: dict[str, dict[str, Any]] = {
        "default": {},
        "spin0": {"spin_wait_us": 0.0},
        "no_ahead": {"encode_ahead": False},
        "switch100us": {},
    }
    for name, kwargs in variants.items():
        sys.setswitchinterval(1e-4 if name == "switch100us" else 0.005)
        backend = WgpuBackend(**kwargs)
        device = backend.open_device(backend.default_adapter_index())
        pipeline = device.create_compute_pipeline(KERNEL)
        for op in OPS:
            for k in (1, 2, 4, 8):
                r = measure(device, pipeline, op, k, 400)
                r["variant"] = name
                results.append(r)
                print(
                    f"{name:12s} {op:6s} K={k}  {r['ops_per_s']:9.0f}/s  p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:8.1f} us",
                    flush=True,
                )
        device.release_pipeline(pipeline)
        device.destroy()
        backend.close()
    with open(sys.argv[1], "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
