"""Session 8 probe: tests/test_encode_ahead_threads.py's racing scenario (one thread submits and submit_and_reads a
frozen list 6 times per round, another releases the list's bind group and buffers once the first submit of the
round succeeded), repeated, with encode-ahead on or off; prints every wrong result with its round, step, whether
a command buffer encoded ahead was submitted, and whether the round's handles repeat an earlier round's.
Usage: python race_probe.py <on|off> <repeats>"""

from __future__ import annotations

import sys
import threading

import numpy as np

from ortgpu_core._errors import ValidationError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

COUNT = 256
KERNEL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&y)) { y[i] = x[i] * 2.0 + 1.0; }
}
"""


def one(device: WgpuDevice, rounds: int, report: list[str]) -> dict[str, int]:
    pipeline = device.create_compute_pipeline(KERNEL, label="scale")
    handoff: list[tuple[int, int, int, CommandList] | None] = []
    started = threading.Event()
    ready = threading.Condition()
    outcomes = {"computed": 0, "refused": 0, "wrong": 0}
    seen: dict[int, int] = {}
    data = np.arange(COUNT, dtype=np.float32)

    def submitter() -> None:
        for index in range(rounds):
            with ready:
                ready.wait_for(lambda: bool(handoff), timeout=30)
                item = handoff.pop(0)
            if item is None:
                return
            started.clear()
            x, y, group, commands = item
            for step in range(6):
                try:
                    ahead = any(key[0] == id(commands) for key in list(device._ahead))
                    if step % 2:
                        out = np.empty(COUNT, np.float32)
                        device.submit_and_read(commands, [(y, 0, out)])
                        if not np.array_equal(out, data * 2 + 1):
                            outcomes["wrong"] += 1
                            kind = "x" if np.array_equal(out, data) else ("zeros" if not out.any() else "other")
                            report.append(
                                f"round {index} step {step}: read {kind} (first {out[:3]}), ahead entry for the list: "
                                f"{ahead}; handles x {x:#x} y {y:#x} group {group:#x} list {id(commands):#x}; "
                                f"seen before in round: x {seen.get(x)} y {seen.get(y)} group {seen.get(group)}"
                            )
                    else:
                        device.submit(commands)
                    outcomes["computed"] += 1
                    started.set()
                except ValidationError:
                    outcomes["refused"] += 1
            for handle in (x, y, group):
                seen[handle] = index

    thread = threading.Thread(target=submitter)
    thread.start()
    for index in range(rounds):
        x = device.create_buffer(4 * COUNT)
        y = device.create_buffer(4 * COUNT)
        device.write_buffer(x, 0, data.tobytes())
        group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)])
        commands = CommandList()
        commands.add_dispatch(pipeline, group, COUNT // 64)
        commands.freeze()
        with ready:
            handoff.append((x, y, group, commands))
            ready.notify_all()
        started.wait(5)
        started.clear()
        if index % 2:
            device.release_bind_group(group)
            device.destroy_buffer(x)
            device.destroy_buffer(y)
        else:
            device.destroy_buffer(y)
            device.release_bind_group(group)
            device.destroy_buffer(x)
        del commands
    with ready:
        handoff.append(None)
        ready.notify_all()
    thread.join(60)
    device.wait_idle()
    device.release_pipeline(pipeline)
    return outcomes


def main() -> None:
    mode, repeats = sys.argv[1], int(sys.argv[2])
    backend = WgpuBackend()
    device = backend.open_device(backend.default_adapter_index())
    device.encode_ahead = mode == "on"
    report: list[str] = []
    totals: dict[str, int] = {}
    for _ in range(repeats):
        for key, value in one(device, 40, report).items():
            totals[key] = totals.get(key, 0) + value
    print(f"encode_ahead {mode}: {repeats} x 40 rounds: {totals}")
    for line in report[:12]:
        print("  ", line)
    device.destroy()
    backend.close()


if __name__ == "__main__":
    main()
