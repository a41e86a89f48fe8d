"""Session 12 diagnostic: how far K threads can scale a captured mlp16 step when the step's native work runs with no
Python in it, against the library's own end_to_end step, side by side in one process.

Usage (after building ``native_step.pyx`` in this folder): python native_floor.py K[,K...] N [rounds [W,S,R,WS,...]]
Arms per K, each thread with its own session, captured graph, input, output and staging buffer:
  ortgpu   the bench's end_to_end step (update_inplace + graph.replay() + to_numpy())
  three    the same native work as three calls, one GIL release each (write; encode + submit; copy + map + wait)
  one      the whole step as one call releasing the GIL once (the copy rides in the graph's submission)
  lib W/S/R  (when asked) ``three`` with its write, submit or read done by the library's update_inplace, replay()
           or to_numpy() (or several: WS, SR...): which of the library's parts loses the scaling
Every arm's outputs are checked against the single-thread reference before timing.  Prints steps/s and p50/p99."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

import numpy as np

import ortgpu
from bench.harness import OrtgpuArms
from bench.models import mlp, random_feeds
from ortgpu_core.backends import wgpu_native

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import native_step  # type: ignore[import-not-found]  # noqa: E402  (built on the device machine)


def _time_steps(steps: list[Callable[[], object]], n: int) -> tuple[float, list[list[float]]]:
    k = len(steps)
    barrier = threading.Barrier(k + 1)
    ends = [0.0] * k
    step_times: list[list[float]] = [[] for _ in range(k)]

    def work(i: int) -> None:
        for _ in range(50):
            steps[i]()
        barrier.wait()
        clock = time.perf_counter
        for _ in range(n):
            t0 = clock()
            steps[i]()
            step_times[i].append(clock() - t0)
        ends[i] = clock()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return max(ends) - start, step_times


def _frozen_commands(arm: OrtgpuArms) -> Any:
    """The captured graph's frozen command list, caught as its replay submits it."""
    caught: list[Any] = []
    original = wgpu_native.WgpuDevice.submit

    def spy(self: Any, commands: Any, *rest: Any) -> None:
        caught.append(commands)
        original(self, commands, *rest)

    wgpu_native.WgpuDevice.submit = spy  # type: ignore[method-assign,assignment]
    try:
        assert arm.graph is not None
        arm.graph.replay()
    finally:
        wgpu_native.WgpuDevice.submit = original  # type: ignore[method-assign]
    assert len(caught) == 1 and caught[0].frozen
    return caught[0]


def _handle(value: Any) -> int:
    buffer = value._device_buffer
    assert buffer is not None, "a device value"
    return int(buffer.handle)


def stepper_arguments(
    arm: OrtgpuArms,
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], np.dtype[Any], Any, tuple[Any, ...]]:
    """What a native stepper is built from for ``arm`` (one input, one output): the input's bytes, an output
    array, the output's shape and dtype, a staging buffer kept by the caller (never given back), and the stepper's
    constructor arguments (session 13's ``native_group.Stepper`` takes the same)."""
    device: Any = arm.device._native_device()
    (name,) = arm.inputs
    (out_name,) = arm.outputs
    src = np.ascontiguousarray(arm.feeds[name]).view(np.uint8).reshape(-1)
    out = arm.outputs[out_name]
    ffi, lib = device._ffi, device._lib
    with device._lock:
        staging = device._take_staging(out.nbytes)
    fns = {
        n: int(ffi.cast("uintptr_t", ffi.addressof(lib, n)))
        for n in (
            "wgpuQueueWriteBuffer",
            "wgpuBufferMapAsync",
            "wgpuBufferGetConstMappedRange",
            "wgpuBufferUnmap",
            "wgpuDevicePoll",
        )
    }
    args = (
        device._native_table,
        _frozen_commands(arm),
        device._queue_address,
        int(ffi.cast("uintptr_t", device._device)),
        _handle(arm.inputs[name]),
        _handle(out),
        staging.address,
        out.nbytes,
        fns,
        int(lib.WGPUCallbackMode_AllowProcessEvents),
        int(lib.WGPUMapMode_Read),
        int(lib.WGPUMapAsyncStatus_Success),
    )
    return src, np.empty(out.nbytes, np.uint8), tuple(out.shape()), out.dtype, staging, args


class NativeArm:
    def __init__(self, arm: OrtgpuArms) -> None:
        self.src, self.dst, self.shape, self.dtype, self.staging, args = stepper_arguments(arm)
        self.stepper = native_step.Stepper(*args)

    def one(self) -> np.ndarray:
        self.stepper.step(self.src, self.dst)
        return self.dst.view(self.dtype).reshape(self.shape)

    def mixed(self, arm: OrtgpuArms, which: str) -> Callable[[], object]:
        """The three-call native step with some of its parts done by the library instead (``which`` names them):
        ``W`` the upload (update_inplace), ``S`` the submit (graph.replay()), ``R`` the read (to_numpy())."""
        stepper = self.stepper

        def step() -> object:
            if "W" in which:
                arm._upload()
            else:
                stepper.write(self.src)
            if "S" in which:
                assert arm.graph is not None
                arm.graph.replay()
            else:
                stepper.submit()
            if "R" in which:
                return arm._read()
            stepper.read(self.dst)
            return self.dst

        return step

    def three(self) -> np.ndarray:
        self.stepper.write(self.src)
        self.stepper.submit()
        self.stepper.read(self.dst)
        return self.dst.view(self.dtype).reshape(self.shape)


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
    natives = [NativeArm(arm) for arm in arms]
    for arm, native in zip(arms, natives):
        for result in (arm.captured_end_to_end()[0], native.one(), native.three()):
            error = float(np.abs(result - reference).max())
            assert error <= 1e-6 * float(np.abs(reference).max()), f"outputs differ: {error}"
    print("outputs equal the reference in every arm", flush=True)
    mixed = sys.argv[4].split(",") if len(sys.argv) > 4 else []
    for r in range(rounds):
        for k in counts:
            arms_k: list[tuple[str, list[Callable[[], object]]]] = [
                ("ortgpu", [a.captured_end_to_end for a in arms[:k]]),
                ("three", [m.three for m in natives[:k]]),
                ("one", [m.one for m in natives[:k]]),
            ]
            arms_k += [(f"lib {w}", [m.mixed(a, w) for a, m in zip(arms[:k], natives[:k])]) for w in mixed]
            for label, steps in arms_k:
                window, times = _time_steps(list(steps), n)
                every = [s for t in times for s in t]
                p50, p99 = np.percentile(every, 50) * 1e3, np.percentile(every, 99) * 1e3
                print(
                    f"round {r} K={k} {label:7s} {k * n / window:7.0f} steps/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms",
                    flush=True,
                )
    for arm, native in zip(arms, natives):
        assert float(np.abs(native.one() - reference).max()) <= 1e-6 * float(np.abs(reference).max())
    print("polls:", [m.stepper.polls for m in natives])


if __name__ == "__main__":
    main()
