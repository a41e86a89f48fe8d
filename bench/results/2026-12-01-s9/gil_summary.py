"""Session 9: what py-spy ``--gil`` samples (only the thread holding the GIL) say about where_time.py's workers.

Usage: python gil_summary.py FILE STEPS RATE.  Counts the samples whose stack is inside a worker's step loop, turns
them into microseconds of GIL held per step (samples / RATE / STEPS, STEPS counting the warm-up steps too), and
lists the innermost frames of this project's code that held it most."""

from __future__ import annotations

import collections
import sys


def main() -> None:
    path, steps, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    held = 0
    sites: collections.Counter[str] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if "work (" not in stack or "where_time" not in stack:
            continue
        held += int(count)
        ours = [f for f in stack.split(";") if "ortgpu" in f or "harness" in f]
        sites[ours[-1].split(" (")[0] if ours else "?"] += int(count)
    print(f"{path}: GIL held by the workers {1e6 * held / rate / steps:.1f} us per step ({held} samples)")
    for site, samples in sites.most_common(8):
        print(f"  {1e6 * samples / rate / steps:6.1f} us  {site}")


if __name__ == "__main__":
    main()
