"""Host cost per recorded dispatch: ortgpu's replay path against wgpu-py's Python classes, in one run.

Both encode the same sequence (``n`` dispatches of a one-workgroup kernel that
touches one word, so GPU time is negligible) into one compute pass and submit
it once.  Only the host call is timed (encode + submit); the device is
drained, untimed, between iterations.  The marginal cost per dispatch is
``(t(n) - t(1)) / (n - 1)`` from medians, which removes the fixed submit cost.

On the fake backend the kernel runs as its numpy twin: ortgpu's side is
measured (the path is exercised) but not compared with wgpu-py.

:func:`measure_wait_latency` times submit + ``wait_idle`` with the wgpu backend's
waits spinning (``spin_wait_us``, the default on GPU adapters) and blocking in
the driver (``spin_wait_us = 0``), interleaved: the wake-up latency a blocking
wait adds to every synchronous run.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry

__all__ = ["measure_overhead", "measure_wait_latency"]

KERNEL = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@compute @workgroup_size(1)
fn main() {
    data[0] = data[0] + 1u;
}
"""


def _kernel_twin(views: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    """KERNEL for the fake backend (which runs numpy twins, never WGSL)."""
    data = views[0].view(np.uint32)
    data[0] += np.uint32(1)


def _median_host_seconds(submit: Callable[[], None], drain: Callable[[], None], iterations: int) -> float:
    submit()
    drain()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        submit()
        times.append(time.perf_counter() - start)
        drain()
    return statistics.median(times)


def _ortgpu_phases(device: BackendDevice, commands: CommandList, iterations: int) -> dict[str, float] | None:
    """Median seconds of the replay loop's phases (encode, wgpuCommandEncoderFinish, wgpuQueueSubmit)."""
    table = getattr(device, "native_table", None)
    if table is None:
        return None
    samples: dict[str, list[float]] = {"encode": [], "finish": [], "submit": []}
    for _ in range(iterations):
        phases = commands.profile_native(table)
        device.wait_idle()
        for name in samples:
            samples[name].append(float(phases[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


@contextlib.contextmanager
def _dispatch_lists(device: BackendDevice, label: str) -> Iterator[Callable[[int], CommandList]]:
    """Yields ``record(n)``: a frozen list of ``n`` dispatches of KERNEL (as a captured graph holds it) over one
    16-byte buffer; the buffer, pipeline and bind group are released on exit."""
    buffer = device.create_buffer(16)
    pipeline = group = None
    try:
        pipeline = device.create_compute_pipeline(KERNEL, twin=_kernel_twin, label=label)
        group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 16)])

        def record(count: int, pipeline: int = pipeline, group: int = group) -> CommandList:
            commands = CommandList()
            for _ in range(count):
                commands.add_dispatch(pipeline, group, 1, 1, 1)
            return commands.freeze()

        yield record
    finally:
        if group is not None:
            device.release_bind_group(group)
        if pipeline is not None:
            device.release_pipeline(pipeline)
        device.destroy_buffer(buffer)


def _submit_encoded_seconds(device: BackendDevice, commands: CommandList, iterations: int) -> float | None:
    """Median seconds of submitting a command buffer of ``commands`` encoded beforehand (untimed): what a replay
    whose command buffer was encoded ahead still pays per dispatch (None without a native table)."""
    table = getattr(device, "native_table", None)
    if table is None:
        return None
    encoded: list[int] = []

    def encode() -> None:
        device.wait_idle()
        encoded.append(commands.encode_native(table))

    encode()
    try:
        return _median_host_seconds(lambda: table.submit_encoded(encoded.pop()), encode, iterations)
    finally:
        for command_buffer in encoded:
            table.release_encoded(command_buffer)


def _ortgpu_timings(
    device: BackendDevice, counts: tuple[int, int], iterations: int
) -> tuple[float, float, dict[str, float] | None, tuple[float, float] | None]:
    with _dispatch_lists(device, "overhead") as record:
        results = []
        encoded: list[float | None] = []
        phases = None
        for count in counts:
            commands = record(count)
            results.append(
                _median_host_seconds(functools.partial(device.submit, commands), device.wait_idle, iterations)
            )
            encoded.append(_submit_encoded_seconds(device, commands, iterations))
            if count == counts[1]:
                phases = _ortgpu_phases(device, commands, iterations)
        first, last = encoded
        return results[0], results[1], phases, (first, last) if first is not None and last is not None else None


def _wgpu_py_timings(counts: tuple[int, int], iterations: int) -> tuple[float, float] | None:
    try:
        import wgpu
    except ImportError:
        return None
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    buffer = device.create_buffer(
        size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    )
    module = device.create_shader_module(code=KERNEL)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buffer}}]
    )

    def drain() -> None:
        device.queue.read_buffer(buffer, 0, 4)  # waits for the queue

    results = []
    for count in counts:

        def submit(count: int = count) -> None:
            encoder = device.create_command_encoder()
            compute_pass = encoder.begin_compute_pass()
            for _ in range(count):
                compute_pass.set_pipeline(pipeline)
                compute_pass.set_bind_group(0, group)
                compute_pass.dispatch_workgroups(1, 1, 1)
            compute_pass.end()
            device.queue.submit([encoder.finish()])

        results.append(_median_host_seconds(submit, drain, iterations))
    return results[0], results[1]


