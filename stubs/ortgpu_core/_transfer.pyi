"""Types of ortgpu_core._transfer (hand-written; checked by stubtest)."""

from typing import Sequence

from ._routes import Route

# Sources: OrtValues, numpy arrays, DLPack tensors, tensors of registered foreign kinds; destinations: OrtValues and
# tensors of registered foreign kinds.  Route names: "host-copy", "upload", "download", "device-copy",
# "staged-host", "host-array", "dlpack-host-copy", "<foreign kind>:download|upload|device-copy", and any a backend
# registers.
def transfer_route(source: object, destination: object, allow_cross_device: bool = False) -> str: ...
def transfer(source: object, destination: object, allow_cross_device: bool = False) -> str: ...
def copy_tensors(
    sources: Sequence[object], destinations: Sequence[object], allow_cross_device: bool = False
) -> list[str]: ...
def transfer_routes() -> list[Route]: ...
