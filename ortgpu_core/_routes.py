"""The transfer route table: which transfer copies what into what, as data.

Every copy (``dst.copy_from(src)``, ``dst.update_inplace(tensor)``, :func:`copy_tensors`) classifies its two ends
as :class:`Endpoint` objects (kind, vendor and device ids, device object, Env, owner), then picks the one
:class:`Route` whose declared (source kind, destination kind) pairs contain the pair and whose predicate accepts
the two ends.  No route, or more than one, raises :class:`TransferRoutingError` naming both ends.  A route calls
only functions of the runtime that owns its memory: no code path hands one backend's or device's memory to
another's functions.

Kinds: ``cpu`` and ``webgpu`` (OrtValues), ``host-array`` (numpy arrays), ``dlpack:<device>`` (other DLPack
producers, by DLPack device type: ``dlpack:cpu``, ``dlpack:cuda``, ``dlpack:rocm``, ``dlpack:metal``...), and
foreign kinds registered by backends (:func:`register_foreign_kind`; the fake backend's ``fake-other-gpu``).

=====================  ========================================  =================  ===========================
route                  source -> destination                     condition          how
=====================  ========================================  =================  ===========================
``host-copy``          cpu -> cpu                                                   numpy copy
``upload``             cpu -> webgpu                                                queue write
``download``           webgpu -> cpu                                                read (batched per device)
``device-copy``        webgpu -> webgpu                          same Device        buffer copy (one command
                                                                 object             list per device)
``staged-host``        webgpu -> webgpu                          other Device,      read, then queue write
                                                                 allow_cross_device
``host-array``         host-array, dlpack:cpu -> cpu, webgpu                        numpy.from_dlpack (no copy)
``dlpack-host-copy``   dlpack:<device> -> cpu, webgpu                               the producer's host copy
``<kind>:download``    <foreign kind> -> cpu                                        the kind's own read
``<kind>:upload``      cpu, host-array, dlpack:cpu -> <kind>                        the kind's own write
``<kind>:device-copy`` <kind> -> <kind>                          same device        the kind's own copy
=====================  ========================================  =================  ===========================

WebGPU devices are matched by the identity of their :class:`~ortgpu_core.Device` object, never by (vendor_id,
device_id) alone: the Vulkan and OpenGL adapters of one GPU, or two Envs on one adapter, share their numbers but
not their memory.  The numbers are still checked (a device copy between ends whose numbers differ is refused)
and reported in every error.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ._dlpack import DLPACK_DEVICE_KINDS, dlpack_device, dlpack_kind, host_array, is_dlpack_producer
from ._errors import (
    ArgumentTypeError,
    DtypeError,
    InvalidArgumentError,
    ReleasedValueError,
    ShapeError,
    TransferRoutingError,
)
from ._layout import padded_size
from ._value import OrtValue
from .backends._commands import CommandList
from .backends.protocol import ForeignKind

__all__ = [
    "Endpoint",
    "Route",
    "endpoint",
    "register_route",
    "register_foreign_kind",
    "unregister_route",
    "transfer_routes",
    "route_counts",
    "select_route",
    "run_transfer",
    "copy_tensors",
]

_HOST_SOURCES = frozenset({"host-array", "dlpack:cpu"})
_DEVICE_DLPACK_KINDS = frozenset(kind for number, kind in DLPACK_DEVICE_KINDS.items() if kind != "dlpack:cpu")


class Endpoint:
    """One end of a transfer: what routing looks at.

    ``kind`` (see the module docstring), ``vendor_id`` and ``device_id`` (None where the kind has none),
    ``device`` (the device object, compared by identity), ``env_id``, ``owner`` (a phrase naming the value),
    ``obj`` (the object itself).
    """

    __slots__ = ("kind", "vendor_id", "device_id", "device", "env_id", "owner", "obj", "_host")

    def __init__(
        self,
        kind: str,
        obj: object,
        owner: str,
        *,
        vendor_id: int | None = None,
        device_id: int | None = None,
        device: object = None,
        env_id: int | None = None,
    ) -> None:
        self.kind = kind
        self.obj = obj
        self.owner = owner
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.device = device
        self.env_id = env_id
        self._host: np.ndarray[Any, Any] | None = None

    def describe(self) -> str:
        """``owner (kind=..., vendor_id=..., device_id=..., device=..., env=...)``, for error messages."""
        vendor = "n/a" if self.vendor_id is None else f"0x{self.vendor_id:04x}"
        device_id = "n/a" if self.device_id is None else f"0x{self.device_id:04x}"
        if self.device is None:
            device = "none"
        elif hasattr(self.device, "backend_type"):
            device = f"{self.device.index} {self.device.name} ({self.device.backend_type})"  # type: ignore[attr-defined]
        else:
            device = repr(self.device)
        env = "none" if self.env_id is None else str(self.env_id)
        return f"{self.owner} (kind={self.kind}, vendor_id={vendor}, device_id={device_id}, device={device}, env={env})"

    def host(self, what: str) -> np.ndarray[Any, Any]:
        """The source's data as a host array (numpy and DLPack sources; made once, then reused)."""
        if self._host is None:
            self._host = host_array(self.obj, what)
        return self._host

    def __repr__(self) -> str:
        return f"<Endpoint {self.describe()}>"


