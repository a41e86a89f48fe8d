"""The profiled replay: the :class:`~ortgpu_core._replay.GraphSubmitter` a session's captured graphs use while the
session is profiling.

A session's runner hands its graphs a plain (or serialized) submitter at capture; when profiling starts it swaps
in its :class:`ProfiledReplay`, and back when profiling ends (setting ``SessionRunner.profiler``).  So an unprofiled replay checks nothing about profiling, and this module is the only place
where a replay meets the profiler.  A profiled replay runs the graph's own program on the graph's own buffers
(:class:`~ortgpu_core._replay.ReplayWork` has both): one submission with GPU timestamps where the device has
them (nothing waited for, as an unprofiled replay), else split per step and waited for (host timing).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol, Sequence, cast

import numpy.typing as npt

from ortgpu_core import OrtValue, WebGPU
from ortgpu_core._replay import GraphSubmitter, ReadRange, ReplayWork
from ortgpu_core._value import DeviceBuffer
from ortgpu_core.backends._commands import CommandList

from ._executor import DeviceProgram
from ._profiling import GpuStepTimer, SessionProfiler

__all__ = ["ProfilingHost", "ProfiledReplay"]


class ProfilingHost(Protocol):
    """What a profiled replay needs from the session's runner: its profiling record (None once profiling ended),
    the programs' GPU step timers, and its submission and wait (which hold the Env's serial lock where the
    mode says so)."""

    @property
    def profiler(self) -> SessionProfiler | None: ...

    def gpu_timer(self, program: DeviceProgram[DeviceBuffer]) -> GpuStepTimer | None: ...

    def submit(
        self, commands: CommandList, read_ahead: Sequence[ReadRange] = (), encode_next: CommandList | None = None
    ) -> None: ...

    def wait_idle(self) -> None: ...


class ProfiledReplay:
    """Replays timed into the session's profiling record; a replay the record leaves out (host timing, not in the
    sample), or one that arrives after profiling ended, goes through ``unprofiled``.

    Parameters
    ----------
    host
        The session's runner.
    unprofiled
        The submitter the graphs use when not profiling (plain or serialized).
    """

    def __init__(self, host: ProfilingHost, unprofiled: GraphSubmitter) -> None:
        # A proxy, not a reference: the runner holds this submitter, and a strong reference back would make a cycle
        # that keeps the runner, its device and its buffers alive after close() until the cyclic collector runs.
        self._host: ProfilingHost = weakref.proxy(host)
        self._unprofiled = unprofiled

    def replay(self, work: ReplayWork) -> None:
        if not self._profile(work):
            self._unprofiled.replay(work)

    def replay_and_read(self, work: ReplayWork, outputs: Sequence[OrtValue[WebGPU]]) -> list[npt.NDArray[Any]]:
        if not self._profile(work):
            return self._unprofiled.replay_and_read(work, outputs)
        # The timed submission read the outputs ahead, as an unprofiled replay()'s does: these copies submit nothing.
        return [value.to_numpy() for value in outputs]

    def replay_alone(self, work: ReplayWork) -> None:
        self._unprofiled.replay_alone(work)

    def wait_idle(self) -> None:
        self._host.wait_idle()

    def _profile(self, work: ReplayWork) -> bool:
        """Replay ``work`` timed into the profiling record; False when it did not (profiling ended, or a replay left
        out of the sample on the host-timing path, which is marked in the record and submitted as usual)."""
        host = self._host
        profiler = host.profiler
        if profiler is None:
            return False
        program = cast(DeviceProgram[DeviceBuffer], work.program)
        detail = profiler.take_detail()
        timer = program.timing_resources
        if not isinstance(timer, GpuStepTimer):
            timer = host.gpu_timer(program)
        if timer is None and not detail:  # host timing, not in the sample: replayed as unprofiled, marked
            profiler.mark(f"replay graph {work.graph_id}", "replay", {"graph_id": work.graph_id})
            return False
        # A graph's work never changes: its events' name and args, and its submission reading the outputs ahead,
        # are made once per profiling record
        cached = profiler.graph_io.get(id(work))
        if cached is None or cached[0] is not work:
            cached = profiler.graph_io[id(work)] = (
                work,
                (f"replay graph {work.graph_id}", {"graph_id": work.graph_id}),
                # the outputs read ahead in the replay's submission, as an unprofiled replay's are
                _reading_ahead(host.submit, work.read_ahead),
            )
        _, (name, args), submit = cached
        if timer is not None:
            # replay_and_read too: its outputs are read ahead in this submission (as replay()'s), and it copies
            # them out after: the timed lists are then submitted as replay()'s are, each naming the next
            profiler.run_timed_on_gpu(timer, program, work.inputs, work.outputs, submit, name, "replay", args, detail)
            return True
        with profiler.span(name, "replay", {**args, "timing": "host"}):
            profiler.run_steps(program, work.inputs, work.outputs, host.submit, host.wait_idle)
        return True


def _reading_ahead(
    submit: Callable[[CommandList, Sequence[ReadRange], CommandList | None], None], read_ahead: Sequence[ReadRange]
) -> Callable[..., None]:
    """``submit`` with these ``read_ahead`` ranges: ``submitter(commands, encode_next=None)``."""

    def submit_reading_ahead(commands: CommandList, encode_next: CommandList | None = None) -> None:
        submit(commands, read_ahead, encode_next)

    return submit_reading_ahead
