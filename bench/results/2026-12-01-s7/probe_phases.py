"""Session 7 probe 2: where a 4 KB read's time goes when K threads read at once (one wgpu device).

Phases of WgpuDevice.read_buffer_into: 1 = under the lock: copy submitted + map requested (_copy_and_map);
2 = the unlocked wait (_wait_until); 3 = the rest (under the lock: copy out, unmap).  Variants: the default
(one poller, spin in C), 'selfpoll' (every waiter polls on its own, wgpuDevicePoll(0) in a Python loop, no
poll lock), and 'sleep' (non-pollers... every waiter polls once then sleeps 20 us).  Also: K threads each
submitting an empty command list in a loop (submit only, no wait) while one extra thread spins polls.
Usage: python probe_phases.py OUT.json
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import numpy as np

from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.wgpu_native import WgpuBackend


def run(device: Any, k: int, n: int, patch: str) -> dict[str, Any]:
    lib, ffi = device._lib, device._ffi
    phases = [[0.0, 0.0, 0.0] for _ in range(k)]
    totals: list[list[float]] = [[] for _ in range(k)]
    barrier = threading.Barrier(k)
    original_copy, original_wait = device._copy_and_map, device._wait_until
    local = threading.local()

    def timed_copy(*a: Any) -> Any:
        t = time.perf_counter()
        try:
            return original_copy(*a)
        finally:
            phases[local.index][0] += time.perf_counter() - t

    def self_poll(done: Any, action: str) -> None:
        while not done():
            lib.wgpuDevicePoll(device._device, 0, ffi.NULL)

    def sleepy(done: Any, action: str) -> None:
        while not done():
            lib.wgpuDevicePoll(device._device, 0, ffi.NULL)
            if not done():
                time.sleep(20e-6)

    waiter = {"default": original_wait, "selfpoll": self_poll, "sleep": sleepy}[patch]

    def timed_wait(done: Any, action: str) -> Any:
        t = time.perf_counter()
        try:
            return waiter(done, action)
        finally:
            phases[local.index][1] += time.perf_counter() - t

    device._copy_and_map, device._wait_until = timed_copy, timed_wait

    def worker(index: int) -> None:
        local.index = index
        y = device.create_buffer(4096)
        out = np.empty(1024, np.float32)
        for _ in range(20):
            device.read_buffer_into(y, 0, out)
        phases[index] = [0.0, 0.0, 0.0]
        barrier.wait(30)
        for _ in range(n):
            t0 = time.perf_counter()
            device.read_buffer_into(y, 0, out)
            totals[index].append(time.perf_counter() - t0)
        device.destroy_buffer(y)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    device._copy_and_map, device._wait_until = original_copy, original_wait
    flat = np.array([x for ts in totals for x in ts])
    busy = max(sum(ts) for ts in totals)
    total = sum(sum(ts) for ts in totals)
    p1 = sum(p[0] for p in phases) / (k * n) * 1e6
    p2 = sum(p[1] for p in phases) / (k * n) * 1e6
    return {
        "variant": patch,
        "k": k,
        "reads_per_s": k * n / busy,
        "p50_us": float(np.median(flat) * 1e6),
        "phase1_us": p1,
        "wait_us": p2,
        "phase3_us": total / (k * n) * 1e6 - p1 - p2,
    }


def submit_only(device: Any, k: int, n: int, spinner: bool) -> dict[str, Any]:
    lib, ffi = device._lib, device._ffi
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            lib.wgpuDevicePoll(device._device, 0, ffi.NULL)

    times: list[list[float]] = [[] for _ in range(k)]

    def worker(index: int) -> None:
        y = device.create_buffer(4096)
        commands = CommandList()
        commands.add_clear(y, 0, 4096)
        for _ in range(n):
            t0 = time.perf_counter()
            device.submit(commands)
            times[index].append(time.perf_counter() - t0)
        device.wait_idle()
        device.destroy_buffer(y)

    poller = threading.Thread(target=spin) if spinner else None
    if poller:
        poller.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if poller:
        poller.join()
    flat = np.array([x for ts in times for x in ts])
    return {
        "submit_only": True,
        "spinner": spinner,
        "k": k,
        "p50_us": float(np.median(flat) * 1e6),
        "p99_us": float(np.percentile(flat, 99) * 1e6),
    }


def main() -> None:
    backend = WgpuBackend()
    device = backend.open_device(backend.default_adapter_index())
    results: list[dict[str, Any]] = []
    for patch in ("default", "selfpoll", "sleep"):
        for k in (1, 2, 4):
            r = run(device, k, 500, patch)
            results.append(r)
            print(
                f"{patch:9s} K={k} {r['reads_per_s']:8.0f} reads/s p50 {r['p50_us']:7.1f} us | copy+map {r['phase1_us']:6.1f} "
                f"wait {r['wait_us']:7.1f} rest {r['phase3_us']:6.1f} us",
                flush=True,
            )
    for spinner in (False, True):
        for k in (1, 4):
            r = submit_only(device, k, 2000, spinner)
            results.append(r)
            print(f"submit only K={k} spinner={spinner}: p50 {r['p50_us']:.1f} us p99 {r['p99_us']:.1f} us", flush=True)
    device.destroy()
    backend.close()
    with open(sys.argv[1], "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
