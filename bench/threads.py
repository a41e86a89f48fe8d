"""``python -m bench --threads K[,K2,...]``: throughput with K threads, each driving its own session on one device.

Every thread owns an :class:`~bench.harness.OrtgpuArms`: its own session with its own fixed device I/O and, for the
captured arm, its own captured graph bound to that I/O. The sessions are made (and their graphs captured) once, for
the largest K; a run with K threads uses the first K of them. Before anything is timed, every session's outputs
(uncaptured, and replayed where captured) are compared with the single-thread reference; they are compared again
after the timed loops.

For each K, arm (capture off / on, as ``--capture`` says) and boundary (the bench's ``end_to_end`` and ``run_only``):
the K threads do their warm-up steps, meet at a barrier, then each times its steps (``perf_counter`` around one step)
for a fixed number of iterations or, with ``seconds``, until a common deadline. Reported: the aggregate throughput
(steps of all threads / the window from the barrier's release to the last thread's last step, so warm-up is outside
it), each thread's p50 and p99 of one step, and the p50 and p99 over the steps of all threads.

The captured arm has a third boundary, ``replay_and_read``: the inputs' ``update_inplace`` and
``graph.replay_and_read()``, whose output copies ride in the replay's own submission (one submit and one wait per
step, where ``end_to_end``'s replay + ``to_numpy()`` submits again for the read).

``run_only`` waits with ``wait_idle()``, which waits for the whole device: with K threads, one thread's wait also
covers the work the other threads submitted before it (the boundary is "until the device is idle").

The GPU ceiling (captured arm): the GPU time of one replay, measured with timestamp queries while the GPU is kept
busy (first to last timestamp of a profiled replay, 300 submitted back to back, median over the last 200,
:func:`bench.profile_overhead.gpu_time_per_replay`), gives the most replays per second the GPU could run,
``1 / gpu_time``; each K's captured throughput is reported as a fraction of it (issue 15:
at K=4, 1.6x K=1, or within 80% of that ceiling where the GPU is the limit). Not measured on a device without
timestamp queries.

Whether the GPU is the limit at K (``--gpu-under-load``, captured arm): after K's timed steps, the same K threads step
``end_to_end`` again with every session profiled (each replay timed whole: two timestamps), and the median GPU time of
a replay under that load (first to last timestamp) is reported with ``busy`` = the unprofiled end_to_end throughput x
that median: the fraction of the window the GPU would spend on replays (1.0: the GPU is the limit).  The profiled
pass's own throughput is lower (profiling costs the host); only its GPU times are used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

import ortgpu

from .harness import OrtgpuArms
from .profile_overhead import _end_profiling, _profiled

__all__ = [
    "ThreadResult",
    "bench_threads",
    "gpu_ceiling",
    "gpu_under_load",
    "print_gpu_under_load",
    "parse_thread_counts",
    "print_gpu_ceiling",
    "print_table",
    "run_threads",
    "scaling",
    "time_threads",
]

#: Relative error allowed between a thread's outputs and the single-thread reference (the sessions run the same
#: kernels on the same device: equal in practice).
THREAD_TOLERANCE = 1e-6
#: A thread that does not reach the barrier within this many seconds (a hang) fails the bench instead of blocking it.
BARRIER_TIMEOUT_S = 600.0


def parse_thread_counts(text: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]`` (ValueError for an empty list, a non-integer, a count below 1 or a repeat)."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--threads takes positive integers separated by commas (e.g. 1,2,4,8), not {text!r}")
        counts.append(int(part))
    if len(set(counts)) != len(counts):
        raise ValueError(f"--threads lists a count twice: {text!r}")
    return counts


@dataclass
class ThreadResult:
    """One (K, arm, boundary): every thread's step times and the measurement window."""

    threads: int
    arm: str
    boundary: str
    window_s: float
    seconds: list[list[float]] = field(default_factory=list)  # per thread

    @property
    def steps(self) -> int:
        return sum(len(times) for times in self.seconds)

    @property
    def throughput(self) -> float:
        """Steps per second over all threads in the window."""
        return self.steps / self.window_s if self.window_s > 0 else float("nan")

    def summary(self) -> dict[str, Any]:
        every = [t for times in self.seconds for t in times]
        p50, p99 = _percentile_ms(every, 50), _percentile_ms(every, 99)
        return {
            "threads": self.threads,
            "arm": self.arm,
            "boundary": self.boundary,
            "steps": self.steps,
            "window_s": self.window_s,
            "throughput_per_s": self.throughput,
            "p50_ms": p50,
            "p99_ms": p99,
            "p99_over_p50": p99 / p50 if p50 > 0 else float("nan"),  # issue 15's target: at most 3 at every K
            "per_thread": [
                {
                    "steps": len(times),
                    "p50_ms": _percentile_ms(times, 50),
                    "p99_ms": _percentile_ms(times, 99),
                    "raw_s": times,
                }
                for times in self.seconds
            ],
        }


