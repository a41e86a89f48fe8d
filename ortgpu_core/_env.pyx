# cython: language_level=3
"""Env and Device: the backend instance, its adapters, and the devices opened on them.

Lifetime: an :class:`Env` owns its backend and its :class:`Device` objects; a
Device holds the backend (not the Env, to avoid a reference cycle) and opens
its backend device lazily, on first use.  ``Env.close()`` closes every device;
values still alive on them then raise ``ReleasedValueError`` on use.

Device identity is the adapter this Env opened, not the (vendor_id,
device_id) numbers: two Envs' devices, or the Vulkan and OpenGL adapters of
one GPU, are different devices even when their numbers match.
"""

import itertools
import os
import threading
import warnings
import weakref

from ._errors import ArgumentTypeError, InvalidArgumentError, NotCopyable, ProvenanceError, ReleasedValueError

_env_ids = itertools.count(1)

# Preference for the default device: discrete, integrated, then the software
# adapter; Vulkan before other backends at equal type.
_ADAPTER_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "CPU": 2}
_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0}

EXECUTION_MODES = ("concurrent", "serialized")

# What an Env needs from the layers above it, wired by the package (ortgpu_core/__init__.py) when it is imported:
# the shared allocator's factory (ortgpu_core._allocator) and the route table's registration of a backend's own
# tensor kinds (ortgpu_core._routes).  Both modules build on Env and Device, so this module never imports them.
_services = {}


def _connect(shared_allocator_factory, register_foreign_kind):
    """Give the Env the allocator factory and the route registration it calls (the package does this once)."""
    _services["shared_allocator"] = shared_allocator_factory
    _services["register_foreign_kind"] = register_foreign_kind


def _preference(info):
    return (_ADAPTER_RANK.get(info.adapter_type, 3), _BACKEND_RANK.get(info.backend_type, 1), info.index)


def _make_backend(backend):
    if not isinstance(backend, str):
        return backend
    if backend == "wgpu":
        from .backends.wgpu_native import WgpuBackend
        return WgpuBackend()
    if backend == "fake":
        from .backends.fake import FakeBackend
        return FakeBackend()
    raise InvalidArgumentError(f"unknown backend {backend!r}: use 'wgpu' (wgpu-native) or 'fake' (numpy, for tests)")


cdef class Device:
    """One adapter of an Env, and the device opened on it.

    Attributes: ``index`` (position in ``env.devices``; 0 is the default
    device), ``vendor_id``, ``device_id``, ``name``, ``driver``,
    ``backend_type`` ("Vulkan", "OpenGL", "Fake"...), ``adapter_type``
    ("DiscreteGPU", "IntegratedGPU", "CPU"...), ``env_id``.  Devices are
    created by their Env; compare them by identity.
    """

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("Device objects are created by an Env: use env.devices or env.default_device")

    _copy_hint = "A Device is its Env's; use env.devices or env.default_device."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    @staticmethod
    cdef Device _create(Env env, object backend, object info, int index):
        cdef Device device = Device.__new__(Device)
        device.index = index
        device.adapter_index = info.index
        device.vendor_id = info.vendor_id
        device.device_id = info.device_id
        device.name = info.name
        device.driver = info.driver
        device.backend_type = info.backend_type
        device.adapter_type = info.adapter_type
        device.env_id = env.id
        device._env_ref = weakref.ref(env)
        device._backend = backend
        device._backend_device = None
        device._lock = threading.Lock()
        device._closed = False
        return device

    cpdef object _native_device(self):
        """The opened backend device (opened on first call).  Internal: it reads and writes any native buffer
        with no pin or provenance check, so only the core and the session use it."""
        if self._closed:
            raise ReleasedValueError(f"{self!r} is closed (its Env was closed); create a new Env")
        if self._backend_device is None:
            with self._lock:
                if self._backend_device is None:
                    opened = self._backend.open_device(self.adapter_index)
                    env = self._env_ref()
                    if env is not None and env.execution_mode == "serialized":
                        # Every call on the device under one lock: serialized mode is enforced here, at the one
                        # door every session, graph, allocator and transfer goes through, not left to callers.
                        from .backends._device_lock import SerializedDevice
                        opened = SerializedDevice(opened)
                    self._backend_device = opened
        return self._backend_device

    cdef void _close(self):
        cdef object opened
        with self._lock:
            self._closed = True
            opened = self._backend_device
            self._backend_device = None
        if opened is not None:
            try:
                opened.destroy()
            except Exception as error:  # closing always completes; say what could not be freed
                warnings.warn(f"destroying {self!r} failed: {error}", ResourceWarning, stacklevel=2)

    @property
    def env(self):
        """The Env this device belongs to (None once that Env is gone)."""
        return self._env_ref()

    @property
    def closed(self):
        """True once the device was closed (its Env closed, or the device lost): it takes no more work."""
        return self._closed

    @property
    def features(self):
        """Adapter features the device was opened with, e.g. ``{"shader-f16"}``."""
        return self._native_device().features

    @property
    def limits(self):
        """The device's limits (:class:`~ortgpu_core.backends.protocol.DeviceLimits`)."""
        return self._native_device().limits

    def __repr__(self):
        state = " closed" if self._closed else ""
        return (
            f"<Device {self.index}: {self.name} ({self.backend_type}, {self.adapter_type}, "
            f"vendor_id=0x{self.vendor_id:04x}, device_id=0x{self.device_id:04x}) env={self.env_id}{state}>"
        )


