"""Session 9: summarize py-spy raw output (``--native --idle --threads``) of the worker threads of where_time.py.

Usage: python spy_summary.py FILE [top]. Each sample of a thread named ``Thread-N (work)`` is put in one state:
``GIL wait`` (take_gil on the stack), ``lock/event wait`` (a Python-level lock acquire), ``futex in wgpu`` (a
wgpu-native frame with a futex/park below it: waiting on one of wgpu-native's locks), ``in wgpu`` (running in
wgpu-native), ``in driver`` (below wgpu-native in another library), ``python`` (else); each with the innermost
frame of this project's code (``where``).  Prints the shares of samples per state and the top (state, where) pairs."""

from __future__ import annotations

import collections
import re
import sys


def classify(frames: list[str]) -> tuple[str, str]:
    where = "?"
    for frame in frames:
        if ("ortgpu" in frame or "bench/" in frame or "where_time" in frame) and "(" in frame:
            where = frame.split(" (")[0] + " " + frame.rsplit(":", 1)[-1].rstrip(")")
    text = ";".join(frames)
    wgpu_at = [i for i, f in enumerate(frames) if "libwgpu_native" in f]
    if "take_gil" in text:
        return "GIL wait", where
    if "acquire_timed" in text or "PyThread_acquire_lock" in text or "lock_PyThread_acquire" in text:
        return "lock/event wait", where
    if wgpu_at:
        below = frames[wgpu_at[-1] + 1 :]
        first = next((f for f in frames if "libwgpu_native" in f and ("wgpu" in f.split(" (")[0])), frames[wgpu_at[0]])
        name = re.sub(r"::h[0-9a-f]{16}", "", first.split(" (")[0])[:90]
        if any("futex" in f or "park" in f or "syscall" in f for f in frames[wgpu_at[0] :]):
            return "futex in wgpu", f"{where} | {name}"
        if below and "libc" not in below[-1]:
            return "in driver", f"{where} | {name}"
        return "in wgpu", f"{where} | {name}"
    return "python", where


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    states: collections.Counter[str] = collections.Counter()
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if not frames[0].startswith("thread") or "(work)" not in frames[0]:
            continue
        if not any("where_time.py" in f and "work" in f for f in frames):
            continue
        state, where = classify(frames[1:])
        states[state] += int(count)
        pairs[(state, where)] += int(count)
    total = sum(states.values())
    print(f"{path}: {total} worker samples")
    for state, n in states.most_common():
        print(f"  {100 * n / total:5.1f}%  {state}")
    for (state, where), n in pairs.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {state:16s} {where}")


if __name__ == "__main__":
    main()
