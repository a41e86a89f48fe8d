"""Session 13 diagnostic: is the threaded step's floor set by how many wgpuQueueSubmit calls the GPU gets?

Usage (after building ``native_group.pyx`` here and session 12's ``native_step.pyx``): python native_group.py K[,K...]
N [rounds] (ARMS=ortgpu,ahead,... picks the arms; all by default).  Arms per K (each thread with its own session, captured mlp16, input, output and staging buffer; the
native arms encode each step's command buffer ahead, as the library does):
  ortgpu    the bench's end_to_end step (update_inplace + graph.replay() + to_numpy()), K threads
  ahead     the step's native work, one call per step, its own wgpuQueueSubmit, K threads
  grouped   the same, the submits of the threads that wait merged into one wgpuQueueSubmit (a combiner), K threads
  three     ``ahead`` as three calls (write; submit + encode the next; map + wait + copy out), one GIL release each:
            the public calls' shape when a replay's outputs' copies ride in its submission
  libW      ``three`` with the write done by the library's update_inplace
  batch     ONE thread making K steps at a time: K writes, one submit of K command buffers, K maps, one wait
Every arm's outputs are checked against the single-thread reference before and after timing.  Prints steps/s,
p50/p99 per step (batch: per K steps), and how many submits the combiner made per step."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

import ortgpu
from bench.harness import OrtgpuArms
from bench.models import mlp, random_feeds

HERE = __file__.rsplit("/", 1)[0]
sys.path.insert(0, HERE)
sys.path.insert(0, HERE.replace("2026-12-02-s13", "2026-12-02-s12"))
import native_group  # type: ignore[import-not-found]  # noqa: E402  (built on the device machine)
from native_floor import _time_steps, stepper_arguments  # noqa: E402  (session 12's diagnostic, found by mypy)


class GroupArm:
    def __init__(self, arm: OrtgpuArms) -> None:
        self.src, self.dst, self.shape, self.dtype, self.staging, args = stepper_arguments(arm)
        self.stepper = native_group.Stepper(*args)

    def result(self) -> np.ndarray:
        return self.dst.view(self.dtype).reshape(self.shape)

    def ahead(self) -> np.ndarray:
        self.stepper.ahead(self.src, self.dst)
        return self.result()

    def three(self) -> np.ndarray:
        self.stepper.write(self.src)
        self.stepper.submit()
        self.stepper.read(self.dst)
        return self.result()

    def lib_write(self, arm: OrtgpuArms) -> Callable[[], object]:
        stepper = self.stepper

        def step() -> object:
            arm._upload()
            stepper.submit()
            stepper.read(self.dst)
            return self.dst

        return step

    def grouped(self) -> np.ndarray:
        self.stepper.grouped(self.src, self.dst)
        return self.result()


def _batch(natives: list[GroupArm]) -> Callable[[], object]:
    steppers = [m.stepper for m in natives]
    srcs = [m.src for m in natives]
    dsts = [m.dst for m in natives]
    return lambda: native_group.batch(steppers, srcs, dsts)


def _check(natives: list[GroupArm], reference: np.ndarray) -> None:
    scale = float(np.abs(reference).max())
    for m in natives:
        for result in (m.ahead(), m.grouped(), m.three()):
            assert float(np.abs(result - reference).max()) <= 1e-6 * scale, "outputs differ"
        m.dst[:] = 0
    native_group.batch([m.stepper for m in natives], [m.src for m in natives], [m.dst for m in natives])
    for m in natives:
        assert float(np.abs(m.result() - reference).max()) <= 1e-6 * scale, "batch outputs differ"


def main() -> None:
    counts = [int(k) for k in sys.argv[1].split(",")]
    n = int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    proto = mlp(layers=16, width=1024, batch=1)
    feeds = random_feeds(proto, {v.name: (1, 1024) for v in proto.graph.input})
    env = ortgpu.Env()
    arms = [OrtgpuArms(proto.SerializeToString(), feeds, env) for _ in range(max(counts))]
    for arm in arms:
        arm.capture()
    reference = arms[0].captured_end_to_end()[0]
    natives = [GroupArm(arm) for arm in arms]
    _check(natives, reference)
    print("outputs equal the reference in every arm", flush=True)
    chosen = os.environ.get("ARMS", "ortgpu,ahead,grouped,three,libW,batch").split(",")
    for r in range(rounds):
        for k in counts:
            for label, steps in (
                ("ortgpu", [a.captured_end_to_end for a in arms[:k]]),
                ("ahead", [m.ahead for m in natives[:k]]),
                ("grouped", [m.grouped for m in natives[:k]]),
                ("three", [m.three for m in natives[:k]]),
                ("libW", [m.lib_write(a) for a, m in zip(arms[:k], natives[:k])]),
            ):
                if label not in chosen:
                    continue
                before = native_group.submits()
                window, times = _time_steps(list(steps), n)
                every = [s for t in times for s in t]
                p50, p99 = np.percentile(every, 50) * 1e3, np.percentile(every, 99) * 1e3
                extra = ""
                if label == "grouped":
                    extra = f"  submits/step {(native_group.submits() - before) / ((n + 50) * k):.2f}"
                print(
                    f"round {r} K={k} {label:8s} {k * n / window:7.0f} steps/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms"
                    + extra,
                    flush=True,
                )
            if "batch" not in chosen:
                continue
            batch = _batch(natives[:k])
            for _ in range(50):
                batch()
            start = time.perf_counter()
            times1: list[float] = []
            for _ in range(n):
                t0 = time.perf_counter()
                batch()
                times1.append(time.perf_counter() - t0)
            window = time.perf_counter() - start
            print(
                f"round {r} K={k} {'batch':8s} {k * n / window:7.0f} steps/s  p50 {np.percentile(times1, 50) * 1e3:.3f}"
                f" ms  p99 {np.percentile(times1, 99) * 1e3:.3f} ms  (per K steps, one thread)",
                flush=True,
            )
    _check(natives, reference)
    print("outputs equal the reference after timing")
    for m in natives:
        m.stepper.close()


if __name__ == "__main__":
    main()
