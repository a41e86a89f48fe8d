"""Session 14 diagnosis (H200): (1) why the threads bench's GPU-ceiling reading is inflated; (2) what makes the
K=8 p99 tail (the GIL switch interval, the cyclic GC, or neither) and K=4's spread.

python3 diag.py [part ...]   parts: ceiling, tail (default both)
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np

import ortgpu
from bench.__main__ import build_model, model_feeds
from bench.harness import OrtgpuArms
from bench.profile_overhead import _end_profiling, _profiled
from bench.threads import time_threads


def _replay(arms: OrtgpuArms) -> None:
    assert arms.graph is not None
    arms.graph.replay()


def spans_of(arms: OrtgpuArms, step: str, replays: int) -> list[int]:
    with tempfile.TemporaryDirectory() as folder:
        _profiled(arms, folder)
        run = getattr(arms, step)
        for _ in range(replays):
            run()
        timing, spans = _end_profiling(arms)
    assert timing == "gpu-timestamps", timing
    return spans


def describe(label: str, spans: list[int]) -> None:
    s = sorted(spans)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] / 1e3

    print(
        f"{label:58s} n={len(s):4d} min {s[0] / 1e3:7.1f} p10 {q(0.1):7.1f} p50 {statistics.median(s) / 1e3:7.1f} "
        f"p90 {q(0.9):7.1f} max {s[-1] / 1e3:7.1f} us; first 8: {[round(x / 1e3) for x in spans[:8]]}",
        flush=True,
    )


def ceiling(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== ceiling: GPU us per replay timed whole, by setting", flush=True)

    def fresh(step: str, replays: int = 50, warm: int = 0) -> list[int]:
        arms = OrtgpuArms(model_bytes, feeds, env)
        try:
            arms.capture()
            for _ in range(warm):
                getattr(arms, step)()
            return spans_of(arms, step, replays)
        finally:
            arms.close()

    describe("fresh session, replay_and_read x50 (the bench's)", fresh("captured_read_end_to_end"))
    describe("fresh session, replay+to_numpy x50", fresh("captured_end_to_end"))
    describe("fresh session, replay_and_read x50 after 50 warm", fresh("captured_read_end_to_end", 50, 50))
    describe("fresh session, replay_and_read x400", fresh("captured_read_end_to_end", 400))
    # the threaded runs first, as the bench does
    sessions = [OrtgpuArms(model_bytes, feeds, env) for _ in range(8)]
    for arms in sessions:
        arms.capture()
    for boundary in ("captured_end_to_end", "captured_read_end_to_end", "captured_run_only"):
        time_threads([getattr(a, boundary) for a in sessions], 20, 300, None)
    describe("after K=8 threads, sessions open: replay_and_read x50", fresh("captured_read_end_to_end"))
    for arms in sessions:
        arms.close()
    describe("after K=8 threads, sessions closed: replay_and_read x50", fresh("captured_read_end_to_end"))
    describe("again: replay+to_numpy x50", fresh("captured_end_to_end"))
    gc.collect()
    describe("after gc.collect(): replay_and_read x50", fresh("captured_read_end_to_end"))
    time.sleep(2)
    describe("after 2 s idle: replay_and_read x50", fresh("captured_read_end_to_end"))


def tail(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== tail: end_to_end steps/s and p50/p99 ms (all threads' steps), by setting", flush=True)
    sessions = [OrtgpuArms(model_bytes, feeds, env) for _ in range(8)]
    try:
        for arms in sessions:
            arms.capture()
        interval = sys.getswitchinterval()

        def nothing() -> None:
            pass

        def short_interval() -> None:
            sys.setswitchinterval(0.0005)

        def usual_interval() -> None:
            sys.setswitchinterval(interval)

        settings: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
            ("default", nothing, nothing),
            ("gc disabled", gc.disable, gc.enable),
            ("switch interval 0.5 ms", short_interval, usual_interval),
        ]
        for round_ in range(2):
            for k in (4, 8):
                for label, on, off in settings:
                    collections = [0]

                    def count(phase: str, info: dict[str, Any], c: list[int] = collections) -> None:
                        if phase == "start" and info.get("generation") == 2:
                            c[0] += 1

                    gc.callbacks.append(count)
                    on()
                    try:
                        window, times = time_threads([a.captured_end_to_end for a in sessions[:k]], 50, 1000, None)
                    finally:
                        off()
                        gc.callbacks.remove(count)
                    every = np.asarray([t for ts in times for t in ts]) * 1e3
                    p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
                    over5 = int((every > 3.0).sum())
                    print(
                        f"round {round_} K={k} {label:24s} {every.size / window:8.0f} steps/s p50 {p50:6.3f} "
                        f"p99 {p99:6.3f} p99/p50 {p99 / p50:5.2f} steps>3ms {over5:4d} gen2 GCs {collections[0]}",
                        flush=True,
                    )
    finally:
        for arms in sessions:
            arms.close()


def profile(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== profile: replay + to_numpy, interleaved: off / on (detail 1 in 10) / on (detail never after the first)")
    arms = {name: OrtgpuArms(model_bytes, feeds, env) for name in ("off", "on10", "on_never")}
    folder = tempfile.mkdtemp()
    try:
        for name, a in arms.items():
            a.capture()
            if name != "off":
                a.session.profile_file_prefix = os.path.join(folder, name)
                a.session.start_profiling(detail_every=10 if name == "on10" else 10**9)
        calls: dict[str, list[float]] = {n: [] for n in arms}
        steps: dict[str, list[float]] = {n: [] for n in arms}
        order = list(arms.items())
        for i in range(1600):
            for name, a in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                a._upload()
                t1 = time.perf_counter()
                _replay(a)
                t2 = time.perf_counter()
                a._read()
                t3 = time.perf_counter()
                if i >= 100:
                    calls[name].append(t2 - t1)
                    steps[name].append(t3 - t0)
        base_mean, base_p50 = statistics.fmean(steps["off"]), statistics.median(steps["off"])
        for name in arms:
            print(
                f"{name:9s} step p50 {statistics.median(steps[name]) * 1e6:7.1f} us mean {statistics.fmean(steps[name]) * 1e6:7.1f}"
                f" (x off: p50 {statistics.median(steps[name]) / base_p50:5.3f} mean {statistics.fmean(steps[name]) / base_mean:5.3f});"
                f" replay() call p50 {statistics.median(calls[name]) * 1e6:6.1f} us mean {statistics.fmean(calls[name]) * 1e6:6.1f}",
                flush=True,
            )
        for name in ("on10", "on_never"):
            path = arms[name].session.end_profiling()
            with open(path) as handle:
                import json

                events = json.load(handle)["traceEvents"]
            spans = [
                e["args"] for e in events if e.get("ph") == "X" and e.get("cat") == "replay" and "gpu_ns" in e["args"]
            ]
            for detail in (False, True):
                chosen = [int(a["gpu_ns"]) for a in spans if a.get("detail") is detail]
                if chosen:
                    describe(f"{name} GPU spans detail={detail}", chosen)
    finally:
        for a in arms.values():
            a.close()


def spin(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    print("== spin: end_to_end / replay_and_read at K=4, 8: a wait's poller after its 2 ms spin blocks at once")
    print("   (nap 0, before session 14) or polls without blocking, napping, for 100 ms first (nap 0.1); spin 100 ms")
    settings = {"nap 0": (2000.0, 0.0), "nap 0.1": (2000.0, 0.1), "spin 100 ms": (100000.0, 0.0)}
    envs = {}
    for label, (us, nap) in settings.items():
        envs[label] = ortgpu.Env(backend=WgpuBackend(spin_wait_us=us))
        native: Any = envs[label].default_device._native_device()
        native.set_nap_poll(nap)
    sessions = {label: [OrtgpuArms(model_bytes, feeds, e) for _ in range(8)] for label, e in envs.items()}
    try:
        for group in sessions.values():
            for arms in group:
                arms.capture()
        for round_ in range(2):
            for k in (4, 8):
                for label, group in sessions.items():
                    for boundary in ("captured_end_to_end", "captured_read_end_to_end"):
                        window, times = time_threads([getattr(a, boundary) for a in group[:k]], 50, 1000, None)
                        every = np.asarray([t for ts in times for t in ts]) * 1e3
                        p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
                        print(
                            f"round {round_} K={k} {label:12s} {boundary:26s} {every.size / window:8.0f} steps/s "
                            f"p50 {p50:6.3f} p99 {p99:6.3f} p99/p50 {p99 / p50:5.2f} steps>3ms {int((every > 3).sum()):4d}",
                            flush=True,
                        )
    finally:
        for group in sessions.values():
            for arms in group:
                arms.close()


def ceiling2(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== ceiling2: GPU us per replay, replays pipelined (replay() only, GPU kept busy)")
    for warm in (0, 100):
        arms = OrtgpuArms(model_bytes, feeds, env)
        try:
            arms.capture()
            with tempfile.TemporaryDirectory() as folder:
                _profiled(arms, folder)
                for _ in range(warm + 300):
                    _replay(arms)
                arms._read()
                timing, spans = _end_profiling(arms)
            describe(f"pipelined x300 after {warm} (all)", spans)
            describe("pipelined, last 200", spans[-200:])
        finally:
            arms.close()
    time.sleep(2)
    arms = OrtgpuArms(model_bytes, feeds, env)
    try:
        arms.capture()
        with tempfile.TemporaryDirectory() as folder:
            _profiled(arms, folder)
            for _ in range(300):
                _replay(arms)
            arms._read()
            timing, spans = _end_profiling(arms)
        describe("after 2 s idle, pipelined x300", spans)
        describe("after 2 s idle, pipelined, last 200", spans[-200:])
    finally:
        arms.close()


def breakdown(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    print("== breakdown: end_to_end parts (upload, replay, read) per step; slow steps and whether they cluster")
    sessions = [OrtgpuArms(model_bytes, feeds, env) for _ in range(8)]
    try:
        for arms in sessions:
            arms.capture()
        for round_ in range(2):
            for k in (4, 8):
                records: list[list[tuple[float, float, float, float]]] = [[] for _ in range(k)]
                barrier = threading.Barrier(k)

                def work(index: int) -> None:
                    arms, mine = sessions[index], records[index]
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
                parts = np.diff(every, axis=1) * 1e3  # upload, replay, read (ms)
                total = parts.sum(axis=1)
                window = every[:, 3].max() - every[:, 0].min()
                slow = total >= np.percentile(total, 98)
                print(
                    f"round {round_} K={k}: {len(total) / window:6.0f} steps/s, step p50 {np.median(total):.3f} "
                    f"p99 {np.percentile(total, 99):.3f} ms; parts p50 (upload, replay, read) "
                    f"{np.round(np.median(parts, axis=0), 3).tolist()}; slowest 2% mean parts "
                    f"{np.round(parts[slow].mean(axis=0), 3).tolist()} max {np.round(parts.max(axis=0), 3).tolist()}",
                    flush=True,
                )
                # clustering: for each slow step, how many other threads had a slow step overlapping it
                starts, ends = every[slow, 0], every[slow, 3]
                overlaps = [int(((starts < e) & (ends > s)).sum()) - 1 for s, e in zip(starts, ends)]
                print(
                    f"   slow steps overlapping another slow step: mean {np.mean(overlaps):.2f} of {k - 1} other threads"
                    f"; slow-step start gaps (ms, sorted, first 12): "
                    f"{np.round(np.diff(np.sort(starts))[:12] * 1e3, 2).tolist()}",
                    flush=True,
                )
    finally:
        for arms in sessions:
            arms.close()


def lockstats(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    """Who holds the device's lock at K=4 and K=8, for how long, and how long takers wait (outermost only)."""
    from ortgpu_core.backends._device_lock import DeviceLock

    print("== lockstats: device lock hold and wait per caller (end_to_end)")
    records: list[tuple[str, float, float, float]] = []
    local = threading.local()
    enter, leave = DeviceLock.__enter__, DeviceLock.__exit__

    def timed_enter(self: DeviceLock) -> DeviceLock:
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth == 0:
            frame = sys._getframe(1)
            local.caller = f"{frame.f_code.co_name}<{sys._getframe(2).f_code.co_name}"
            local.asked = time.perf_counter()
            result = enter(self)
            local.got = time.perf_counter()
            return result
        return enter(self)

    def timed_exit(self: DeviceLock, *args: Any) -> None:
        local.depth -= 1
        leave(self, *args)
        if local.depth == 0:
            records.append((local.caller, local.asked, local.got, time.perf_counter()))

    sessions = [OrtgpuArms(model_bytes, feeds, env) for _ in range(8)]
    try:
        for arms in sessions:
            arms.capture()
        DeviceLock.__enter__ = timed_enter  # type: ignore[method-assign]
        DeviceLock.__exit__ = timed_exit  # type: ignore[method-assign]
        try:
            for k in (4, 8):
                records.clear()
                window, times = time_threads([a.captured_end_to_end for a in sessions[:k]], 50, 1000, None)
                steps = sum(len(t) for t in times)
                print(
                    f"K={k}: {steps / window:6.0f} steps/s; lock acquisitions per step {len(records) / (steps + 50 * k):.2f}"
                )
                by: dict[str, list[tuple[float, float]]] = {}
                for caller, asked, got, released in records:
                    by.setdefault(caller, []).append((got - asked, released - got))
                busy = sum(r[3] - r[2] for r in records)
                print(f"   lock held {busy / window:.0%} of the window")
                for caller, pairs in sorted(by.items(), key=lambda item: -len(item[1]))[:8]:
                    waits = np.asarray([p[0] for p in pairs]) * 1e6
                    holds = np.asarray([p[1] for p in pairs]) * 1e6
                    print(
                        f"   {caller:45s} n {len(pairs):6d} wait p50 {np.median(waits):7.1f} p99 {np.percentile(waits, 99):8.1f} us;"
                        f" hold p50 {np.median(holds):6.1f} p99 {np.percentile(holds, 99):8.1f} max {holds.max():8.1f} us",
                        flush=True,
                    )
        finally:
            DeviceLock.__enter__ = enter  # type: ignore[method-assign]
            DeviceLock.__exit__ = leave  # type: ignore[method-assign]
    finally:
        for arms in sessions:
            arms.close()


