"""Types of ortgpu_core._transfer (hand-written; checked by stubtest)."""

from typing import Literal

from ._value import CPU, OrtValue, WebGPU

_Route = Literal["host-copy", "upload", "download", "device-copy", "staged-host"]

def transfer_route(
    source: OrtValue[CPU] | OrtValue[WebGPU], destination: OrtValue[CPU] | OrtValue[WebGPU]
) -> _Route: ...
def transfer(source: OrtValue[CPU] | OrtValue[WebGPU], destination: OrtValue[CPU] | OrtValue[WebGPU]) -> _Route: ...
