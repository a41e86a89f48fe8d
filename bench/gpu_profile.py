"""``python -m bench.profile --gpu``: where a captured replay spends its GPU time, from GPU timestamps.

``python -m bench.profile`` (without ``--gpu``) times each planned step submitted alone against an empty
submit-and-wait, so every step also carries the fixed cost of a submit with work in it (tens of microseconds on
a discrete GPU): it ranks kernels, but its sum overstates the plan and its small steps all read alike.  This mode
measures the captured graph as it replays, on the device's own clock, three ways:

* ``gpu_whole_us``: the GPU time of one replay, first to last timestamp, median over replays submitted back to
  back (:func:`bench.profile_overhead.gpu_time_per_replay`), so the GPU is never idle between them;
* ``host_replay_us``: the host's p50 of ``replay()`` + wait (the device idle between replays): what a caller who
  waits for each replay sees; its gap to ``gpu_whole_us`` is submit latency and host work;
* per step: each step's GPU time with a timestamp before every step (the session profiler with
  ``detail_every=1``, median per step over the replays).  Per-step timestamps cut the compute pass, so their sum
  (``steps_sum_us``) exceeds ``gpu_whole_us``; the difference divided by the step count is the price of a pass
  break, and the ranking and the share of each step are what to read.

Needs a device with timestamp queries (``--backend fake`` models them with its own clock).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy.typing as npt

import ortgpu

from .harness import OrtgpuArms
from .profile_overhead import gpu_time_per_replay

__all__ = ["measure_gpu_profile", "print_gpu_profile"]


def _step_events(path: str) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The trace's timing, and its step events by step name (replays' detailed steps)."""
    with open(path, encoding="utf-8") as handle:
        trace: dict[str, Any] = json.load(handle)
    steps: dict[str, list[dict[str, Any]]] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and "dispatches" in event.get("args", {}):
            steps.setdefault(str(event["name"]), []).append(event)
    return str(trace["otherData"]["timing"]), steps


def measure_gpu_profile(
    model_bytes: bytes, feeds: dict[str, npt.NDArray[Any]], env: ortgpu.Env, replays: int = 30
) -> dict[str, Any]:
    """The three measurements of the module docstring for a model's captured graph (``replays`` of each)."""
    result: dict[str, Any] = {"gpu_whole_us": None}
    whole = gpu_time_per_replay(model_bytes, feeds, env, replays=max(replays, 20), warmup=max(replays, 20))
    if whole is not None:
        result["gpu_whole_us"] = whole * 1e6
    arms = OrtgpuArms(model_bytes, feeds, env)
    try:
        graph = arms.capture()
        host = []
        for index in range(2 * replays):
            start = time.perf_counter()
            arms.captured_run_only()
            if index >= replays:  # the first half warms up
                host.append(time.perf_counter() - start)
        result["host_replay_us"] = statistics.median(host) * 1e6
        with tempfile.TemporaryDirectory() as folder:
            arms.session.profile_file_prefix = os.path.join(folder, "profile")
            arms.session.start_profiling(1)
            for _ in range(replays):
                graph.replay()
            arms.wait_idle()
            path = arms.session.end_profiling()
            timing, events = _step_events(path)
    finally:
        arms.close()
    result["timing"] = timing
    rows: list[dict[str, Any]] = []
    for name, seen in events.items():
        durations = [float(e["dur"]) for e in seen]  # microseconds (Chrome trace units)
        rows.append(
            {
                "step": name,
                "op": str(seen[0].get("cat", "")),
                "dispatches": int(seen[0]["args"]["dispatches"]),
                "us": statistics.median(durations),
                "samples": len(durations),
            }
        )
    rows.sort(key=lambda r: -r["us"])
    result["steps"] = rows
    result["step_count"] = len(rows)
    result["dispatch_count"] = sum(r["dispatches"] for r in rows)
    result["steps_sum_us"] = sum(r["us"] for r in rows)
    by_op: dict[str, float] = {}
    for row in rows:
        op = str(row["op"])
        by_op[op] = by_op.get(op, 0.0) + float(row["us"])
    result["by_op_us"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1]))
    return result


def print_gpu_profile(name: str, result: dict[str, Any], top: int) -> None:
    whole = result["gpu_whole_us"]
    whole_text = f"{whole:.1f} us" if whole is not None else "n/a (no timestamps)"
    print(
        f"{name}: {result['step_count']} steps, {result['dispatch_count']} dispatches; GPU time per replay "
        f"{whole_text} (back to back); replay + wait on the host {result['host_replay_us']:.1f} us (p50); steps "
        f"timed one by one sum to {result['steps_sum_us']:.1f} us (timing: {result['timing']})"
    )
    total = result["steps_sum_us"] or 1.0
    print(f"{'us':>9s} {'%':>5s} {'disp':>4s}  op")
    for row in result["steps"][:top]:
        print(f"{row['us']:9.1f} {100 * row['us'] / total:5.1f} {row['dispatches']:4d}  {row['op']}")
    print("by op: " + ", ".join(f"{op} {us:.0f} us" for op, us in result["by_op_us"].items()))