def profile2(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    """Profiling's steady-state cost by ring size and detail sampling: replay + to_numpy, interleaved, 200 warm
    steps (every slot's timed list built), then 1500 timed."""
    import ortgpu._profiling as profiling

    print("== profile2: replay + to_numpy, interleaved after 200 warm steps; ring slots x detail_every")
    settings = {
        "off": None,
        "16/10": (16, 10),
        "64/10": (64, 10),
        "16/50": (16, 50),
        "64/50": (64, 50),
        "64/never": (64, 10**9),
    }
    arms = {name: OrtgpuArms(model_bytes, feeds, env) for name in settings}
    folder = tempfile.mkdtemp()
    usual = profiling.RING_SLOTS
    try:
        for name, setting in settings.items():
            a = arms[name]
            a.capture()
            if setting is not None:
                profiling.RING_SLOTS = setting[0]
                a.session.profile_file_prefix = os.path.join(folder, name.replace("/", "_"))
                a.session.start_profiling(detail_every=setting[1])
                a.captured_end_to_end()  # the timer is made now, with this ring size
        profiling.RING_SLOTS = usual
        steps: dict[str, list[float]] = {n: [] for n in arms}
        calls: dict[str, list[float]] = {n: [] for n in arms}
        order = list(arms.items())
        for i in range(1700):
            for name, a in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                a._upload()
                t1 = time.perf_counter()
                _replay(a)
                t2 = time.perf_counter()
                a._read()
                t3 = time.perf_counter()
                if i >= 200:
                    calls[name].append(t2 - t1)
                    steps[name].append(t3 - t0)
        base_mean, base_p50 = statistics.fmean(steps["off"]), statistics.median(steps["off"])
        for name in arms:
            print(
                f"{name:9s} step p50 {statistics.median(steps[name]) * 1e6:7.1f} us mean {statistics.fmean(steps[name]) * 1e6:7.1f}"
                f" (x off: p50 {statistics.median(steps[name]) / base_p50:5.3f} mean {statistics.fmean(steps[name]) / base_mean:5.3f});"
                f" replay() p50 {statistics.median(calls[name]) * 1e6:6.1f} mean {statistics.fmean(calls[name]) * 1e6:6.1f} us",
                flush=True,
            )
    finally:
        profiling.RING_SLOTS = usual
        for a in arms.values():
            a.close()


def periodic(env: ortgpu.Env, model_bytes: bytes, feeds: dict[str, Any]) -> None:
    """Which profiled replays are slow: replay() and read time by position in the ring's read cycle."""
    import ortgpu._profiling as profiling

    print("== periodic: profiled replay + to_numpy (one session), time by step index modulo the ring's read period")
    usual = profiling.RING_SLOTS
    for slots, every, period in ((16, 10**9, 12), (64, 10**9, 48), (16, 10, 12)):
        profiling.RING_SLOTS = slots
        a = OrtgpuArms(model_bytes, feeds, env)
        try:
            a.capture()
            a.session.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
            a.session.start_profiling(detail_every=every)
            for _ in range(300):
                a.captured_end_to_end()
            calls, reads = [], []
            for _ in range(period * 50):
                a._upload()
                t0 = time.perf_counter()
                _replay(a)
                t1 = time.perf_counter()
                a._read()
                t2 = time.perf_counter()
                calls.append(t1 - t0)
                reads.append(t2 - t1)
            c, r = np.asarray(calls) * 1e6, np.asarray(reads) * 1e6
            by = [(round(float(c[k::period].mean())), round(float(r[k::period].mean()))) for k in range(period)]
            print(
                f"slots {slots} detail_every {every}: replay p50 {np.median(c):.1f} mean {c.mean():.1f}, read p50 "
                f"{np.median(r):.1f} mean {r.mean():.1f} us; by index mod {period} (replay, read): {by}",
                flush=True,
            )
            slow = np.argsort(c)[-20:]
            print(
                f"   slowest 20 replays: us {np.round(np.sort(c)[-20:]).tolist()} at index mod {period} "
                f"{sorted((slow % period).tolist())}",
                flush=True,
            )
        finally:
            profiling.RING_SLOTS = usual
            a.close()


def main() -> None:
    parts = sys.argv[1:] or ["ceiling", "tail", "profile"]
    model, shapes = build_model("mlp16", 1)
    feeds = model_feeds("mlp16", model, shapes)
    model_bytes = model.SerializeToString()
    env = ortgpu.Env()
    print(env.default_device, flush=True)
    for part in parts:
        {
            "ceiling": ceiling,
            "tail": tail,
            "profile": profile,
            "spin": spin,
            "ceiling2": ceiling2,
            "breakdown": breakdown,
            "lockstats": lockstats,
            "profile2": profile2,
            "periodic": periodic,
        }[part](env, model_bytes, feeds)
    print("live handles", ortgpu.live_handles() if hasattr(ortgpu, "live_handles") else "?", flush=True)


if __name__ == "__main__":
    main()