# accepts(source, destination, allow_cross_device) -> None when the route takes the pair, else why not.
Acceptor = Callable[[Endpoint, Endpoint, bool], "str | None"]
Runner = Callable[[Endpoint, Endpoint], None]
BatchRunner = Callable[[Sequence[tuple[Endpoint, Endpoint]]], None]


@dataclass(frozen=True, eq=False)
class Route:
    """One transfer: the kinds it takes, a predicate on the two ends, and what it runs.

    ``run_batch`` (optional) performs several pairs of this route in as few submissions as it can.
    """

    name: str
    sources: frozenset[str]
    destinations: frozenset[str]
    accepts: Acceptor = field(repr=False)
    run: Runner = field(repr=False)
    run_batch: BatchRunner | None = field(default=None, repr=False)
    owner: str = "ortgpu_core"
    description: str = ""


_lock = threading.RLock()
_routes: list[Route] = []
_foreign: dict[str, ForeignKind] = {}
_counts: collections.Counter[str] = collections.Counter()


def register_route(route: Route) -> None:
    """Add ``route`` to the table.  Names are unique; overlapping routes are allowed, and a pair that two of them
    accept is refused when it is routed (``TransferRoutingError``: "several routes")."""
    if not isinstance(route, Route):
        raise ArgumentTypeError(f"register_route needs a Route, got {type(route).__name__}")
    with _lock:
        if any(existing.name == route.name for existing in _routes):
            raise InvalidArgumentError(f"a transfer route named {route.name!r} is already registered")
        _routes.append(route)


def unregister_route(name: str) -> None:
    """Remove the route called ``name`` (``InvalidArgumentError`` if there is none)."""
    with _lock:
        for index, existing in enumerate(_routes):
            if existing.name == name:
                del _routes[index]
                return
    raise InvalidArgumentError(f"no transfer route named {name!r} is registered")


def transfer_routes() -> list[Route]:
    """The route table, in registration order (core routes first)."""
    with _lock:
        return list(_routes)


def route_counts() -> dict[str, int]:
    """How many transfers each route has run in this process (a copy; for tests and logging)."""
    with _lock:
        return dict(_counts)


def _count(name: str, n: int = 1) -> None:
    with _lock:
        _counts[name] += n


