"""The one private write ortgpu makes into wgpu-native's memory, and the one function that allows it.

wgpu-native 29's command buffer object (the address a ``WGPUCommandBuffer`` holds is Rust's ``Arc`` data pointer) is
``{context: Arc<Global>, id: CommandBufferId, open: AtomicBool}``, with the ``Arc``'s strong and weak counts in the
16 bytes before it.  Its ``wgpuQueueSubmit`` sets ``open`` (byte 16), and its release drops the command buffer from
wgpu-core's registry only when ``open`` is set: a command buffer released unsubmitted is never freed (tens of KB
each on lavapipe; a captured graph released with a command buffer encoded ahead leaves one).  So before releasing a
command buffer it did not submit, the command loop (``_commands.pyx``, ``_release_unsubmitted``) sets that byte
itself, where :func:`submitted_flag_offset` says where it is.

That write depends on a private layout, so it is allowed only when all of these hold: the switch is on
(:data:`ENABLED`, or ``ORTGPU_UNSUBMITTED_FLAG_WRITE=0`` in the environment turns it off), the loaded wgpu-native is
a version whose layout was checked (:data:`KNOWN_MAJOR_VERSIONS`), and a probe on the first device opened in the
process sees exactly that byte go from 0 to 1 on a submit.  Otherwise the offset is -1: command buffers are released
as they are, and the wgpu device starts with encode-ahead off (nothing is then released unsubmitted but the rare
command buffer that failed validation).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from ._commands import CommandList, NativeTable
from ._wgpu_ffi import native_version

__all__ = ["ENABLED", "KNOWN_MAJOR_VERSIONS", "SUBMITTED_FLAG_OFFSET", "submitted_flag_offset", "probe_submitted_flag"]

#: The switch: False never writes into wgpu-native's command buffers (encode-ahead then starts off).
ENABLED = os.environ.get("ORTGPU_UNSUBMITTED_FLAG_WRITE", "1") != "0"
#: The wgpu-native major versions whose command buffer layout was checked (the one the package pins).
KNOWN_MAJOR_VERSIONS = frozenset({"29"})
#: Where the flag lies in a known version's command buffer object.
SUBMITTED_FLAG_OFFSET = 16

_probed: int | None = None  # the probe's answer for this process (-1: another layout); None: not probed yet
_probed_lock = threading.Lock()


def submitted_flag_offset(probe: Callable[[], int]) -> int:
    """The offset at which the command loop may set wgpu-native's "submitted" flag before releasing a command buffer
    it did not submit, or -1 (never write).  ``probe`` (:func:`probe_submitted_flag` on an open device) runs once per
    process, and only when the switch is on and the version is known.

    Parameters
    ----------
    probe
        Checks the layout on a live device; returns :data:`SUBMITTED_FLAG_OFFSET` or -1.

    Returns
    -------
    int
        :data:`SUBMITTED_FLAG_OFFSET` where the write is allowed, else -1.
    """
    global _probed
    if not ENABLED or native_version().split(".")[0] not in KNOWN_MAJOR_VERSIONS:
        return -1
    with _probed_lock:
        if _probed is None:
            _probed = probe()
        return _probed


def probe_submitted_flag(ffi: Any, lib: Any, table: NativeTable, raise_pending: Callable[[str], None]) -> int:
    """Submit one empty command buffer (kept alive by an extra reference) and check that the submit changed exactly
    the expected byte, from 0 to 1, and that the object is an ``Arc``'s data (its strong count, in the 8 bytes 16
    before it, goes from 2 to 1 as ``submit_encoded`` releases one reference).

    Parameters
    ----------
    ffi, lib
        wgpu-native's cffi module (``load_native()``).
    table
        The device's command-loop table (its queue receives the empty submit).
    raise_pending
        The device's check for errors wgpu-native reported (called with what the device was doing).

    Returns
    -------
    int
        :data:`SUBMITTED_FLAG_OFFSET` when the layout is the expected one, else -1.
    """
    action = "opening the device (probing wgpu-native's command buffers)"
    address = CommandList().encode_native(table)
    raise_pending(action)
    if not address:
        return -1
    pointer = ffi.cast("WGPUCommandBuffer", address)
    data = ffi.cast("uint8_t *", address)
    strong = ffi.cast("uint64_t *", address - 16)
    size = SUBMITTED_FLAG_OFFSET + 8
    # void wgpuCommandBufferAddRef(WGPUCommandBuffer commandBuffer)
    lib.wgpuCommandBufferAddRef(pointer)
    try:
        counts_before = int(strong[0])
        before = bytes(ffi.buffer(data, size))
        table.submit_encoded(address)  # submits, then releases one reference
        after = bytes(ffi.buffer(data, size))
        counts_after = int(strong[0])
    finally:
        # void wgpuCommandBufferRelease(WGPUCommandBuffer commandBuffer)
        lib.wgpuCommandBufferRelease(pointer)
    raise_pending(action)
    changed = [i for i in range(size) if before[i] != after[i]]
    expected = (
        changed == [SUBMITTED_FLAG_OFFSET]
        and before[SUBMITTED_FLAG_OFFSET] == 0
        and after[SUBMITTED_FLAG_OFFSET] == 1
        and (counts_before, counts_after) == (2, 1)
    )
    return SUBMITTED_FLAG_OFFSET if expected else -1
