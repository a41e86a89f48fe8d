"""Session 15 diagnosis (H200): the device's lock and the upload, side by side in one process.

Settings (one Env each, 8 captured mlp16 sessions each; flipped through the wgpu device's attributes):
``base``: every holder of the device's lock keeps the submissions made outside it out, the upload is a queue write
under the lock keeping the GIL; ``nonexcl``: only exclusive sections (a buffer's destroy) keep them out;
``wout``: the upload is written outside the lock, without the GIL for the native call; ``both``.

python3 lock_arms.py [part ...]   parts: locks (default), breakdown

Caveat found on the H200 (run 1): four Envs are four Vulkan devices on one GPU, which time-slices between them (the
ceiling read 0.40 ms per replay here against 0.11 ms with one device), so the arms disturb each other; the threads
bench (one Env per process, run per setting through ORTGPU_LOCK_EXPERIMENT in gpu_diag.sh) measured the settings
instead (run 2).  The switches named here were removed once measured: this script runs only against the tree it was
written for (session 15's experiment, before the write outside the lock became the default).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from bench.profile_overhead import gpu_time_per_replay
from bench.threads import time_threads

SETTINGS = {"base": (True, False), "nonexcl": (False, False), "wout": (True, True), "both": (False, True)}


def _envs() -> dict[str, ortgpu.Env]:
    envs = {}
    for label, (exclusive, write_outside) in SETTINGS.items():
        env = ortgpu.Env()
        native: Any = env.default_device._native_device()
        native._lock.exclusive_always = exclusive
        native.write_outside_lock = write_outside
        envs[label] = env
    return envs


def locks(model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== locks: end_to_end and replay_and_read, K = 1, 4, 8, settings interleaved, 3 rounds")
    envs = _envs()
    sessions = {label: [OrtgpuArms(model_bytes, feeds, e) for _ in range(8)] for label, e in envs.items()}
    try:
        for group in sessions.values():
            for arms in group:
                arms.capture()
        measured = gpu_time_per_replay(model_bytes, feeds, envs["base"])
        gpu = measured if measured is not None else float("nan")
        print(f"ceiling: {gpu * 1e3:.4f} ms per replay, {1 / gpu:.0f} replays/s", flush=True)
        for round_ in range(3):
            for k in (1, 4, 8):
                for label, group in sessions.items():
                    for boundary in ("captured_end_to_end", "captured_read_end_to_end"):
                        window, times = time_threads([getattr(a, boundary) for a in group[:k]], 50, 1000, None)
                        every = np.asarray([t for ts in times for t in ts]) * 1e3
                        p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
                        rate = every.size / window
                        print(
                            f"round {round_} K={k} {label:8s} {boundary:26s} {rate:8.0f} steps/s ({rate * gpu:4.2f} of "
                            f"ceiling) p50 {p50:6.3f} p99 {p99:6.3f} p99/p50 {p99 / p50:5.2f}",
                            flush=True,
                        )
    finally:
        for group in sessions.values():
            for arms in group:
                arms.close()
        for env in envs.values():
            env.close()


def breakdown(model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== breakdown: end_to_end parts (upload, replay, read) p50 ms at K=4 and 8, per setting")
    envs = _envs()
    sessions = {label: [OrtgpuArms(model_bytes, feeds, e) for _ in range(8)] for label, e in envs.items()}
    try:
        for group in sessions.values():
            for arms in group:
                arms.capture()
        for k in (4, 8):
            for label, group in sessions.items():
                records: list[list[tuple[float, float, float, float]]] = [[] for _ in range(k)]
                barrier = threading.Barrier(k)

                def work(index: int) -> None:
                    arms, mine = group[index], records[index]
                    graph = arms.graph
                    assert graph is not None
                    clock = time.perf_counter
                    for step in range(1050):
                        if step == 50:
                            barrier.wait()
                        t0 = clock()
                        arms._upload()
                        t1 = clock()
                        graph.replay()
                        t2 = clock()
                        arms._read()
                        t3 = clock()
                        if step >= 50:
                            mine.append((t0, t1, t2, t3))

                threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                every = np.asarray([r for rs in records for r in rs])
                parts = np.diff(every, axis=1) * 1e3
                total = parts.sum(axis=1)
                window = every[:, 3].max() - every[:, 0].min()
                print(
                    f"K={k} {label:8s} {len(total) / window:6.0f} steps/s, p50 {np.median(total):.3f} p99 "
                    f"{np.percentile(total, 99):.3f} ms; parts p50 (upload, replay, read) "
                    f"{np.round(np.median(parts, axis=0), 3).tolist()} p99 "
                    f"{np.round(np.percentile(parts, 99, axis=0), 3).tolist()}",
                    flush=True,
                )
    finally:
        for group in sessions.values():
            for arms in group:
                arms.close()
        for env in envs.values():
            env.close()


def main() -> None:
    parts = sys.argv[1:] or ["locks"]
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    for part in parts:
        {"locks": locks, "breakdown": breakdown}[part](model_bytes, feeds)


if __name__ == "__main__":
    main()
