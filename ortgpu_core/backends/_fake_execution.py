"""What the fake device's queue does to buffer contents: queue writes, reads, and submitted command lists, run
with numpy (a pipeline's twin for each dispatch, slice assignments for copies and clears; a timestamp record reads
the fake GPU clock, ``perf_counter_ns`` at least 1 ns after the previous timestamp, and a resolve record writes the
values as little-endian uint64 into a query-resolve buffer).

Work executes at once (the :mod:`.fake` module's docstring says why that keeps WebGPU's queue order); a command
list is validated whole before any of it runs, so an invalid list executes nothing.

Ownership: :class:`_FakeExecution` is a layer of ``FakeDevice`` (after ``_FakeDeviceBase``, whose docstring
describes the layers and the parts a device is made of); it has no fields of its own, and works on the base's
buffers and counters under the backend's lock, which every public method here takes (twins run under it).
"""

from __future__ import annotations

import time
from typing import Any, Literal, Sequence

import numpy as np
import numpy.typing as npt

from .._errors import ValidationError
from ._commands import CommandList
from ._fake_device_base import _FakeDeviceBase
from ._fake_handles import _BindGroup, _Buffer, _Pipeline, _QuerySet
from .protocol import QUERY_RESOLVE_ALIGNMENT, check_encode_next, host_read_target, mapped_read_range

_Step = (
    tuple[Literal["dispatch"], _Pipeline, _BindGroup, tuple[int, int, int]]
    | tuple[Literal["copy"], _Buffer, int, _Buffer, int, int]
    | tuple[Literal["clear"], _Buffer, int, int]
    | tuple[Literal["timestamp"], _QuerySet, int]
    | tuple[Literal["resolve"], _QuerySet, int, int, _Buffer, int]
)