# -- endpoints ------------------------------------------------------------------------------------------------
def endpoint(obj: object) -> Endpoint:
    """Classify ``obj`` as a transfer end (``ArgumentTypeError`` for objects no kind describes)."""
    if isinstance(obj, OrtValue):
        provenance = obj.provenance
        if provenance.placement == "cpu":
            return Endpoint("cpu", obj, "a CPU OrtValue")
        owner = (
            f"a {provenance.allocator_kind} webgpu value of session {provenance.session_id}"
            if provenance.session_id is not None
            else f"a {provenance.allocator_kind} webgpu value of the Env-shared allocator"
        )
        return Endpoint(
            "webgpu",
            obj,
            owner,
            vendor_id=provenance.vendor_id,
            device_id=provenance.device_id,
            device=provenance.device,
            env_id=provenance.env_id,
        )
    with _lock:
        kinds = list(_foreign.values())
    for kind in kinds:
        if kind.owns(obj):
            info = kind.info(obj)
            return Endpoint(
                kind.kind, obj, info.owner, vendor_id=info.vendor_id, device_id=info.device_id, device=info.device
            )
    if isinstance(obj, np.ndarray):
        return Endpoint("host-array", obj, f"a numpy array of shape {list(obj.shape)} and dtype {obj.dtype}")
    if is_dlpack_producer(obj):
        device_type, device_index = dlpack_device(obj)
        return Endpoint(
            dlpack_kind(device_type),
            obj,
            f"a DLPack {type(obj).__name__} on device ({device_type}, {device_index})",
            device_id=device_index,
        )
    raise ArgumentTypeError(
        f"cannot transfer {type(obj).__name__}: transfers take OrtValues, numpy arrays, DLPack tensors "
        f"(__dlpack__ / __dlpack_device__) and tensors of registered foreign kinds; wrap arrays with "
        f"OrtValue.ortvalue_from_numpy(array)"
    )


def _meta(end: Endpoint, what: str) -> tuple[Any, tuple[int, ...]]:
    """(dtype, shape) of an end, checking that it is usable (a DLPack source is brought to the host here)."""
    obj = end.obj
    if isinstance(obj, OrtValue):
        if obj.released:
            raise ReleasedValueError(f"cannot {what}: {end.describe()} was released")
        obj._require_usable(what)
        return obj.dtype, tuple(obj.shape())
    kind = _foreign.get(end.kind)
    if kind is not None:
        info = kind.info(obj)
        return info.dtype, tuple(info.shape)
    array = end.host(what)
    return array.dtype, tuple(array.shape)


# -- routing --------------------------------------------------------------------------------------------------
def select_route(source: Endpoint, destination: Endpoint, allow_cross_device: bool = False) -> Route:
    """The one route that accepts ``source -> destination``, or ``TransferRoutingError`` naming both ends."""
    with _lock:
        candidates = [r for r in _routes if source.kind in r.sources and destination.kind in r.destinations]
    accepted: list[Route] = []
    refusals: list[str] = []
    for route in candidates:
        why = route.accepts(source, destination, allow_cross_device)
        if why is None:
            accepted.append(route)
        else:
            refusals.append(f"{route.name}: {why}")
    if len(accepted) == 1:
        return accepted[0]
    ends = f"from {source.describe()} to {destination.describe()}"
    if accepted:
        raise TransferRoutingError(
            f"several transfer routes accept a copy {ends}: {', '.join(r.name for r in accepted)}; "
            f"routing must be unambiguous: unregister one (ortgpu_core.unregister_route(name))"
        )
    if refusals:
        raise TransferRoutingError(f"no transfer route accepts a copy {ends} ({'; '.join(refusals)})")
    if destination.kind not in {kind for r in _routes for kind in r.destinations}:
        raise TransferRoutingError(
            f"no transfer route writes into {destination.describe()}: ortgpu copies into OrtValues (and tensors "
            f"of registered foreign kinds) only; to fill a host array use np.copyto(array, value.to_numpy())"
        )
    raise TransferRoutingError(
        f"no transfer route handles kind {source.kind} -> kind {destination.kind} (copy {ends}); "
        f"go through the host: make a CPU value first (OrtValue.ortvalue_from_numpy(...)) and copy from it"
    )


def _check_pair(source: Endpoint, destination: Endpoint, what: str) -> None:
    src_dtype, src_shape = _meta(source, what)
    dst_dtype, dst_shape = _meta(destination, what)
    if src_dtype != dst_dtype:
        raise DtypeError(
            f"cannot copy dtype {src_dtype} into dtype {dst_dtype} ({what}: {source.describe()} -> "
            f"{destination.describe()}): ortgpu never casts silently; cast on the host and use "
            f"update_inplace(array.astype({str(dst_dtype)!r}))"
        )
    if src_shape != dst_shape:
        raise ShapeError(
            f"cannot copy shape {list(src_shape)} into shape {list(dst_shape)} ({what}); the shapes must match"
        )


