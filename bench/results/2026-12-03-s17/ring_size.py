"""Session 17 (H200): profiling's cost against the ring's size.  Arms, each its own session and captured mlp16
(batch 1), timed interleaved (one replay + to_numpy each per iteration, the order rotating): unprofiled, and
profiled with RING_SLOTS = each of SLOTS, timed whole (detail only on the first replay) and with the default
detail sample.  Each arm is warmed up alone first (WARMUP steps: every slot's lists built and encoded ahead).

python3 ring_size.py   (SLOTS=16,32,64 ITER=1000 WARMUP=300)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402
from ortgpu import _profiling  # noqa: E402

SLOTS = [int(s) for s in os.environ.get("SLOTS", "16,32,64").split(",")]
ITER = int(os.environ.get("ITER", "1000"))
WARMUP = int(os.environ.get("WARMUP", "300"))


def main() -> None:
    env = ortgpu.Env()
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    settings: dict[str, tuple[int, int | None]] = {"off": (16, None)}
    for slots in SLOTS:
        settings[f"whole {slots}"] = (slots, 10**9)
        settings[f"detail10 {slots}"] = (slots, _profiling.DEFAULT_DETAIL_EVERY)
    arms = {name: OrtgpuArms(model_bytes, feeds, env) for name in settings}
    with tempfile.TemporaryDirectory() as folder:
        for name, (slots, every) in settings.items():
            arm = arms[name]
            arm.capture()
            _profiling.RING_SLOTS = slots  # read when the arm's timer is made (its first profiled replay)
            if every is not None:
                arm.session.profile_file_prefix = os.path.join(folder, name.replace(" ", "_"))
                arm.session.start_profiling(every)
            for _ in range(WARMUP):
                arm.captured_end_to_end()
        names = list(settings)
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(ITER):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                arms[name].captured_end_to_end()
                times[name].append(time.perf_counter() - start)
        base_p50 = statistics.median(times["off"])
        base_mean = statistics.fmean(times["off"])
        print(f"replay + to_numpy, {ITER} interleaved iterations per arm after {WARMUP} warm-up each")
        for name in names:
            p50, mean = statistics.median(times[name]), statistics.fmean(times[name])
            print(
                f"  {name:12s} p50 {p50 * 1e6:7.1f} us ({p50 / base_p50:.3f})  mean {mean * 1e6:7.1f} us"
                f" ({mean / base_mean:.3f})"
            )
        for name, (_, every) in settings.items():
            if every is not None:
                os.remove(arms[name].session.end_profiling())
    for arm in arms.values():
        arm.close()


if __name__ == "__main__":
    main()
