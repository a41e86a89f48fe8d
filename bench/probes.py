"""Reference measurements that kernel timings are read against, taken in the same run on the same device.

- **Memory bandwidth**: a streaming copy (``dst[i] = src[i]``, vec4, bytes read + written) and a streaming read
  (every invocation sums a grid-strided range of vec4s, four loads in flight, and writes one value) over buffers larger than the
  H200's 50 MB L2.  The larger of the two is "the measured bandwidth" that GEMV percentages refer to.
- **Dispatch floor**: the GPU time of one tiny dispatch in a chain of dependent ones (each reads and writes the
  word the previous wrote, so the driver puts a barrier between them): the fixed cost every kernel of a model
  pays, however small its work.

Each probe is a :class:`Probe`: recorded once, then timed by the caller (see
``bench.sweep_kernels``), interleaved with the kernels it is compared with so that a device whose speed drifts
during the run shifts both alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ortgpu.ops import DeviceCaps
from ortgpu.ops._tiling import grid_for_groups, workgroup_index
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry, KernelTwin

__all__ = [
    "Owned",
    "Probe",
    "bandwidth_probes",
    "dispatch_floor_probe",
    "interleaved",
    "median_submit",
    "open_backend_device",
]

_THREADS = 256
#: vec4s each invocation of the read probe sums (grid-strided), so the launch is a few waves, not millions.
_READ_PER_THREAD = 16

_FLOOR_KERNEL = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@compute @workgroup_size(1)
fn main() {
    data[0] = data[0] + 1u;
}
"""


@dataclass
class Owned:
    """Native objects a benchmark made on ``device``, released together (bind groups first; idempotent)."""

    device: BackendDevice
    pipelines: list[int] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    buffers: list[int] = field(default_factory=list)

    def release(self) -> None:
        for group in self.groups:
            self.device.release_bind_group(group)
        for pipeline in self.pipelines:
            self.device.release_pipeline(pipeline)
        for buffer in self.buffers:
            self.device.destroy_buffer(buffer)
        self.groups, self.pipelines, self.buffers = [], [], []


@dataclass
class Probe:
    """A recorded command list, how many units of work it holds (``repeats``) and the bytes one unit moves."""

    name: str
    commands: CommandList
    repeats: int
    bytes_per_repeat: int
    owned: Owned
    #: the buffers its kernel binds, in binding order (to check what a probe computed)
    bound: tuple[int, ...] = ()
    #: FLOPs one unit of work performs (arithmetic probes, :mod:`bench.arithmetic`)
    flops_per_repeat: int = 0

    def release(self) -> None:
        self.owned.release()


def _copy_kernel(vectors: int, grid: tuple[int, int, int]) -> str:
    return f"""
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let i = ({workgroup_index(grid)}) * {_THREADS}u + lid;
    if (i < {vectors}u) {{
        dst[i] = src[i];
    }}
}}
"""


def _read_kernel(vectors: int, invocations: int, grid: tuple[int, int, int]) -> str:
    return f"""
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let first = ({workgroup_index(grid)}) * {_THREADS}u + lid;
    if (first >= {invocations}u) {{ return; }}
    var t0 = vec4<f32>(0.0);
    var t1 = vec4<f32>(0.0);
    var t2 = vec4<f32>(0.0);
    var t3 = vec4<f32>(0.0);
    var i = first;
    for (; i + {3 * invocations}u < {vectors}u; i = i + {4 * invocations}u) {{
        t0 = t0 + src[i];
        t1 = t1 + src[i + {invocations}u];
        t2 = t2 + src[i + {2 * invocations}u];
        t3 = t3 + src[i + {3 * invocations}u];
    }}
    for (; i < {vectors}u; i = i + {invocations}u) {{
        t0 = t0 + src[i];
    }}
    let total = (t0 + t1) + (t2 + t3);
    dst[first] = total;
}}
"""