def run_transfer(source: object, destination: object, allow_cross_device: bool = False, what: str = "copy") -> str:
    """Route and run one copy of ``source`` into ``destination``; returns the route's name."""
    src, dst = endpoint(source), endpoint(destination)
    route = select_route(src, dst, allow_cross_device)
    if source is destination:
        _meta(src, what)
        return route.name  # copying a value onto itself changes nothing (WebGPU forbids a copy onto itself)
    _check_pair(src, dst, what)
    route.run(src, dst)
    _count(route.name)
    return route.name


def _same_memory(a: Endpoint, b: Endpoint) -> bool:
    if a.obj is b.obj:
        return True
    if isinstance(a.obj, OrtValue) and isinstance(b.obj, OrtValue):
        buffer_a, buffer_b = a.obj._device_buffer, b.obj._device_buffer
        if buffer_a is not None or buffer_b is not None:
            return buffer_a is buffer_b
        return bool(np.may_share_memory(a.obj.numpy(), b.obj.numpy()))
    if isinstance(a.obj, np.ndarray) and isinstance(b.obj, OrtValue) and b.kind == "cpu":
        return bool(np.may_share_memory(a.obj, b.obj.numpy()))
    if isinstance(b.obj, np.ndarray) and isinstance(a.obj, OrtValue) and a.kind == "cpu":
        return bool(np.may_share_memory(b.obj, a.obj.numpy()))
    return False


def copy_tensors(
    sources: Sequence[object], destinations: Sequence[object], allow_cross_device: bool = False
) -> list[str]:
    """Copy ``sources[i]`` into ``destinations[i]`` for every i, as one batch (onnxruntime's ``copy_tensors``).

    The whole batch is validated before any copy starts: every pair has a route, equal dtypes and shapes, no
    destination appears twice or is also another pair's source (the copies are not ordered among themselves).
    A refused batch changes nothing.  Then each route runs its pairs together, in as few submissions as it can
    (all device copies of one device in one command list, all downloads from one device in one submission).

    Returns the route name of each pair.
    """
    if isinstance(sources, (str, bytes)) or isinstance(destinations, (str, bytes)):
        raise ArgumentTypeError("copy_tensors takes two sequences of tensors")
    sources, destinations = list(sources), list(destinations)
    if len(sources) != len(destinations):
        raise InvalidArgumentError(
            f"copy_tensors got {len(sources)} source(s) and {len(destinations)} destination(s); give one "
            f"destination per source"
        )
    pairs: list[tuple[Endpoint, Endpoint, Route]] = []
    for index, (source, destination) in enumerate(zip(sources, destinations)):
        src, dst = endpoint(source), endpoint(destination)
        route = select_route(src, dst, allow_cross_device)
        _check_pair(src, dst, f"copy pair {index} of copy_tensors")
        pairs.append((src, dst, route))
    for i, (_, dst_i, _) in enumerate(pairs):
        for j, (src_j, dst_j, _) in enumerate(pairs):
            if i == j:
                continue
            if _same_memory(dst_i, dst_j) or _same_memory(dst_i, src_j):
                raise InvalidArgumentError(
                    f"copy_tensors: the destination of pair {i} ({dst_i.describe()}) is also the "
                    f"{'destination' if _same_memory(dst_i, dst_j) else 'source'} of pair {j}; the copies of one "
                    f"batch are unordered, so split the batch"
                )
    groups: dict[str, list[tuple[Endpoint, Endpoint]]] = {}
    by_name: dict[str, Route] = {}
    for src, dst, route in pairs:
        if src.obj is dst.obj:
            continue
        groups.setdefault(route.name, []).append((src, dst))
        by_name[route.name] = route
    for name, group in groups.items():
        route = by_name[name]
        if route.run_batch is not None:
            route.run_batch(group)
        else:
            for src, dst in group:
                route.run(src, dst)
        _count(name, len(group))
    return [route.name for _, _, route in pairs]


