# cython: language_level=3
"""Transfers between values, routed by the route table of :mod:`ortgpu_core._routes`.

A route is chosen from the two ends' kind and provenance (device object identity, Env), never from Python
wrapper types or from (vendor_id, device_id) alone: the Vulkan and OpenGL adapters of one GPU, or two Envs'
devices on the same adapter, share their numbers but not their memory.  See :mod:`ortgpu_core._routes` for the
table; :func:`transfer_routes` lists it.
"""

from ._routes import copy_tensors as _copy_tensors
from ._routes import endpoint, run_transfer, select_route
from ._routes import transfer_routes as _transfer_routes


def transfer_route(source, destination, allow_cross_device=False):
    """The name of the route :func:`transfer` would take, or raise ``TransferRoutingError`` naming both ends."""
    return select_route(endpoint(source), endpoint(destination), bool(allow_cross_device)).name


def transfer(source, destination, allow_cross_device=False):
    """Copy ``source`` into ``destination`` (same dtype and shape), routed as :func:`transfer_route` says;
    returns the route's name."""
    return run_transfer(source, destination, bool(allow_cross_device), "copy")


def copy_tensors(sources, destinations, allow_cross_device=False):
    """Copy ``sources[i]`` into ``destinations[i]`` as one batch, validated as a whole before any copy (routes,
    dtypes, shapes, no destination written twice or read by another pair), then run in as few submissions as
    the routes allow.  Returns each pair's route name; a refused batch changes nothing."""
    return _copy_tensors(sources, destinations, bool(allow_cross_device))


def transfer_routes():
    """The route table (:class:`ortgpu_core._routes.Route` objects), core routes first."""
    return _transfer_routes()
