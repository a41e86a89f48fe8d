"""The seam a captured graph replays through: its frozen work and the submitter that submits it.

At capture the session hands :class:`~ortgpu_core._graph.CapturedGraph` two objects:

* :class:`ReplayWork`, the frozen command list with everything a submission of it may need (the outputs' ranges
  to read ahead, the buffers the program reads and writes, the program that owns the list's native objects).  It is
  built once and never changes: the bound values are pinned while the graph lives, so their buffers stay the same.
* a :class:`GraphSubmitter`, the strategy that submits that work: :class:`PlainSubmitter` (concurrent mode),
  :class:`SerializedSubmitter` (under the Env's serial lock), or the session's profiled one (``ortgpu``: timed into
  the session's profiling record).  The session chooses it at capture and swaps it on its live graphs when
  profiling starts or ends (``CapturedGraph._use_submitter``), so an unprofiled replay pays no profiling check.

``replay()`` is then the graph's state guard plus one call, ``submitter.replay(work)``.  This module imports no
Cython module of the core at run time, so the object model and the session both import it freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Mapping, Protocol, Sequence, final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ._value import DeviceBuffer, OrtValue, WebGPU
    from .backends._commands import CommandList
    from .backends.protocol import BackendDevice

__all__ = ["ReadRange", "ReplayProgram", "ReplayWork", "GraphSubmitter", "PlainSubmitter", "SerializedSubmitter"]

#: ``(buffer handle, offset, bytes)``: a range of a device buffer that a submission copies ahead for a later read.
ReadRange = tuple[int, int, int]


class ReplayProgram(Protocol):
    """What the core asks of the program a graph was recorded from (``ortgpu``'s ``DeviceProgram``): the program
    owns the native objects the command list refers to (intermediate buffers, bind groups)."""

    def raise_data_errors(self) -> None:
        """Raise ``InvalidArgumentError`` if a kernel of the last submission found invalid data (an index out of
        range); reads a status word back, so it waits for that submission."""
        ...

    def release(self) -> None:
        """Free the program's native objects (the graph calls it once, at release)."""
        ...


@final
@dataclass(frozen=True, slots=True, eq=False)
class ReplayWork:
    """A captured graph's work, frozen at capture: what every submitter submits.

    Parameters
    ----------
    graph_id
        The graph's id in its session (profiling names its events by it).
    commands
        The frozen command list (``CommandList.freeze()``): a backend may prepare its next submission ahead.
    read_ahead
        The outputs' ranges, in the model's output order: each replay's submission copies them ahead, so that
        ``to_numpy()`` after ``replay()`` submits nothing.
    inputs, outputs
        The buffers the program reads (inputs whose value was folded into the plan left out) and writes, by name:
        what a profiled replay runs the program on, step by step or timed.
    program
        The program the list was recorded from; it owns the native objects the list refers to.
    """

    graph_id: int
    commands: CommandList
    read_ahead: tuple[ReadRange, ...]
    inputs: Mapping[str, DeviceBuffer]
    outputs: Mapping[str, DeviceBuffer]
    program: ReplayProgram

    def __post_init__(self) -> None:
        if not self.commands.frozen:
            raise ValueError("ReplayWork needs a frozen CommandList (commands.freeze())")


class GraphSubmitter(Protocol):
    """How a captured graph's work reaches the device: chosen by the session at capture, swapped when profiling
    starts or ends.  Every method is called by the graph under its lock, after its state checks."""

    def replay(self, work: ReplayWork) -> None:
        """Submit ``work`` once, its outputs read ahead in that submission (``CapturedGraph.replay``)."""
        ...

    def replay_and_read(self, work: ReplayWork, outputs: Sequence[OrtValue[WebGPU]]) -> list[npt.NDArray[Any]]:
        """Submit ``work`` and return host copies of ``outputs`` (the graph's bound outputs, in the model's order),
        read in or ahead of that same submission (``CapturedGraph.replay_and_read``)."""
        ...

    def replay_alone(self, work: ReplayWork) -> None:
        """Submit ``work``'s list as it is: no read-ahead, never timed (verify mode reads the outputs itself)."""
        ...

    def wait_idle(self) -> None:
        """Block until the device finished the work submitted so far (``replay_async``)."""
        ...


def output_reads(
    outputs: Sequence[OrtValue[WebGPU]],
) -> tuple[list[npt.NDArray[Any]], list[tuple[int, int, npt.NDArray[np.uint8]]]]:
    """Host arrays for ``outputs`` and the ``(buffer handle, offset, bytes view)`` reads that fill them, for a
    backend's ``submit_and_read`` (empty outputs get an array and no read).  A released value raises."""
    arrays: list[npt.NDArray[Any]] = []
    reads: list[tuple[int, int, npt.NDArray[np.uint8]]] = []
    for value in outputs:
        value._require_usable("read the value")
        array = np.empty(value.shape(), dtype=value.dtype)
        arrays.append(array)
        buffer = value._device_buffer
        if buffer is not None and value.nbytes:
            reads.append((buffer.handle, 0, array.reshape(-1).view(np.uint8)))
    return arrays, reads


@final
class PlainSubmitter:
    """Submits straight to the backend device (``execution_mode="concurrent"``: the device serializes its own
    native calls).  The device's methods are looked up at each call, so a wrapper set on the device later (a
    test's fault or counter) sees every replay."""

    __slots__ = ("_device",)

    def __init__(self, device: BackendDevice) -> None:
        self._device = device

    def replay(self, work: ReplayWork) -> None:
        self._device.submit(work.commands, work.read_ahead)

    def replay_and_read(self, work: ReplayWork, outputs: Sequence[OrtValue[WebGPU]]) -> list[npt.NDArray[Any]]:
        arrays, reads = output_reads(outputs)
        self._device.submit_and_read(work.commands, reads)
        return arrays

    def replay_alone(self, work: ReplayWork) -> None:
        self._device.submit(work.commands)

    def wait_idle(self) -> None:
        self._device.wait_idle()


@final
class SerializedSubmitter:
    """As :class:`PlainSubmitter`, each call holding ``lock`` (``execution_mode="serialized"``: the Env's serial
    lock, which every submission of every session of the Env holds)."""

    __slots__ = ("_device", "_lock")

    def __init__(self, device: BackendDevice, lock: ContextManager[object]) -> None:
        self._device = device
        self._lock = lock

    def replay(self, work: ReplayWork) -> None:
        with self._lock:
            self._device.submit(work.commands, work.read_ahead)

    def replay_and_read(self, work: ReplayWork, outputs: Sequence[OrtValue[WebGPU]]) -> list[npt.NDArray[Any]]:
        arrays, reads = output_reads(outputs)
        with self._lock:
            self._device.submit_and_read(work.commands, reads)
        return arrays

    def replay_alone(self, work: ReplayWork) -> None:
        with self._lock:
            self._device.submit(work.commands)

    def wait_idle(self) -> None:
        with self._lock:
            self._device.wait_idle()