def _copy_twin(views: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    views[1][:] = views[0]


def _read_twin(vectors: int, invocations: int) -> KernelTwin:
    def twin(views: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        src = views[0].view(np.float32).reshape(-1, 4)[:vectors]
        totals = np.zeros((invocations, 4), np.float32)
        np.add.at(totals, np.arange(vectors) % invocations, src)
        views[1][: invocations * 16] = totals.view(np.uint8).reshape(-1)

    return twin


def _floor_twin(views: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    word = views[0][:4].view(np.uint32)
    word[0] = np.uint32((int(word[0]) + 1) & 0xFFFFFFFF)


def bandwidth_probes(device: BackendDevice, caps: DeviceCaps, megabytes: int, repeats: int) -> list[Probe]:
    """The copy and read probes over a ``megabytes`` source buffer (clamped to the device's binding limit)."""
    limit = min(device.limits.max_storage_buffer_binding_size, device.limits.max_buffer_size)
    nbytes = min(megabytes * 1_000_000, limit) // (16 * _THREADS) * (16 * _THREADS)
    vectors = nbytes // 16
    invocations = max(_THREADS, vectors // _READ_PER_THREAD // _THREADS * _THREADS)
    src = device.create_buffer(nbytes, label="probe-src")
    dst = device.create_buffer(nbytes, label="probe-dst")
    probes = []
    for name, wgsl, groups, moved in (
        ("copy", None, vectors // _THREADS, 2 * nbytes),
        ("read", None, invocations // _THREADS, nbytes + invocations * 16),
    ):
        grid = grid_for_groups(groups, caps)
        twin: KernelTwin
        if name == "copy":
            wgsl, twin = _copy_kernel(vectors, grid), _copy_twin
        else:
            wgsl, twin = _read_kernel(vectors, invocations, grid), _read_twin(vectors, invocations)
        pipeline = device.create_compute_pipeline(wgsl, twin=twin, label=f"probe-{name}")
        group = device.create_bind_group(pipeline, [BindingEntry(0, src, 0, nbytes), BindingEntry(1, dst, 0, nbytes)])
        commands = CommandList()
        for _ in range(repeats):
            commands.add_dispatch(pipeline, group, *grid)
        probes.append(
            Probe(
                f"bandwidth {name} {nbytes / 1e6:.0f} MB",
                commands,
                repeats,
                moved,
                Owned(device, [pipeline], [group]),
                bound=(src, dst),
            )
        )
    probes[-1].owned.buffers += [src, dst]  # released with the last probe
    return probes


def dispatch_floor_probe(device: BackendDevice, repeats: int) -> Probe:
    """``repeats`` dependent one-invocation dispatches in one pass."""
    buffer = device.create_buffer(16, label="probe-floor")
    pipeline = device.create_compute_pipeline(_FLOOR_KERNEL, twin=_floor_twin, label="probe-floor")
    group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 16)])
    commands = CommandList()
    for _ in range(repeats):
        commands.add_dispatch(pipeline, group, 1, 1, 1)
    return Probe("dispatch floor", commands, repeats, 0, Owned(device, [pipeline], [group], [buffer]), bound=(buffer,))


def open_backend_device(backend: str) -> BackendDevice:
    """A device of ``backend`` (``"wgpu"``: the default adapter; ``"fake"``: the fake backend's first device)."""
    if backend == "fake":
        from ortgpu_core.backends.fake import FakeBackend

        return FakeBackend().open_device(0)
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    wgpu = WgpuBackend()
    return wgpu.open_device(wgpu.default_adapter_index())


def median_submit(device: BackendDevice, commands: CommandList, repeats: int) -> float:
    """Median seconds of ``repeats`` submits of ``commands``, each waited for."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        device.submit(commands)
        device.wait_idle()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(
    device: BackendDevice,
    timed: list[tuple[str, CommandList, int]],
    baseline: float,
    rounds: int,
    rng: np.random.Generator,
) -> dict[str, list[float]]:
    """Seconds per unit of each ``(name, commands, units)``: ``rounds`` rounds, each submitting every list once (in
    a fresh random order) and waiting; a device whose speed drifts during the run shifts every entry alike."""
    samples: dict[str, list[float]] = {name: [] for name, _, _ in timed}
    for _ in range(rounds):
        for index in rng.permutation(len(timed)):
            name, commands, units = timed[int(index)]
            start = time.perf_counter()
            device.submit(commands)
            device.wait_idle()
            samples[name].append(max(time.perf_counter() - start - baseline, 0.0) / units)
    return samples