class _FakeExecution(_FakeDeviceBase):
    """Writes, reads and submissions of a fake device (see the module's docstring)."""

    def write_buffer(self, buffer: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset`` (a queue write: it applies after all work submitted so far)."""
        with self._operations.operation("write", self._ordinal), self._lock:
            self._check_usable()
            target = self._buffer(buffer, "write_buffer")
            view = memoryview(data)
            raw = view.cast("B") if view.c_contiguous else view.tobytes()  # bytes in C order, like bytes(view)
            source = np.frombuffer(raw, dtype=np.uint8)
            self._check_range(target, offset, source.size, f"write_buffer into buffer {buffer}")
            target.data[offset : offset + source.size] = source
            self._stats.writes += 1
            self._stats.bytes_written += source.size

    def read_buffer(self, buffer: int, offset: int, size: int) -> bytes:
        """The bytes of ``[offset, offset + size)`` after all submitted work.

        The buffer needs COPY_SRC usage: uniform buffers cannot be read back.
        """
        with self._operations.operation("read", self._ordinal), self._lock:
            return self._readable(buffer, offset, size, size, "read_buffer").tobytes()

    def read_buffer_into(self, buffer: int, offset: int, out: Any) -> None:
        """:meth:`read_buffer` of ``len(out)`` bytes (any size, rounded up to 4 for the range check) into ``out``."""
        view, padded = host_read_target(out, "read_buffer_into")
        with self._operations.operation("read", self._ordinal), self._lock:
            source = self._readable(buffer, offset, view.nbytes, padded, "read_buffer_into")
            np.frombuffer(view, np.uint8)[:] = source

    def read_buffer_mapped(self, buffer: int, offset: int, size: int) -> bytearray:
        """:meth:`read_buffer` as a ``bytearray`` (the wgpu backend's hands over its mapped staging buffer; the
        contract, a writable buffer of its own that later work never changes, is the same)."""
        checked = mapped_read_range(offset, size, "read_buffer_mapped")
        with self._operations.operation("read", self._ordinal), self._lock:
            return bytearray(self._readable(buffer, offset, size, checked, "read_buffer_mapped").tobytes())

    def submit_and_read(self, commands: CommandList, reads: Sequence[tuple[int, int, Any]]) -> None:
        """:meth:`submit`, then :meth:`read_buffer_into` each ``(buffer, offset, out)``; every read is checked
        before anything is submitted."""
        with self._operations.operation("submit", self._ordinal), self._lock:
            views = []
            for index, (buffer, offset, out) in enumerate(reads):
                action = f"submit_and_read: read {index}"
                view, padded = host_read_target(out, action)
                self._readable(buffer, offset, view.nbytes, padded, action, count=False)
                views.append(view)
            self.submit(commands)
            for (buffer, offset, _), view in zip(reads, views):
                self.read_buffer_into(buffer, offset, view)

    def _readable(
        self, buffer: int, offset: int, size: int, checked: int, action: str, *, count: bool = True
    ) -> npt.NDArray[np.uint8]:
        """The ``size`` bytes at ``offset`` of a buffer that may be read, after checking ``checked`` bytes' range."""
        self._check_usable()
        source = self._buffer(buffer, action)
        if source.uniform:
            raise ValidationError(
                f"{action}: buffer {buffer} ({source.label!r}) is a uniform buffer (UNIFORM | COPY_DST), "
                "which cannot be read back"
            )
        self._check_range(source, offset, checked, f"{action} from buffer {buffer}")
        if count:
            self._stats.reads += 1
            self._stats.bytes_read += checked
        return source.data[offset : offset + size]

    # -- submission ------------------------------------------------------------
    def validate_commands(self, commands: CommandList) -> None:
        """Raise :class:`ValidationError` if ``submit(commands)`` would reject a record; execute nothing.

        The same checks ``submit`` makes (handles live, ranges, usages, grid
        limits, layouts, aliasing), without counting a submit for fault injection.
        """
        with self._operations.operation("validate", self._ordinal), self._lock:
            self._check_usable()
            for index, record in enumerate(commands.records()):
                self._validate(index, record)

    def submit(
        self,
        commands: CommandList,
        read_ahead: Sequence[tuple[int, int, int]] = (),
        encode_next: CommandList | None = None,
    ) -> None:
        """Validate every record of ``commands``, then execute them in order.

        Atomic for validation: if any record is invalid, :class:`ValidationError`
        is raised and nothing executes.  (An exception raised by a twin
        propagates as is, after the records before it have executed.)
        ``read_ahead`` ranges are checked as the wgpu backend checks them (reads here copy nothing ahead: they
        are already immediate); ``encode_next`` is checked (a CommandList or None) and otherwise unused: nothing
        is encoded here.
        """
        with self._operations.operation("submit", self._ordinal), self._lock:
            self._check_usable()
            check_encode_next(encode_next)
            for item in read_ahead:
                if not (isinstance(item, tuple) and len(item) == 3 and all(isinstance(v, int) for v in item)):
                    raise ValidationError(
                        f"submit: read_ahead takes (buffer, offset, size) tuples of ints, not {item!r}"
                    )
                buffer, offset, size = item
                padded = -(-size // 4) * 4
                self._readable(buffer, offset, size, padded, f"submit: read_ahead {item!r}", count=False)
            fired = self._faults._next_submit()
            for fault in fired:  # a loss wins over a validation error injected for the same submit
                if fault.kind == "lose_device_on_submit":
                    self.lose(fault.message)
                    self._check_usable()
            if fired:
                fault = fired[0]
                raise ValidationError(f"{self._name}: {fault.message} (submit #{fault.at} of the backend)")
            steps = [self._validate(index, record) for index, record in enumerate(commands.records())]
            self._run_deferred_zero_fills()
            for step in steps:
                self._execute(step)
            self._stats.submits += 1

    def _run_deferred_zero_fills(self) -> None:
        """Zero-fill the buffers whose fill ``faults.defer_zero_fill()`` deferred to this submit (the C3 model)."""
        pending, self._pending_clears = self._pending_clears, []
        for handle in pending:
            buffer = self._buffers.get(handle)
            if buffer is not None:
                buffer.data[:] = 0

    def _validate(self, index: int, record: tuple[object, ...]) -> _Step:
        role = f"command {index} ({record[0]})"
        if record[0] == "dispatch":
            _, pipeline_handle, bind_group_handle, grid = record
            assert isinstance(pipeline_handle, int) and isinstance(bind_group_handle, int) and isinstance(grid, tuple)
            pipeline = self._pipeline(pipeline_handle, role)
            bind_group = self._bind_group(bind_group_handle, role)
            if bind_group.pipeline != pipeline_handle:
                raise ValidationError(
                    f"{role}: bind group {bind_group_handle} was created for pipeline {bind_group.pipeline}, "
                    f"not for pipeline {pipeline_handle} ({pipeline.label!r}); automatic layouts are not shared"
                )
            for bound in bind_group.ranges:
                if bound.buffer not in self._buffers:
                    raise ValidationError(
                        f"{role}: bind group {bind_group_handle} ({bind_group.label!r}) uses buffer {bound.buffer} "
                        f"at binding {bound.binding}, which was destroyed"
                    )
            if bind_group.aliasing is not None:
                raise ValidationError(f"{role}: bind group {bind_group_handle}: {bind_group.aliasing}")
            limit = self.limits.max_compute_workgroups_per_dimension
            if any(d > limit for d in grid):
                raise ValidationError(
                    f"{role}: grid {grid} exceeds max_compute_workgroups_per_dimension {limit}; split the dispatch"
                )
            return ("dispatch", pipeline, bind_group, (int(grid[0]), int(grid[1]), int(grid[2])))
        if record[0] == "copy":
            _, source_handle, source_offset, destination_handle, destination_offset, size = record
            assert isinstance(source_handle, int) and isinstance(destination_handle, int)
            assert isinstance(source_offset, int) and isinstance(destination_offset, int) and isinstance(size, int)
            source = self._buffer(source_handle, role + " source")
            destination = self._buffer(destination_handle, role + " destination")
            if source is destination:
                raise ValidationError(f"{role}: source and destination are both buffer {source_handle}")
            if source.uniform:
                raise ValidationError(f"{role}: source buffer {source_handle} is a uniform buffer (no COPY_SRC usage)")
            self._check_range(source, source_offset, size, role + " source")
            self._check_range(destination, destination_offset, size, role + " destination")
            return ("copy", source, source_offset, destination, destination_offset, size)
        if record[0] == "timestamp":
            _, query_set_handle, query_index = record
            assert isinstance(query_set_handle, int) and isinstance(query_index, int)
            self._check_timestamps(role)
            query_set = self._query_set(query_set_handle, role)
            if query_index >= query_set.values.size:
                raise ValidationError(
                    f"{role}: query index {query_index} is out of range (query set {query_set_handle} holds "
                    f"{query_set.values.size})"
                )
            return ("timestamp", query_set, query_index)
        if record[0] == "resolve":
            _, query_set_handle, first, count, destination_handle, destination_offset = record
            assert isinstance(query_set_handle, int) and isinstance(destination_handle, int)
            assert isinstance(first, int) and isinstance(count, int) and isinstance(destination_offset, int)
            self._check_timestamps(role)
            query_set = self._query_set(query_set_handle, role)
            if count == 0 or first + count > query_set.values.size:
                raise ValidationError(
                    f"{role}: queries {first}..{first + count - 1} are not within query set {query_set_handle}'s "
                    f"{query_set.values.size}"
                )
            destination = self._buffer(destination_handle, role + " destination")
            if not destination.query_resolve:
                raise ValidationError(
                    f"{role}: buffer {destination_handle} ({destination.label!r}) was not made by "
                    "create_query_resolve_buffer (no QUERY_RESOLVE usage)"
                )
            if destination_offset % QUERY_RESOLVE_ALIGNMENT:
                raise ValidationError(
                    f"{role}: offset {destination_offset} is not a multiple of {QUERY_RESOLVE_ALIGNMENT}"
                )
            self._check_range(destination, destination_offset, 8 * count, role + " destination")
            return ("resolve", query_set, first, count, destination, destination_offset)
        _, buffer_handle, offset, size = record
        assert isinstance(buffer_handle, int) and isinstance(offset, int) and isinstance(size, int)
        buffer = self._buffer(buffer_handle, role)
        self._check_range(buffer, offset, size, role)
        return ("clear", buffer, offset, size)

    def _execute(self, step: _Step) -> None:
        stats = self._stats
        if step[0] == "dispatch":
            _, pipeline, bind_group, grid = step
            stats.dispatches += 1
            if grid[0] * grid[1] * grid[2] == 0:
                return  # an empty dispatch runs no invocation
            views = [self._buffers[r.buffer].data[r.offset : r.offset + r.size] for r in bind_group.ranges]
            pipeline.twin(views, grid)
        elif step[0] == "copy":
            _, source, source_offset, destination, destination_offset, size = step
            destination.data[destination_offset : destination_offset + size] = source.data[
                source_offset : source_offset + size
            ]
            stats.copies += 1
            stats.bytes_copied += size
        elif step[0] == "timestamp":
            _, query_set, index = step
            now = max(time.perf_counter_ns(), self._last_timestamp_ns + 1)
            self._last_timestamp_ns = now
            query_set.values[index] = now
        elif step[0] == "resolve":
            _, query_set, first, count, destination, destination_offset = step
            values = query_set.values[first : first + count].astype("<u8")
            destination.data[destination_offset : destination_offset + 8 * count] = values.view(np.uint8)
        else:
            _, buffer, offset, size = step
            buffer.data[offset : offset + size] = 0
            stats.clears += 1

    def wait_idle(self) -> None:
        """Nothing to wait for (work executes at submit); raises :class:`DeviceLostError` if lost."""
        with self._operations.operation("wait", self._ordinal), self._lock:
            self._check_usable()