# -- the core routes ------------------------------------------------------------------------------------------
def _always(source: Endpoint, destination: Endpoint, allow_cross_device: bool) -> str | None:
    return None


def _value(end: Endpoint) -> OrtValue[Any]:
    assert isinstance(end.obj, OrtValue)
    return end.obj


def _host_copy(source: Endpoint, destination: Endpoint) -> None:
    np.copyto(_value(destination).numpy(), _value(source).numpy())


def _upload(source: Endpoint, destination: Endpoint) -> None:
    _value(destination).update_inplace(_value(source).numpy())


def _download(source: Endpoint, destination: Endpoint) -> None:
    np.copyto(_value(destination).numpy(), _value(source).to_numpy())


def _download_batch(pairs: Sequence[tuple[Endpoint, Endpoint]]) -> None:
    # One submission per source device: every read of the batch waits once.
    by_device: dict[int, list[tuple[Endpoint, Endpoint]]] = {}
    for src, dst in pairs:
        by_device.setdefault(id(src.device), []).append((src, dst))
    for group in by_device.values():
        device: Any = group[0][0].device
        reads: list[tuple[int, int, Any]] = []
        fixups: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        for src, dst in group:
            value, target = _value(src), _value(dst).numpy()
            if value.nbytes == 0:
                continue
            buffer = value._device_buffer
            assert buffer is not None
            if target.flags.c_contiguous and target.flags.writeable:
                out = target
            else:
                out = np.empty(target.shape, target.dtype)
                fixups.append((target, out))
            reads.append((buffer.handle, 0, out.reshape(-1).view(np.uint8)))
        if reads:
            device._native_device().submit_and_read(CommandList(), reads)
        for target, out in fixups:
            np.copyto(target, out)


def _same_device(source: Endpoint, destination: Endpoint, allow_cross_device: bool) -> str | None:
    if source.device is not destination.device:
        return "the ends are on different Device objects"
    if (source.vendor_id, source.device_id) != (destination.vendor_id, destination.device_id):
        return (
            f"one Device object reports different ids (0x{source.vendor_id or 0:04x}/0x{source.device_id or 0:04x} "
            f"vs 0x{destination.vendor_id or 0:04x}/0x{destination.device_id or 0:04x})"
        )
    return None


def _device_copy_batch(pairs: Sequence[tuple[Endpoint, Endpoint]]) -> None:
    # All copies on one device in one command list, one submission: ordered after earlier submitted work.
    by_device: dict[int, tuple[Any, CommandList]] = {}
    for src, dst in pairs:
        source, target = _value(src), _value(dst)
        if source.nbytes == 0:
            continue
        source_buffer, target_buffer = source._device_buffer, target._device_buffer
        assert source_buffer is not None and target_buffer is not None
        entry = by_device.get(id(src.device))
        if entry is None:
            entry = by_device[id(src.device)] = (src.device, CommandList())
        entry[1].add_copy(source_buffer.handle, 0, target_buffer.handle, 0, padded_size(source.nbytes))
    for device, commands in by_device.values():
        device._native_device().submit(commands)


def _device_copy(source: Endpoint, destination: Endpoint) -> None:
    _device_copy_batch([(source, destination)])


def _cross_device(source: Endpoint, destination: Endpoint, allow_cross_device: bool) -> str | None:
    if source.device is destination.device:
        return "the ends are on the same Device (device-copy takes it)"
    if not allow_cross_device:
        other_env = (
            "" if source.env_id == destination.env_id else f" in different Envs ({source.env_id}, {destination.env_id})"
        )
        return (
            f"the ends are on different devices{other_env}, which share no memory or queue; ask for the host "
            f"staging copy with dst.copy_from(src, allow_cross_device=True) "
            f"(or ortgpu.copy_tensors(..., allow_cross_device=True))"
        )
    return None


def _staged_host(source: Endpoint, destination: Endpoint) -> None:
    _value(destination).update_inplace(_value(source).to_numpy())


def _from_host_array(source: Endpoint, destination: Endpoint) -> None:
    target = _value(destination)
    array = source.host("copy")
    if target.provenance.placement == "cpu":
        np.copyto(target.numpy(), array)
    else:
        target.update_inplace(np.ascontiguousarray(array))


