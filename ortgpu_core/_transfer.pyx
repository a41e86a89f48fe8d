# cython: language_level=3
"""Transfers between values, routed by placement, device identity and Env.

A route is chosen from the two values' provenance, never from Python wrapper
types or from (vendor_id, device_id) alone: the Vulkan and OpenGL adapters of
one GPU, or two Envs' devices on the same adapter, share their numbers but not
their memory.

==============================  ===========================  =================
source -> destination           condition                    route
==============================  ===========================  =================
cpu -> cpu                                                    ``host-copy``
cpu -> webgpu                                                 ``upload``
webgpu -> cpu                                                 ``download``
webgpu -> webgpu                same Device object            ``device-copy``
webgpu -> webgpu                other Device, same Env        ``staged-host``
webgpu -> webgpu                different Env                 ProvenanceError
==============================  ===========================  =================

``device-copy`` is a buffer copy recorded on its own command list and
submitted at once, so it is ordered after earlier submitted work (a session's
run) and before later work on the device's queue.
"""

import numpy as np

from ._value cimport OrtValue, DeviceBuffer
from ._errors import ArgumentTypeError, DtypeError, ProvenanceError, ShapeError, TransferRoutingError
from .backends._commands import CommandList
from ._value import padded_size


def transfer_route(source, destination):
    """The name of the route :func:`transfer` would take (see the module table), or raise."""
    if not isinstance(source, OrtValue) or not isinstance(destination, OrtValue):
        raise ArgumentTypeError(
            f"transfers are between OrtValues, got {type(source).__name__} -> {type(destination).__name__}; "
            f"wrap arrays with OrtValue.ortvalue_from_numpy(array)"
        )
    src = (<OrtValue>source).provenance
    dst = (<OrtValue>destination).provenance
    if src.placement == "cpu" and dst.placement == "cpu":
        return "host-copy"
    if src.placement == "cpu" and dst.placement == "webgpu":
        return "upload"
    if src.placement == "webgpu" and dst.placement == "cpu":
        return "download"
    if src.placement == "webgpu" and dst.placement == "webgpu":
        if src.env_id != dst.env_id:
            raise ProvenanceError(
                f"cannot copy {src.describe()} into {dst.describe()}: they belong to different Envs, whose "
                f"devices share no memory or queue; copy through the host with destination.update_inplace(source.to_numpy())"
            )
        if src.device is dst.device:
            return "device-copy"
        return "staged-host"
    raise TransferRoutingError(f"no transfer route from placement {src.placement!r} to {dst.placement!r}")


def transfer(source, destination):
    """Copy ``source`` into ``destination`` (same dtype and shape), routed as :func:`transfer_route` says."""
    route = transfer_route(source, destination)
    cdef OrtValue src = <OrtValue>source
    cdef OrtValue dst = <OrtValue>destination
    if src is dst:
        src._check_usable("copy the value onto itself")
        return route  # copying a value onto itself changes nothing (and WebGPU forbids a buffer copy onto itself)
    src._check_usable("copy from the value")
    dst._check_usable("copy into the value")
    if src._dtype != dst._dtype:
        raise DtypeError(
            f"cannot copy dtype {src._dtype} into dtype {dst._dtype}: ortgpu never casts silently; "
            f"cast on the host and use update_inplace(array.astype({str(dst._dtype)!r}))"
        )
    if src._shape != dst._shape:
        raise ShapeError(f"cannot copy shape {list(src._shape)} into shape {list(dst._shape)}; the shapes must match")
    if route == "host-copy":
        np.copyto(dst._array, src._array)
    elif route == "upload":
        dst.update_inplace(src._array)
    elif route == "download":
        np.copyto(dst._array, src.to_numpy())
    elif route == "staged-host":
        dst.update_inplace(src.to_numpy())
    else:
        if src._nbytes == 0:
            return route
        commands = CommandList()
        commands.add_copy(src._buffer.handle, 0, dst._buffer.handle, 0, padded_size(src._nbytes))
        dst._buffer.device._backend_device.submit(commands)
    return route
