# cython: language_level=3, boundscheck=False, wraparound=False
"""A command list: copies, clears, dispatches, timestamp writes and query resolves recorded as a flat C array.

The core records into a :class:`CommandList`; a backend's ``submit`` encodes
it.  The wgpu backend hands a :class:`NativeTable` of wgpu-native function
pointers to :meth:`CommandList.encode_submit_native`, which encodes every
record and submits one command buffer in a C loop with the GIL released: no
Python object is created per command.  The fake backend walks
:meth:`CommandList.records` in Python.

Handles are integers (native pointers for wgpu, table keys for fake); the
command list neither owns nor checks them: whoever records keeps the objects
alive until the list is submitted or dropped.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport realloc, free
from libc.string cimport memset
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

DISPATCH = COMMAND_DISPATCH
COPY = COMMAND_COPY
CLEAR = COMMAND_CLEAR
TIMESTAMP = COMMAND_TIMESTAMP
RESOLVE = COMMAND_RESOLVE

# The address bits of a wgpu backend handle (x86-64 and AArch64 user-space addresses fit in 48 bits); the bits
# above hold the handle's generation (see ``_wgpu_device_base._DeviceBase._new_handle``).
cdef uintptr_t _ADDRESS_MASK = 0x0000FFFFFFFFFFFF
HANDLE_ADDRESS_MASK = _ADDRESS_MASK

# Function pointer types of the wgpu-native entry points the loop calls.  Each
# comment gives the C signature from webgpu.h; handles are opaque pointers.
# WGPUCommandEncoder wgpuDeviceCreateCommandEncoder(WGPUDevice, WGPUCommandEncoderDescriptor const*)
ctypedef void* (*create_encoder_fn)(void*, const void*) noexcept nogil
# WGPUComputePassEncoder wgpuCommandEncoderBeginComputePass(WGPUCommandEncoder, WGPUComputePassDescriptor const*)
ctypedef void* (*begin_compute_pass_fn)(void*, const void*) noexcept nogil
# void wgpuComputePassEncoderSetPipeline(WGPUComputePassEncoder, WGPUComputePipeline)
ctypedef void (*set_pipeline_fn)(void*, void*) noexcept nogil
# void wgpuComputePassEncoderSetBindGroup(WGPUComputePassEncoder, uint32_t, WGPUBindGroup, size_t, uint32_t const*)
ctypedef void (*set_bind_group_fn)(void*, uint32_t, void*, size_t, const uint32_t*) noexcept nogil
# void wgpuComputePassEncoderDispatchWorkgroups(WGPUComputePassEncoder, uint32_t, uint32_t, uint32_t)
ctypedef void (*dispatch_fn)(void*, uint32_t, uint32_t, uint32_t) noexcept nogil
# void wgpuComputePassEncoderEnd(WGPUComputePassEncoder) / wgpuComputePassEncoderRelease / ...Release
ctypedef void (*handle_fn)(void*) noexcept nogil
# void wgpuCommandEncoderCopyBufferToBuffer(WGPUCommandEncoder, WGPUBuffer, uint64_t, WGPUBuffer, uint64_t, uint64_t)
ctypedef void (*copy_buffer_fn)(void*, void*, uint64_t, void*, uint64_t, uint64_t) noexcept nogil
# void wgpuCommandEncoderClearBuffer(WGPUCommandEncoder, WGPUBuffer, uint64_t, uint64_t)
ctypedef void (*clear_buffer_fn)(void*, void*, uint64_t, uint64_t) noexcept nogil
# WGPUCommandBuffer wgpuCommandEncoderFinish(WGPUCommandEncoder, WGPUCommandBufferDescriptor const*)
ctypedef void* (*finish_fn)(void*, const void*) noexcept nogil
# void wgpuQueueSubmit(WGPUQueue, size_t, WGPUCommandBuffer const*)
ctypedef void (*submit_fn)(void*, size_t, void* const*) noexcept nogil
# void wgpuCommandEncoderWriteTimestamp(WGPUCommandEncoder, WGPUQuerySet, uint32_t queryIndex)
ctypedef void (*write_timestamp_fn)(void*, void*, uint32_t) noexcept nogil
# void wgpuCommandEncoderResolveQuerySet(WGPUCommandEncoder, WGPUQuerySet, uint32_t firstQuery, uint32_t queryCount,
#                                        WGPUBuffer destination, uint64_t destinationOffset)
ctypedef void (*resolve_query_set_fn)(void*, void*, uint32_t, uint32_t, void*, uint64_t) noexcept nogil


cdef inline double _monotonic_seconds() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


cdef inline void _end_pass(NativeTable table, void** compute_pass) noexcept nogil:
    if compute_pass[0] != NULL:
        (<handle_fn>table.fn_end_pass)(compute_pass[0])
        (<handle_fn>table.fn_release_pass)(compute_pass[0])
        compute_pass[0] = NULL


cdef inline void _release_unsubmitted(NativeTable table, void* command_buffer) noexcept nogil:
    # Release a finished command buffer that was never submitted.  wgpu-native 29 frees a command buffer's
    # wgpu-core side (its encoder, the driver's command buffers, its resource trackers: ~90 KB on lavapipe) on
    # release only when the flag its wgpuQueueSubmit sets is set; released unsubmitted, the buffer would stay in
    # wgpu-core's registry for the life of the instance.  Setting the flag first makes the release free it, as
    # wgpu-core does for any dropped command buffer.  The offset is set only where
    # backends._wgpu_unsubmitted.submitted_flag_offset allows the write (a switch, a version check, a probe);
    # -1: never written, released as is.
    if table.submitted_flag >= 0:
        (<uint8_t*>command_buffer)[table.submitted_flag] = 1
    (<handle_fn>table.fn_release_command_buffer)(command_buffer)


cdef inline void* _native(uintptr_t handle) noexcept nogil:
    # A wgpu backend handle is the object's address with a generation in its top 16 bits (``HANDLE_ADDRESS_MASK``
    # keeps the address): the generation makes a handle released and a new one at the same address differ.
    return <void*>(handle & _ADDRESS_MASK)


cdef inline void _encode_record(NativeTable table, void* encoder, CommandRecord* r, void** compute_pass,
                                void** last_pipeline) noexcept nogil:
    # One record into ``encoder``: dispatches share the open compute pass (one is begun when none is open; the
    # pipeline is set only when it changes); copies, clears, timestamp writes and query resolves end it (a
    # timestamp is written on the encoder, between passes: wgpu-native's timestamp-query-inside-encoders), except
    # that a timestamp is written inside the open pass where the table allows it (timestamp-query-inside-passes):
    # ending a pass per profiled step would add the pass's own cost to every step.
    if r.kind == COMMAND_TIMESTAMP and table.pass_timestamps and (
        compute_pass[0] != NULL or table.open_pass_timestamps
    ):
        if compute_pass[0] == NULL:  # (open_pass_timestamps: a pass is begun for it, as for a dispatch)
            compute_pass[0] = (<begin_compute_pass_fn>table.fn_begin_compute_pass)(encoder, NULL)
            last_pipeline[0] = NULL
        (<write_timestamp_fn>table.fn_pass_write_timestamp)(compute_pass[0], _native(r.a), r.x)
    elif r.kind == COMMAND_DISPATCH:
        if compute_pass[0] == NULL:
            compute_pass[0] = (<begin_compute_pass_fn>table.fn_begin_compute_pass)(encoder, NULL)
            last_pipeline[0] = NULL
        if _native(r.a) != last_pipeline[0]:
            (<set_pipeline_fn>table.fn_set_pipeline)(compute_pass[0], _native(r.a))
            last_pipeline[0] = _native(r.a)
        (<set_bind_group_fn>table.fn_set_bind_group)(compute_pass[0], 0, _native(r.b), 0, NULL)
        (<dispatch_fn>table.fn_dispatch)(compute_pass[0], r.x, r.y, r.z)
    else:
        _end_pass(table, compute_pass)
        if r.kind == COMMAND_COPY:
            (<copy_buffer_fn>table.fn_copy_buffer)(encoder, _native(r.a), r.offset_a, _native(r.b), r.offset_b, r.size)
        elif r.kind == COMMAND_TIMESTAMP:
            (<write_timestamp_fn>table.fn_write_timestamp)(encoder, _native(r.a), r.x)
        elif r.kind == COMMAND_RESOLVE:
            (<resolve_query_set_fn>table.fn_resolve_query_set)(
                encoder, _native(r.a), r.x, r.y, _native(r.b), r.offset_b
            )
        else:
            (<clear_buffer_fn>table.fn_clear_buffer)(encoder, _native(r.a), r.offset_a, r.size)


cdef class NativeTable:
    """wgpu-native entry points and the device/queue they act on, as raw addresses.

    Built once per device by the wgpu backend from ``{name: address}``; the
    names are the C function names without the ``wgpu`` prefix.
    """

    def __init__(self, uintptr_t device, uintptr_t queue, dict addresses, uintptr_t error_count=0):
        def fn(str name):
            cdef uintptr_t address = addresses[name]
            if address == 0:
                raise ValueError(f"wgpu-native entry point {name} has address 0")
            return address
        self.device = device
        self.queue = queue
        # The address of a uint32 counter of device errors (0: none); whoever
        # passes it keeps that memory alive as long as the table.
        self.error_count = <uint32_t*>error_count
        self.submitted_flag = -1
        self.fn_create_encoder = <void*><uintptr_t>fn("DeviceCreateCommandEncoder")
        self.fn_begin_compute_pass = <void*><uintptr_t>fn("CommandEncoderBeginComputePass")
        self.fn_set_pipeline = <void*><uintptr_t>fn("ComputePassEncoderSetPipeline")
        self.fn_set_bind_group = <void*><uintptr_t>fn("ComputePassEncoderSetBindGroup")
        self.fn_dispatch = <void*><uintptr_t>fn("ComputePassEncoderDispatchWorkgroups")
        self.fn_end_pass = <void*><uintptr_t>fn("ComputePassEncoderEnd")
        self.fn_release_pass = <void*><uintptr_t>fn("ComputePassEncoderRelease")
        self.fn_copy_buffer = <void*><uintptr_t>fn("CommandEncoderCopyBufferToBuffer")
        self.fn_clear_buffer = <void*><uintptr_t>fn("CommandEncoderClearBuffer")
        self.fn_finish = <void*><uintptr_t>fn("CommandEncoderFinish")
        self.fn_release_encoder = <void*><uintptr_t>fn("CommandEncoderRelease")
        self.fn_submit = <void*><uintptr_t>fn("QueueSubmit")
        self.fn_release_command_buffer = <void*><uintptr_t>fn("CommandBufferRelease")
        self.fn_write_timestamp = <void*><uintptr_t>fn("CommandEncoderWriteTimestamp")
        self.fn_pass_write_timestamp = <void*><uintptr_t>fn("ComputePassEncoderWriteTimestamp")
        self.pass_timestamps = False
        self.open_pass_timestamps = False
        self.fn_resolve_query_set = <void*><uintptr_t>fn("CommandEncoderResolveQuerySet")

    def submit_encoded(self, uintptr_t command_buffer):
        """Submit a command buffer from :meth:`CommandList.encode_native` (with the GIL released) and release it."""
        if command_buffer == 0:
            raise ValueError("submit_encoded needs a command buffer address, not 0")
        cdef void* pointer = <void*>command_buffer
        with nogil:
            (<submit_fn>self.fn_submit)(<void*>self.queue, 1, &pointer)
            (<handle_fn>self.fn_release_command_buffer)(pointer)

    def release_encoded(self, uintptr_t command_buffer):
        """Release a command buffer from :meth:`CommandList.encode_native` without submitting it (freed by
        wgpu-native only when :attr:`submitted_flag_offset` is known)."""
        if command_buffer == 0:
            raise ValueError("release_encoded needs a command buffer address, not 0")
        _release_unsubmitted(self, <void*>command_buffer)

    @property
    def submitted_flag_offset(self):
        """Where, in wgpu-native's command buffer object (at the address a command buffer handle holds), the
        byte lies that its ``wgpuQueueSubmit`` sets to 1 and its ``wgpuCommandBufferRelease`` reads: only a
        command buffer with the flag set is removed from wgpu-core's registry when released, so one released
        unsubmitted is never freed (wgpu-native 29).  When this is set (>= 0), command buffers released
        unsubmitted (:meth:`release_encoded`, and those Finish reported invalid) get the flag first, and are
        freed.  -1 (the default): unknown, released as they are.  The wgpu backend probes it per process."""
        return self.submitted_flag

    @submitted_flag_offset.setter
    def submitted_flag_offset(self, Py_ssize_t offset):
        if offset < -1 or offset > 256:
            raise ValueError(f"submitted_flag_offset must be -1 (unknown) or a byte offset in 0..256, not {offset}")
        self.submitted_flag = offset

    @property
    def timestamps_in_passes(self):
        """Whether a timestamp record inside a run of dispatches is written in the open compute pass (the device
        has wgpu-native's ``timestamp-query-inside-passes``) rather than ending it (off: written on the encoder)."""
        return self.pass_timestamps

    @timestamps_in_passes.setter
    def timestamps_in_passes(self, bint value):
        self.pass_timestamps = value

    @property
    def timestamps_open_pass(self):
        """With :attr:`timestamps_in_passes`: whether a timestamp record with no compute pass open begins one and
        is written inside it (the pass then holds the dispatches that follow) rather than on the encoder."""
        return self.open_pass_timestamps

    @timestamps_open_pass.setter
    def timestamps_open_pass(self, bint value):
        self.open_pass_timestamps = value

    @staticmethod
    def entry_point_names():
        """The C function names (without ``wgpu``) the table needs."""
        return (
            "DeviceCreateCommandEncoder", "CommandEncoderBeginComputePass",
            "ComputePassEncoderSetPipeline", "ComputePassEncoderSetBindGroup",
            "ComputePassEncoderDispatchWorkgroups", "ComputePassEncoderEnd",
            "ComputePassEncoderRelease", "CommandEncoderCopyBufferToBuffer",
            "CommandEncoderClearBuffer", "CommandEncoderFinish", "CommandEncoderRelease",
            "QueueSubmit", "CommandBufferRelease", "CommandEncoderWriteTimestamp",
            "CommandEncoderResolveQuerySet", "ComputePassEncoderWriteTimestamp",
        )


cdef class CommandList:
    """An ordered list of copies, clears and dispatches over integer handles.

    ``freeze()`` makes it immutable (a captured graph's recording); a frozen
    list can be submitted any number of times.
    """

    def __cinit__(self):
        self._records = NULL
        self._count = 0
        self._capacity = 0
        self._frozen = False
        self._early_submit = 0

    def __dealloc__(self):
        if self._records != NULL:
            free(self._records)
            self._records = NULL

    cdef CommandRecord* _append(self) except NULL:
        cdef Py_ssize_t capacity
        cdef CommandRecord* grown
        if self._frozen:
            raise RuntimeError("this command list is frozen (it belongs to a captured graph)")
        if self._count == self._capacity:
            capacity = 16 if self._capacity == 0 else self._capacity * 2
            grown = <CommandRecord*>realloc(self._records, capacity * sizeof(CommandRecord))
            if grown == NULL:
                raise MemoryError("cannot grow the command list")
            self._records = grown
            self._capacity = capacity
        cdef CommandRecord* record = &self._records[self._count]
        memset(record, 0, sizeof(CommandRecord))
        self._count += 1
        return record

    def add_dispatch(self, uintptr_t pipeline, uintptr_t bind_group, uint32_t x, uint32_t y=1, uint32_t z=1):
        """Record one compute dispatch of ``x * y * z`` workgroups."""
        cdef CommandRecord* record = self._append()
        record.kind = COMMAND_DISPATCH
        record.a = pipeline
        record.b = bind_group
        record.x = x
        record.y = y
        record.z = z

    def add_copy(self, uintptr_t source, uint64_t source_offset, uintptr_t destination,
                 uint64_t destination_offset, uint64_t size):
        """Record a buffer-to-buffer copy of ``size`` bytes."""
        cdef CommandRecord* record = self._append()
        record.kind = COMMAND_COPY
        record.a = source
        record.offset_a = source_offset
        record.b = destination
        record.offset_b = destination_offset
        record.size = size

    def add_clear(self, uintptr_t buffer, uint64_t offset, uint64_t size):
        """Record zero-filling ``size`` bytes of ``buffer`` from ``offset``."""
        cdef CommandRecord* record = self._append()
        record.kind = COMMAND_CLEAR
        record.a = buffer
        record.offset_a = offset
        record.size = size

    def add_timestamp(self, uintptr_t query_set, uint32_t index):
        """Record writing the GPU's timestamp into query ``index`` of a timestamp ``query_set``, once the work
        recorded before it is done (inside the open compute pass where the table allows it, else on the encoder
        between passes: see ``NativeTable.timestamps_in_passes``)."""
        cdef CommandRecord* record = self._append()
        record.kind = COMMAND_TIMESTAMP
        record.a = query_set
        record.x = index

    def add_resolve(self, uintptr_t query_set, uint32_t first, uint32_t count, uintptr_t destination,
                    uint64_t destination_offset):
        """Record resolving queries ``first .. first + count - 1`` of ``query_set`` into ``destination`` (a
        query-resolve buffer) at ``destination_offset``, as ``count`` little-endian uint64 values."""
        cdef CommandRecord* record = self._append()
        record.kind = COMMAND_RESOLVE
        record.a = query_set
        record.x = first
        record.y = count
        record.b = destination
        record.offset_b = destination_offset

    def without_queries(self):
        """A new (unfrozen) list of this list's records other than timestamp writes and query resolves."""
        cdef Py_ssize_t i
        cdef CommandRecord* record
        cdef CommandList out = CommandList()
        for i in range(self._count):
            if self._records[i].kind != COMMAND_TIMESTAMP and self._records[i].kind != COMMAND_RESOLVE:
                record = out._append()
                record[0] = self._records[i]
        return out

    def extend(self, CommandList other):
        """Append every record of ``other``."""
        cdef Py_ssize_t i
        cdef CommandRecord* record
        for i in range(other._count):
            record = self._append()
            record[0] = other._records[i]

    def freeze(self):
        """Make the list immutable; returns ``self``."""
        self._frozen = True
        return self

    @property
    def frozen(self):
        return self._frozen

    @property
    def early_submit(self):
        """Dispatches submitted as a command buffer of their own before the rest is encoded (0: one buffer)."""
        return self._early_submit

    @early_submit.setter
    def early_submit(self, Py_ssize_t dispatches):
        # The GPU starts on the first ``dispatches`` while the host encodes (and wgpu-native finishes, ~1.5 us per
        # dispatch) the rest; submissions run in order, so the work and its results are the same.
        if self._frozen:
            raise RuntimeError("this command list is frozen (it belongs to a captured graph)")
        if dispatches < 0:
            raise ValueError(f"early_submit must be >= 0 dispatches, not {dispatches}")
        self._early_submit = dispatches

    def clear(self):
        """Drop every record (not allowed once frozen)."""
        if self._frozen:
            raise RuntimeError("this command list is frozen (it belongs to a captured graph)")
        self._count = 0

    def __len__(self):
        return self._count

    @property
    def dispatch_count(self):
        cdef Py_ssize_t i, n = 0
        for i in range(self._count):
            if self._records[i].kind == COMMAND_DISPATCH:
                n += 1
        return n

    @property
    def query_count(self):
        """How many records are timestamp writes or query resolves."""
        cdef Py_ssize_t i, n = 0
        for i in range(self._count):
            if self._records[i].kind == COMMAND_TIMESTAMP or self._records[i].kind == COMMAND_RESOLVE:
                n += 1
        return n

    def written_among(self, dict bind_group_writes, watched):
        """The handles in ``watched`` (a container of buffer handles) that this list's records may write: the
        buffers a dispatch's bind group binds writable (``bind_group_writes``: bind group handle -> those buffer
        handles), a copy's destination, a clear's buffer, a resolve's destination.  A C loop over the records (the
        wgpu backend asks this of every submission while some buffer has a read ahead)."""
        cdef Py_ssize_t i
        cdef CommandRecord* r
        cdef set found = set()
        for i in range(self._count):
            r = &self._records[i]
            if r.kind == COMMAND_DISPATCH:
                for handle in bind_group_writes.get(r.b, ()):
                    if handle in watched:
                        found.add(handle)
            elif r.kind == COMMAND_COPY or r.kind == COMMAND_RESOLVE:
                if r.b in watched:
                    found.add(r.b)
            elif r.kind == COMMAND_CLEAR:
                if r.a in watched:
                    found.add(r.a)
        return found

    def records(self):
        """The records as tuples, for backends that interpret them in Python.

        ``("dispatch", pipeline, bind_group, (x, y, z))``,
        ``("copy", source, source_offset, destination, destination_offset, size)``,
        ``("clear", buffer, offset, size)``, ``("timestamp", query_set, index)``,
        ``("resolve", query_set, first, count, destination, destination_offset)``.
        """
        cdef Py_ssize_t i
        cdef CommandRecord r
        out = []
        for i in range(self._count):
            r = self._records[i]
            if r.kind == COMMAND_DISPATCH:
                out.append(("dispatch", r.a, r.b, (r.x, r.y, r.z)))
            elif r.kind == COMMAND_COPY:
                out.append(("copy", r.a, r.offset_a, r.b, r.offset_b, r.size))
            elif r.kind == COMMAND_TIMESTAMP:
                out.append(("timestamp", r.a, r.x))
            elif r.kind == COMMAND_RESOLVE:
                out.append(("resolve", r.a, r.x, r.y, r.b, r.offset_b))
            else:
                out.append(("clear", r.a, r.offset_a, r.size))
        return out

    cdef void* _finish(self, NativeTable table, void* encoder, uint32_t errors_before) noexcept nogil:
        # Finish ``encoder`` (released here) into a command buffer; NULL when wgpu-native reported an error since
        # ``errors_before`` (the buffer is released then): it reports an invalid encoder at Finish (through the
        # error callback) but aborts the process when such a buffer is submitted.
        cdef void* command_buffer = (<finish_fn>table.fn_finish)(encoder, NULL)
        (<handle_fn>table.fn_release_encoder)(encoder)
        if command_buffer != NULL and table.error_count != NULL and table.error_count[0] != errors_before:
            _release_unsubmitted(table, command_buffer)
            command_buffer = NULL
        return command_buffer

    cdef int _finish_submit(
        self, NativeTable table, void* encoder, uint32_t errors_before, double* phases
    ) noexcept nogil:
        # :meth:`_finish`, then submit and release the command buffer; adds the seconds spent to phases[1] and
        # phases[2].  Returns whether it was submitted.
        cdef double started = _monotonic_seconds() if phases != NULL else 0.0
        cdef double finished = 0.0
        cdef void* command_buffer = self._finish(table, encoder, errors_before)
        if phases != NULL:
            finished = _monotonic_seconds()
        if command_buffer != NULL:
            (<submit_fn>table.fn_submit)(<void*>table.queue, 1, &command_buffer)
            (<handle_fn>table.fn_release_command_buffer)(command_buffer)
        if phases != NULL:
            phases[1] += finished - started
            phases[2] += _monotonic_seconds() - finished
        return command_buffer != NULL

    cdef int encode_submit(
        self, NativeTable table, double* phases, CommandRecord* tail, Py_ssize_t tail_count
    ) except -1 nogil:
        # One encoder, compute passes spanning runs of consecutive dispatches, one submit; or, with
        # ``early_submit`` = n and more dispatches than that, the first n dispatches in a command buffer of their
        # own, submitted before the rest is encoded.  ``tail`` (``tail_count`` records, may be NULL) is encoded
        # after this list's records, into the same (last) command buffer.  Everything here is a C call through a
        # function pointer.
        # ``phases`` (NULL on the hot path) receives the seconds spent encoding, in wgpuCommandEncoderFinish and
        # in wgpuQueueSubmit.
        cdef double started = 0.0
        cdef double encode_seconds = 0.0
        cdef void* encoder = (<create_encoder_fn>table.fn_create_encoder)(<void*>table.device, NULL)
        cdef void* compute_pass = NULL
        cdef Py_ssize_t i
        cdef Py_ssize_t dispatches = 0
        cdef Py_ssize_t split = self._early_submit
        cdef Py_ssize_t total = self._count + tail_count
        cdef CommandRecord* r
        cdef void* last_pipeline = NULL
        cdef uint32_t errors_before = 0
        if phases != NULL:
            phases[0] = phases[1] = phases[2] = 0.0
            started = _monotonic_seconds()
        if table.error_count != NULL:
            errors_before = table.error_count[0]
        if encoder == NULL:
            return 0
        for i in range(total):
            r = &self._records[i] if i < self._count else &tail[i - self._count]
            _encode_record(table, encoder, r, &compute_pass, &last_pipeline)
            if r.kind == COMMAND_DISPATCH:
                dispatches += 1
                if dispatches == split and i + 1 < total:
                    _end_pass(table, &compute_pass)
                    if phases != NULL:
                        encode_seconds += _monotonic_seconds() - started
                    if not self._finish_submit(table, encoder, errors_before, phases):
                        return 0
                    if phases != NULL:
                        started = _monotonic_seconds()
                    encoder = (<create_encoder_fn>table.fn_create_encoder)(<void*>table.device, NULL)
                    if encoder == NULL:
                        return 0
        _end_pass(table, &compute_pass)
        if phases != NULL:
            phases[0] = encode_seconds + _monotonic_seconds() - started
        return self._finish_submit(table, encoder, errors_before, phases)

    cdef void* encode(self, NativeTable table, CommandRecord* tail, Py_ssize_t tail_count) noexcept nogil:
        # Every record, then ``tail``, into one command buffer, which is returned unsubmitted (the caller owns it);
        # NULL when there is no encoder or wgpu-native reported an error while encoding (the buffer is released).
        # ``early_submit`` does not apply: nothing is submitted here.
        cdef void* encoder = (<create_encoder_fn>table.fn_create_encoder)(<void*>table.device, NULL)
        cdef void* compute_pass = NULL
        cdef void* last_pipeline = NULL
        cdef Py_ssize_t i
        cdef Py_ssize_t total = self._count + tail_count
        cdef uint32_t errors_before = table.error_count[0] if table.error_count != NULL else 0
        if encoder == NULL:
            return NULL
        for i in range(total):
            _encode_record(table, encoder, &self._records[i] if i < self._count else &tail[i - self._count],
                           &compute_pass, &last_pipeline)
        _end_pass(table, &compute_pass)
        return self._finish(table, encoder, errors_before)

    def encode_native(self, NativeTable table, CommandList tail=None):
        """Encode every record (then ``tail``'s) into one command buffer *without* submitting it, with the GIL
        released; returns its address (0: encoding failed) for :meth:`NativeTable.submit_encoded` or
        :meth:`NativeTable.release_encoded`, exactly one of which the caller must call.

        A command buffer holds references, not data: submitted later, it runs on the buffers' contents at that
        point in the queue (after every ``wgpuQueueWriteBuffer`` issued before the submit), so a captured graph's
        next replay can be encoded ahead, while the GPU runs the current one."""
        cdef void* command_buffer
        cdef CommandRecord* tail_records = NULL
        cdef Py_ssize_t tail_count = 0
        if tail is not None:
            tail_records = tail._records
            tail_count = tail._count
        with nogil:
            command_buffer = self.encode(table, tail_records, tail_count)
        return <uintptr_t>command_buffer

    def encode_submit_native(self, NativeTable table):
        """Encode every record and submit one command buffer, with the GIL released.

        Errors wgpu-native reports go to the device's error callback; the
        caller (the wgpu backend) checks for them after this returns.  Returns
        whether the command buffer was submitted: ``False`` when encoding
        failed (no encoder, or the table's error counter moved).
        """
        cdef int submitted
        with nogil:
            submitted = self.encode_submit(table, NULL, NULL, 0)
        return submitted == 1

    def encode_submit_with_tail_native(self, NativeTable table, CommandList tail):
        """Like :meth:`encode_submit_native`, with ``tail``'s records encoded after this list's, in the same
        (last) command buffer: one submission for both (e.g. a captured graph and the copies of its outputs)."""
        cdef int submitted
        with nogil:
            submitted = self.encode_submit(table, NULL, tail._records, tail._count)
        return submitted == 1

    def profile_native(self, NativeTable table):
        """Like :meth:`encode_submit_native`, timing its phases: a dict of seconds spent
        ``encode`` (the record loop), in ``finish`` (wgpuCommandEncoderFinish) and in
        ``submit`` (wgpuQueueSubmit), plus ``submitted``.  For benchmarks."""
        cdef double phases[3]
        cdef int submitted
        phases[0] = phases[1] = phases[2] = 0.0
        with nogil:
            submitted = self.encode_submit(table, phases, NULL, 0)
        return {"encode": phases[0], "finish": phases[1], "submit": phases[2], "submitted": submitted == 1}
