"""Session 11 diagnostic: which profiled replays make profiling's mean exceed its p50.  Two captured mlp16 arms,
one profiled (``session.start_profiling()``), stepped interleaved (update_inplace + replay + to_numpy) as
``bench --profile-overhead`` does; prints per replay index modulo 10 and 16 the mean on/off, and the slowest steps.

Usage: python bench/results/2026-12-02-s11/profile_tail.py [N]"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import ortgpu
from ortgpu import _profiling
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    proto, shapes = build_model("mlp16", 1)
    model_bytes = proto.SerializeToString()
    feeds = model_feeds("mlp16", proto, shapes)
    env = ortgpu.Env()
    off, on = OrtgpuArms(model_bytes, feeds, env), OrtgpuArms(model_bytes, feeds, env)
    folder = tempfile.mkdtemp()
    on.session.profile_file_prefix = f"{folder}/profile"
    on.session.start_profiling()
    off.capture()
    on.capture()
    for _ in range(50):
        off.captured_end_to_end()
        on.captured_end_to_end()
    # Host time of the calls a ring read makes (inclusive, microseconds per call), and what each profiled step did
    # besides its replay (``events``: a ring read started or finished; a per-step sample is told by its index).
    events: list[str] = []
    step_events = {"_start_read_locked": "start", "_finish_locked": "finish"}
    spent: dict[str, list[float]] = {}
    device_type = type(on.device._native_device())
    for owner, name in (
        (_profiling.GpuStepTimer, "_start_read_locked"),
        (_profiling.GpuStepTimer, "_finish_locked"),
        (_profiling.GpuStepTimer, "_collect_locked"),
        (_profiling.GpuStepTimer, "_fill"),
        (_profiling.GpuStepTimer, "_resolves"),
        (device_type, "read_async"),
        (device_type, "read_async_finish"),
        (device_type, "validate_commands"),
        (device_type, "_encode_and_submit"),
        (device_type, "_request_map"),
        (device_type, "_take_staging"),
    ):
        inner = getattr(owner, name)

        def timed(*args: object, _inner: object = inner, _name: str = name) -> object:
            if _name in step_events:
                events.append(step_events[_name])
            t = time.perf_counter()
            try:
                return _inner(*args)  # type: ignore[operator]
            finally:
                spent.setdefault(_name, []).append(time.perf_counter() - t)

        setattr(owner, name, timed)
    kinds: list[str] = []
    t_off, t_on = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        off.captured_end_to_end()
        t1 = time.perf_counter()
        on.captured_end_to_end()
        t2 = time.perf_counter()
        t_off.append(t1 - t0)
        t_on.append(t2 - t1)
        # (index % 10 == 0: the per-step sample of the default detail_every, as "mean by index mod 10" shows)
        kinds.append(("detail " if len(kinds) % 10 == 0 else "") + ("+".join(sorted(events)) or "none"))
        events.clear()
    base = statistics.median(t_off)
    print(
        f"p50 off {base * 1e6:.1f} us, on {statistics.median(t_on) * 1e6:.1f}; "
        f"mean off {statistics.mean(t_off) * 1e6:.1f}, on {statistics.mean(t_on) * 1e6:.1f}"
    )
    for m in (10, 16):
        row = []
        for r in range(m):
            sel_on = t_on[r::m]
            sel_off = t_off[r::m]
            row.append(f"{r}:{statistics.mean(sel_on) / statistics.mean(sel_off):.2f}")
        print(f"mean on/off by index mod {m}: " + " ".join(row))
    groups: dict[str, list[float]] = {}
    for kind, t in zip(kinds, t_on):
        groups.setdefault(kind, []).append(t)
    mean_off = statistics.mean(t_off)
    total_excess = sum(t_on) - n * mean_off
    for kind, times in sorted(groups.items()):
        excess = sum(times) - len(times) * mean_off
        print(
            f"  {kind:>14}: {len(times):5d} steps, mean {statistics.mean(times) * 1e6:6.1f} us, p50 "
            f"{statistics.median(times) * 1e6:6.1f}, share of the on arm's excess {excess / total_excess:.0%}"
        )
    for name, times in spent.items():
        print(
            f"  host {name}: {len(times)} calls, mean {statistics.mean(times) * 1e6:.1f} us, p50 {statistics.median(times) * 1e6:.1f}"
        )
    excess_total = sum(t - base for t in t_on)
    over = sorted(((t - base, i) for i, t in enumerate(t_on)), reverse=True)
    big = [(e, i) for e, i in over if e > 0.5 * base]
    print(
        f"steps on over 1.5x p50 off: {len(big)} of {n}, carrying {sum(e for e, _ in big) / excess_total:.0%} of the on arm's excess over p50 off"
    )
    print("slowest on (us, index mod 10, mod 16):", [(round((e + base) * 1e6), i % 10, i % 16) for e, i in over[:12]])
    big_off = [t for t in t_off if t > 1.5 * base]
    print(f"steps off over 1.5x p50 off: {len(big_off)}")
    on.session.end_profiling()
    off.close()
    on.close()


if __name__ == "__main__":
    main()