def measure_overhead(device: BackendDevice, dispatches: int = 1000, iterations: int = 30) -> dict[str, Any]:
    """Marginal host microseconds per dispatch for both paths, and their ratio.

    Without a comparison (wgpu-py not importable, or ``device`` not a wgpu-native device, e.g. the fake
    backend's, whose numpy replay is no peer of wgpu-py on a real adapter) ``no_comparison`` says why.
    """
    if dispatches < 2 or iterations < 1:
        raise ValueError(
            f"measure_overhead needs dispatches >= 2 (the marginal cost is (t(n) - t(1)) / (n - 1)) and "
            f"iterations >= 1, not {dispatches} and {iterations}"
        )
    counts = (1, dispatches)
    ours = _ortgpu_timings(device, counts, iterations)
    result: dict[str, Any] = {
        "dispatches": dispatches,
        "iterations": iterations,
        "ortgpu_replay_us_per_dispatch": (ours[1] - ours[0]) / (dispatches - 1) * 1e6,
        "ortgpu_replay_submit_us": {"n=1": ours[0] * 1e6, f"n={dispatches}": ours[1] * 1e6},
    }
    if ours[2] is not None:
        # Where the time goes for n dispatches: our C loop (encode) vs wgpu-native's Finish and Submit.
        result["ortgpu_phases_us_per_dispatch"] = {name: value / dispatches * 1e6 for name, value in ours[2].items()}
    if ours[3] is not None:
        # A replay whose command buffer was encoded ahead (wgpu backend, encode_ahead) only submits it: its
        # critical path.  The encoding (the figure above) still happens, after the previous replay's submit.
        result["ortgpu_encoded_ahead_submit_us_per_dispatch"] = (ours[3][1] - ours[3][0]) / (dispatches - 1) * 1e6
    if getattr(device, "native_table", None) is None:
        result["no_comparison"] = "device not wgpu-native"
        return result
    theirs = _wgpu_py_timings(counts, iterations)
    if theirs is None:
        result["no_comparison"] = "wgpu-py not importable"
    else:
        result["wgpu_py_us_per_dispatch"] = (theirs[1] - theirs[0]) / (dispatches - 1) * 1e6
        result["wgpu_py_submit_us"] = {"n=1": theirs[0] * 1e6, f"n={dispatches}": theirs[1] * 1e6}
        result["ratio"] = result["wgpu_py_us_per_dispatch"] / max(result["ortgpu_replay_us_per_dispatch"], 1e-9)
    return result


def measure_wait_latency(
    device: BackendDevice, dispatch_counts: Sequence[int] = (0, 16), iterations: int = 200
) -> dict[str, Any] | None:
    """Median microseconds of submit + ``wait_idle`` per dispatch count, spinning vs blocking (interleaved).

    None when ``device`` has no ``spin_wait_us`` setting (not a wgpu-native device) or spins for 0 us already
    (a CPU adapter, where the comparison would be with itself).
    """
    spin = getattr(device, "spin_wait_us", None)
    if not spin:
        return None
    samples: dict[str, dict[int, list[float]]] = {
        "spinning": {n: [] for n in dispatch_counts},
        "blocking": {n: [] for n in dispatch_counts},
    }
    try:
        with _dispatch_lists(device, "wait-latency") as record:
            lists = {count: record(count) for count in dispatch_counts}
            for index in range(iterations + 10):
                for mode, setting in (("spinning", spin), ("blocking", 0.0)):
                    setattr(device, "spin_wait_us", setting)  # noqa: B010 - a wgpu-only knob, not in the protocol
                    for count, commands in lists.items():
                        start = time.perf_counter()
                        device.submit(commands)
                        device.wait_idle()
                        if index >= 10:  # warm-up
                            samples[mode][count].append(time.perf_counter() - start)
    finally:
        setattr(device, "spin_wait_us", spin)  # noqa: B010 - a wgpu-only knob, not in the protocol
    return {
        "spin_wait_us": spin,
        "iterations": iterations,
        **{
            f"{mode}_us": {f"{n} dispatches": statistics.median(values) * 1e6 for n, values in per.items()}
            for mode, per in samples.items()
        },
    }