def _install_core_routes() -> None:
    core = [
        Route("host-copy", frozenset({"cpu"}), frozenset({"cpu"}), _always, _host_copy, None, "ortgpu_core",
              "numpy copy between CPU values"),
        Route("upload", frozenset({"cpu"}), frozenset({"webgpu"}), _always, _upload, None, "ortgpu_core",
              "queue write of a CPU value into a device buffer"),
        Route("download", frozenset({"webgpu"}), frozenset({"cpu"}), _always, _download, _download_batch,
              "ortgpu_core", "read of a device buffer into a CPU value (one submission per device in a batch)"),
        Route("device-copy", frozenset({"webgpu"}), frozenset({"webgpu"}), _same_device, _device_copy,
              _device_copy_batch, "ortgpu_core",
              "buffer copy on one Device (same object); one command list per device in a batch"),
        Route("staged-host", frozenset({"webgpu"}), frozenset({"webgpu"}), _cross_device, _staged_host, None,
              "ortgpu_core", "read from one device, write to another; only with allow_cross_device=True"),
        Route("host-array", _HOST_SOURCES, frozenset({"cpu", "webgpu"}), _always, _from_host_array, None,
              "ortgpu_core", "numpy arrays and kDLCPU DLPack tensors (numpy.from_dlpack, no extra copy)"),
        Route("dlpack-host-copy", _DEVICE_DLPACK_KINDS, frozenset({"cpu", "webgpu"}), _always, _from_host_array,
              None, "ortgpu_core",
              "DLPack tensors in device memory: a host copy the producer makes (dl_device=(1, 0), copy=True); "
              "their device pointer is never read"),
    ]  # fmt: skip
    for route in core:
        register_route(route)


# -- foreign kinds --------------------------------------------------------------------------------------------
def register_foreign_kind(kind: ForeignKind) -> None:
    """Register a backend's foreign tensor kind and its three routes (``<kind>:download``, ``<kind>:upload``,
    ``<kind>:device-copy``), which call only the kind's own functions.  Registering the same object again does
    nothing; another object under a registered kind name is refused."""
    if not isinstance(kind, ForeignKind):
        raise ArgumentTypeError(f"register_foreign_kind needs a ForeignKind, got {type(kind).__name__}")
    reserved = {"cpu", "webgpu", "host-array"}
    if kind.kind in reserved or kind.kind.startswith("dlpack:"):
        raise InvalidArgumentError(f"the kind name {kind.kind!r} is reserved for ortgpu's own kinds")
    with _lock:
        existing = _foreign.get(kind.kind)
        if existing is kind:
            return
        if existing is not None:
            raise InvalidArgumentError(f"another foreign kind named {kind.kind!r} is already registered")
        _foreign[kind.kind] = kind
        name = kind.kind

        def download(source: Endpoint, destination: Endpoint) -> None:
            np.copyto(_value(destination).numpy(), kind.read(source.obj))

        def upload(source: Endpoint, destination: Endpoint) -> None:
            array = _value(source).numpy() if isinstance(source.obj, OrtValue) else source.host("copy")
            kind.write(destination.obj, array)

        def device_copy(source: Endpoint, destination: Endpoint) -> None:
            kind.copy(source.obj, destination.obj)

        def same_device(source: Endpoint, destination: Endpoint, allow_cross_device: bool) -> str | None:
            if source.device is not destination.device:
                return f"the {name} tensors are on different devices; copy through a CPU value"
            return None

        for route in (
            Route(f"{name}:download", frozenset({name}), frozenset({"cpu"}), _always, download, None, name,
                  f"{name}'s own copy to the host, into a CPU value"),
            Route(f"{name}:upload", frozenset({"cpu", *_HOST_SOURCES}), frozenset({name}), _always, upload, None,
                  name, f"{name}'s own copy from host memory"),
            Route(f"{name}:device-copy", frozenset({name}), frozenset({name}), same_device, device_copy, None,
                  name, f"{name}'s own copy between two tensors of one device"),
        ):  # fmt: skip
            register_route(route)


_install_core_routes()
