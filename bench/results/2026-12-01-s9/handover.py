"""Session 9: how long a hand-over between two threads takes on this machine.  Two threads pass a token back and
forth N times through ``threading.Event`` (each side waits, the other sets): the round trip's median, in
microseconds, is two wake-ups of a sleeping thread plus two GIL hand-overs.  With ``spin``, a third thread spins in
pure Python meanwhile (the GIL is then contended, as with several stepping threads).  Usage: python handover.py N."""

from __future__ import annotations

import statistics
import sys
import threading
import time


def round_trips(n: int) -> list[float]:
    ping, pong = threading.Event(), threading.Event()
    times: list[float] = []

    def other() -> None:
        for _ in range(n):
            ping.wait()
            ping.clear()
            pong.set()

    thread = threading.Thread(target=other)
    thread.start()
    for _ in range(n):
        start = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        times.append(time.perf_counter() - start)
    thread.join()
    return times


def main() -> None:
    n = int(sys.argv[1])
    print(f"event round trip, 2 threads: median {1e6 * statistics.median(round_trips(n)):.1f} us")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(100))

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        print(
            f"event round trip, a third thread running Python: median {1e6 * statistics.median(round_trips(n)):.1f} us"
        )
    finally:
        stop.set()
        spinner.join()


if __name__ == "__main__":
    main()
