"""Session 11 diagnostic: K *processes* (no shared GIL), each with its own Env, device and captured mlp16 on the one
GPU, stepping end_to_end (update_inplace + replay + to_numpy) like where_time.py's threads.  What the GPU and driver
allow when no Python is shared: the bound for what any host-side change to the threaded path could reach.

Usage: python processes.py K[,K...] N [step]  (step: end_to_end | replay_and_read | run_only)"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import numpy as np


def _worker(step_name: str, n: int, barrier: object, out: object) -> None:
    sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench/results/2026-12-01-s9")]  # run from the root
    import ortgpu
    import where_time
    from bench.harness import OrtgpuArms

    model_bytes, feeds = where_time._model(False)
    env = ortgpu.Env()
    arm = OrtgpuArms(model_bytes, feeds, env)
    arm.capture()
    step = {
        "end_to_end": arm.captured_end_to_end,
        "replay_and_read": arm.captured_read_end_to_end,
        "run_only": arm.captured_run_only,
    }[step_name]
    for _ in range(50):
        step()
    barrier.wait()  # type: ignore[attr-defined]
    start = time.perf_counter()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    end = time.perf_counter()
    out.put((start, end, times))  # type: ignore[attr-defined]
    arm.close()


def main() -> None:
    counts = [int(k) for k in sys.argv[1].split(",")]
    n = int(sys.argv[2])
    step_name = sys.argv[3] if len(sys.argv) > 3 else "end_to_end"
    ctx = mp.get_context("spawn")
    for k in counts:
        barrier, out = ctx.Barrier(k), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(step_name, n, barrier, out)) for _ in range(k)]
        for p in procs:
            p.start()
        results = [out.get(timeout=300) for _ in range(k)]
        for p in procs:
            p.join()
        window = max(r[1] for r in results) - min(r[0] for r in results)
        every = [t for r in results for t in r[2]]
        p50, p99 = np.percentile(every, 50) * 1e3, np.percentile(every, 99) * 1e3
        print(f"K={k} processes {step_name}: {k * n / window:.0f} steps/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