def _percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q)) * 1e3 if seconds else float("nan")


def _relative_error(a: list[npt.NDArray[Any]], b: list[npt.NDArray[Any]]) -> float:
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        error = float(np.linalg.norm(x64 - y64)) / max(float(np.linalg.norm(y64)), 1e-30)
        worst = error if not error <= worst else worst  # NaN sticks
    return worst


def _check(label: str, outputs: list[npt.NDArray[Any]], reference: list[npt.NDArray[Any]]) -> float:
    error = _relative_error(outputs, reference)
    if not error <= THREAD_TOLERANCE:  # NaN too
        raise SystemExit(
            f"{label}: outputs differ from the single-thread reference (relative error {error:.3e} > "
            f"{THREAD_TOLERANCE}); no timings reported"
        )
    return error


def _steps(arms: OrtgpuArms, arm: str) -> dict[str, Callable[[], object]]:
    if arm == "capture on":
        return {
            "end_to_end": arms.captured_end_to_end,
            "replay_and_read": arms.captured_read_end_to_end,
            "run_only": arms.captured_run_only,
        }
    return {"end_to_end": arms.uncaptured_end_to_end, "run_only": arms.uncaptured_run_only}


def time_threads(
    steps: list[Callable[[], object]], warmup: int, iterations: int, seconds: float | None
) -> tuple[float, list[list[float]]]:
    """Run ``steps[i]`` on thread i: warm-up, a barrier, then the timed steps. Returns (window, per-thread times)."""
    count = len(steps)
    times: list[list[float]] = [[] for _ in range(count)]
    ends = [0.0] * count
    errors: list[BaseException] = []
    window: dict[str, float] = {}

    def open_window() -> None:  # run by one thread as the barrier releases them all, before any timed step
        window["opened"] = time.perf_counter()
        window["deadline"] = window["opened"] + (seconds or 0.0)

    barrier = threading.Barrier(count, action=open_window)

    def work(index: int) -> None:
        step, mine = steps[index], times[index]
        try:
            for _ in range(warmup):
                step()
        except BaseException as error:  # reported after the join; the barrier is broken so nobody waits forever
            errors.append(error)
            barrier.abort()
            return
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            return
        clock = time.perf_counter
        try:
            if seconds is None:
                for _ in range(iterations):
                    start = clock()
                    step()
                    mine.append(clock() - start)
            else:
                deadline = window["deadline"]
                while True:
                    start = clock()
                    if start >= deadline:
                        break
                    step()
                    mine.append(clock() - start)
        except BaseException as error:
            errors.append(error)
        ends[index] = clock()

    workers = [threading.Thread(target=work, args=(i,), name=f"bench-thread-{i}") for i in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    if "opened" not in window:
        raise RuntimeError("the bench threads never met at their barrier")
    opened = window["opened"]
    return max(ends) - opened, times


#: ``detail_every`` of the profiled pass of ``--gpu-under-load``: only a record's first replay is timed per step.
_WHOLE_ONLY = 1 << 30


def gpu_under_load(
    sessions: list[OrtgpuArms], warmup: int, iterations: int, seconds: float | None
) -> dict[str, Any] | None:
    """The GPU time of a replay while ``len(sessions)`` threads each step their own captured graph ``end_to_end``,
    every session profiled (replays timed whole): median and p90 over the replays timed whole, or None where the
    device has no timestamp queries."""
    spans: list[int] = []
    timings = set()
    with tempfile.TemporaryDirectory() as folder:
        for arms in sessions:
            _profiled(arms, folder, _WHOLE_ONLY)
        try:
            window, times = time_threads([arms.captured_end_to_end for arms in sessions], warmup, iterations, seconds)
        finally:
            for arms in sessions:
                timing, whole = _end_profiling(arms)
                timings.add(timing)
                spans.extend(whole)
    if timings != {"gpu-timestamps"} or not spans:
        return None
    return {
        "gpu_time_per_replay_s": statistics.median(spans) / 1e9,
        "p90_s": (statistics.quantiles(spans, n=10)[-1] if len(spans) > 1 else spans[0]) / 1e9,
        "replays_timed": len(spans),
        "profiled_steps_per_s": sum(len(t) for t in times) / window,
    }


def run_threads(
    model_bytes: bytes,
    feeds: dict[str, npt.NDArray[Any]],
    env: ortgpu.Env,
    reference: list[npt.NDArray[Any]],
    thread_counts: list[int],
    arms_wanted: list[str],
    warmup: int,
    iterations: int,
    seconds: float | None = None,
    progress: bool = True,
    under_load: bool = False,
) -> tuple[list[ThreadResult], dict[str, Any]]:
    """Time ``arms_wanted`` (``"capture off"``, ``"capture on"``) with each count of ``thread_counts``; with
    ``under_load``, also the GPU time of a replay at each count (:func:`gpu_under_load`, captured arm).

    Returns the results and a report part: the per-session output checks, where capture was refused (then the
    captured arm is skipped) the reason, and ``gpu_under_load`` by str(K).
    """
    info: dict[str, Any] = {"tolerance": THREAD_TOLERANCE}
    sessions: list[OrtgpuArms] = []
    results: list[ThreadResult] = []
    try:
        for index in range(max(thread_counts)):
            arms = OrtgpuArms(model_bytes, feeds, env)
            sessions.append(arms)
            errors = {"capture off": _check(f"thread {index} capture off", arms.uncaptured_end_to_end(), reference)}
            if "capture on" in arms_wanted and "capture_refused" not in info:
                try:
                    arms.capture()
                except ortgpu.CaptureStateError as error:
                    info["capture_refused"] = str(error)
                else:
                    errors["capture on"] = _check(f"thread {index} capture on", arms.captured_end_to_end(), reference)
            info.setdefault("rel_error_before", []).append(errors)
        wanted = [arm for arm in arms_wanted if arm != "capture on" or "capture_refused" not in info]
        for count in thread_counts:
            for arm in wanted:
                for boundary in _steps(sessions[0], arm):
                    steps = [_steps(arms, arm)[boundary] for arms in sessions[:count]]
                    if progress:
                        print(f"  {count} thread(s), ortgpu {arm} {boundary} ...", file=sys.stderr, flush=True)
                    window, times = time_threads(steps, warmup, iterations, seconds)
                    results.append(ThreadResult(count, f"ortgpu {arm}", boundary, window, times))
                if under_load and arm == "capture on":
                    if progress:
                        print(f"  {count} thread(s), GPU time per replay under load ...", file=sys.stderr, flush=True)
                    loaded = gpu_under_load(sessions[:count], warmup, iterations, seconds)
                    if loaded is not None:
                        info.setdefault("gpu_under_load", {})[str(count)] = loaded
        for index, arms in enumerate(sessions):  # still right after all the threaded steps
            after = {"capture off": _check(f"thread {index} capture off", arms.uncaptured_end_to_end(), reference)}
            if arms.graph is not None:
                after["capture on"] = _check(f"thread {index} capture on", arms.captured_end_to_end(), reference)
            info.setdefault("rel_error_after", []).append(after)
    finally:
        for arms in sessions:
            arms.close()
    return results, info


def scaling(results: list[ThreadResult]) -> dict[str, dict[str, float]]:
    """Per arm/boundary: throughput at each K divided by that at the smallest K measured (keys are str(K))."""
    table: dict[str, dict[str, float]] = {}
    base: dict[str, float] = {}
    for result in sorted(results, key=lambda r: r.threads):
        key = f"{result.arm}/{result.boundary}"
        base.setdefault(key, result.throughput)
        table.setdefault(key, {})[str(result.threads)] = result.throughput / base[key]
    return table


def print_table(results: list[ThreadResult]) -> None:
    """One row per (K, arm, boundary): aggregate steps/s, its ratio to the smallest K, p50/p99 over all steps, and
    the range of the per-thread p50 and p99."""
    ratios = scaling(results)
    print(
        f"{'threads':>7s} {'arm':20s} {'boundary':15s} {'steps/s':>10s} {'x K=min':>8s} {'p50 ms':>8s} "
        f"{'p99 ms':>8s} {'thread p50 ms':>15s} {'thread p99 ms':>15s}"
    )
    for result in results:
        s = result.summary()
        p50s = [t["p50_ms"] for t in s["per_thread"]]
        p99s = [t["p99_ms"] for t in s["per_thread"]]
        ratio = ratios[f"{result.arm}/{result.boundary}"][str(result.threads)]
        print(
            f"{result.threads:7d} {result.arm:20s} {result.boundary:15s} {result.throughput:10.1f} {ratio:8.2f} "
            f"{s['p50_ms']:8.3f} {s['p99_ms']:8.3f} {_span(p50s):>15s} {_span(p99s):>15s}"
        )


def _span(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{min(values):.3f}-{max(values):.3f}"


def gpu_ceiling(results: list[ThreadResult], gpu_seconds: float | None) -> dict[str, Any]:
    """The GPU time per replay, its ceiling ``1 / gpu_time`` (replays/s), and each captured (K, boundary)'s
    throughput as a fraction of it (JSON: ``threads.gpu_ceiling``)."""
    if not gpu_seconds:
        return {"gpu_time_per_replay_s": None, "ceiling_per_s": None, "fraction": {}}
    ceiling = 1.0 / gpu_seconds
    fraction: dict[str, dict[str, float]] = {}
    for result in results:
        if result.arm.endswith("capture on"):
            fraction.setdefault(result.boundary, {})[str(result.threads)] = result.throughput / ceiling
    return {"gpu_time_per_replay_s": gpu_seconds, "ceiling_per_s": ceiling, "fraction": fraction}


def print_gpu_ceiling(ceiling: dict[str, Any]) -> None:
    if ceiling["gpu_time_per_replay_s"] is None:
        print("GPU ceiling: not measured (no GPU timestamp queries on this device, or no captured arm)")
        return
    print(
        f"GPU time per replay (timestamps, replays back to back, median of 200): {ceiling['gpu_time_per_replay_s'] * 1e3:.4f} ms; "
        f"ceiling 1/gpu_time = {ceiling['ceiling_per_s']:.0f} replays/s"
    )
    for boundary, by_k in ceiling["fraction"].items():
        row = ", ".join(f"K={k}: {value:.2f}" for k, value in by_k.items())
        print(f"  capture on, {boundary}: throughput / ceiling: {row}")


def print_gpu_under_load(results: list[ThreadResult], loaded: dict[str, dict[str, Any]]) -> None:
    """One line per K: the GPU time of a replay under that load and ``busy`` (see the module docstring)."""
    if not loaded:
        print("GPU time per replay under load: not measured (no GPU timestamp queries on this device)")
        return
    rate = {r.threads: r.throughput for r in results if r.arm == "ortgpu capture on" and r.boundary == "end_to_end"}
    print("GPU under load (the K threads stepping end_to_end again, each session profiled, replays timed whole):")
    for k, row in loaded.items():
        gpu = row["gpu_time_per_replay_s"]
        row["busy"] = rate[int(k)] * gpu
        print(
            f"  K={k}: GPU time per replay under load {gpu * 1e3:.4f} ms (p90 {row['p90_s'] * 1e3:.4f}, "
            f"{row['replays_timed']} replays); end_to_end throughput x that = busy {row['busy']:.2f}"
        )


def bench_threads(
    args: argparse.Namespace,
    env: ortgpu.Env,
    report: dict[str, Any],
    model_bytes: bytes,
    feeds: dict[str, npt.NDArray[Any]],
    batch: int,
) -> None:
    """``python -m bench --threads``: the single-thread reference from one session, then the threaded arms; prints
    the results and puts them in ``report`` (``threads``, and ``capture_refused`` where capture was refused)."""
    arms = OrtgpuArms(model_bytes, feeds, env)
    try:
        reference = arms.uncaptured_end_to_end(keep=True)
    finally:
        arms.close()
    wanted = {"off": ["capture off"], "on": ["capture on"], "both": ["capture off", "capture on"]}[args.capture]
    results, info = run_threads(
        model_bytes,
        feeds,
        env,
        reference,
        args.thread_counts,
        wanted,
        args.warmup,
        args.iterations,
        args.seconds,
        under_load=args.gpu_under_load and "capture on" in wanted,
    )
    if "capture_refused" in info:
        report["capture_refused"] = info["capture_refused"]
        print(f"ortgpu capture on: refused ({info['capture_refused']}); its arms are not timed")
    length = f"{args.seconds} s" if args.seconds is not None else f"{args.iterations} iterations per thread"
    print(f"\nmodel {args.model}, batch {batch}, threads {args.threads}: {length} after {args.warmup} warm-up")
    print_table(results)
    ceiling: dict[str, Any] = gpu_ceiling(results, None)
    if "capture on" in wanted and "capture_refused" not in info:
        from .profile_overhead import gpu_time_per_replay

        ceiling = gpu_ceiling(results, gpu_time_per_replay(model_bytes, feeds, env))
    print_gpu_ceiling(ceiling)
    loaded: dict[str, Any] = info.pop("gpu_under_load", {})
    if args.gpu_under_load and "capture on" in wanted and "capture_refused" not in info:
        print_gpu_under_load(results, loaded)
    report["threads"] = {
        "thread_counts": args.thread_counts,
        "iterations_per_thread": None if args.seconds is not None else args.iterations,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "outputs_checked": info,
        "results": [result.summary() for result in results],
        "scaling": scaling(results),
        "gpu_ceiling": ceiling,
        "gpu_under_load": loaded,
    }