cdef class Env:
    """A backend instance with its devices; owns Env-shared allocators.

    ``Env(backend="wgpu" | "fake" | <Backend instance>, execution_mode="concurrent" | "serialized")``;
    without ``execution_mode``, ``$ORTGPU_EXECUTION_MODE`` when set, else "concurrent".  In "serialized" mode
    every device operation (allocation, writes, submits, reads, waits, pipeline creation, releases) runs one at
    a time per device, whichever thread or session makes it (the device is handed out under a lock).
    One default Env per process is returned by :func:`get_env`; more can be
    made.  Close with ``close()`` or a ``with`` block.
    """

    _copy_hint = "Create another Env with ortgpu.Env(...) (or use ortgpu.get_env())."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    def __init__(self, backend="wgpu", execution_mode=None):
        source = "execution_mode"
        if execution_mode is None:
            source = "$ORTGPU_EXECUTION_MODE"
            execution_mode = os.environ.get("ORTGPU_EXECUTION_MODE") or "concurrent"
        if execution_mode not in EXECUTION_MODES:
            raise InvalidArgumentError(
                f"{source} {execution_mode!r} is not one of {EXECUTION_MODES}: 'concurrent' lets "
                f"sessions on one device submit independently, 'serialized' runs every device operation one at a time"
            )
        self.id = next(_env_ids)
        self._backend = _make_backend(backend)
        self.backend_name = self._backend.name
        self.execution_mode = execution_mode
        self._lock = threading.RLock()
        self._closed = False
        self._shared_allocators = {}
        self._sessions = weakref.WeakSet()  # sessions on this Env's devices, closed first by close()
        foreign_kinds = getattr(self._backend, "foreign_kinds", None)
        if foreign_kinds is not None:
            # A backend's own tensor kinds (the fake backend's "other GPU") join the transfer route table.
            register_foreign_kind = _services["register_foreign_kind"]
            for kind in foreign_kinds():
                register_foreign_kind(kind)
        adapters = sorted(self._backend.enumerate_adapters(), key=_preference)
        self._devices = [Device._create(self, self._backend, info, i) for i, info in enumerate(adapters)]

    cpdef check_open(self):
        if self._closed:
            raise ReleasedValueError(f"Env {self.id} is closed; create a new Env (or use ortgpu.get_env())")

    @property
    def backend(self):
        """The backend instance (``WgpuBackend`` or ``FakeBackend``)."""
        return self._backend

    @property
    def devices(self):
        """Every adapter this Env sees, default device first."""
        return list(self._devices)

    @property
    def default_device(self):
        """A discrete GPU if there is one, else an integrated one, else the software adapter."""
        self.check_open()
        if not self._devices:
            from ._errors import DeviceError
            raise DeviceError(
                f"Env {self.id} ({self.backend_name}) found no adapter. On Debian/Ubuntu install a Vulkan "
                f"driver (apt-get install mesa-vulkan-drivers gives the software one), or use backend='fake'"
            )
        return self._devices[0]

    @property
    def closed(self):
        """True once :meth:`close` ran: the Env's devices, allocators and sessions are closed with it."""
        return self._closed

    def check_device(self, device):
        """Raise ``ProvenanceError`` unless ``device`` is one of this Env's open devices."""
        self.check_open()
        if not isinstance(device, Device):
            raise ArgumentTypeError(
                f"expected an ortgpu Device, got {type(device).__name__}: use env.devices or env.default_device"
            )
        if (<Device>device).env_id != self.id:
            raise ProvenanceError(
                f"{device!r} belongs to Env {(<Device>device).env_id}, not Env {self.id}; "
                f"use a device from this Env's env.devices"
            )
        return device

    def shared_allocator(self, device=None):
        """The Env-shared allocator of ``device`` (default: the default device).

        Its buffers may be bound by every session on the same device, and it
        is usable before any session exists.
        """
        if device is None:
            device = self.default_device
        self.check_device(device)
        with self._lock:
            allocator = self._shared_allocators.get(id(device))
            if allocator is None:
                allocator = _services["shared_allocator"](self, device)
                self._shared_allocators[id(device)] = allocator
        return allocator

    def live_handles(self):
        """Native objects alive on this Env's backend (buffers, pipelines, bind groups)."""
        return self._backend.live_handles()

    def _register_session(self, session):
        """Internal: sessions register so that ``close()`` can close them (graphs first) before the devices."""
        self.check_open()
        with self._lock:
            self._sessions.add(session)

    def close(self):
        """Close this Env's sessions (their graphs, then their buffers), then release the shared
        allocators' buffers and every device.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            sessions = list(self._sessions)
        # Closing is always allowed and always completes: a session that fails to close (its device lost) still
        # has its device destroyed below, which frees everything the session had.
        for session in sessions:
            try:
                session.close()
            except Exception as error:
                warnings.warn(f"Env {self.id}: closing {session!r} failed ({error}); its device is closed anyway",
                              ResourceWarning, stacklevel=2)
        with self._lock:
            self._closed = True
            allocators = list(self._shared_allocators.values())
            self._shared_allocators.clear()
        for allocator in allocators:
            # Every session is closed, so no graph can replay: pins left (by a graph never released) do not hold.
            allocator._close_for_env(f"its Env {self.id} was closed")
        for device in self._devices:
            (<Device>device)._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = " closed" if self._closed else ""
        return (
            f"<Env {self.id} backend={self.backend_name!r} execution_mode={self.execution_mode!r} "
            f"devices={len(self._devices)}{state}>"
        )


_default_env = None
_default_lock = threading.Lock()


def get_env():
    """The process's default Env, created on first call.

    Its backend is ``$ORTGPU_BACKEND`` when set ("wgpu" or "fake"), else "wgpu".
    """
    global _default_env
    with _default_lock:
        if _default_env is None or _default_env.closed:
            _default_env = Env(backend=os.environ.get("ORTGPU_BACKEND", "wgpu"))
        return _default_env
