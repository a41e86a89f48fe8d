from ._allocator import DeviceAllocator as DeviceAllocator
from ._allocator import SessionAllocator as SessionAllocator
from ._allocator import SharedAllocator as SharedAllocator
from ._env import Device as Device
from ._env import Env as Env
from ._env import get_env as get_env
from ._errors import *
from ._transfer import transfer as transfer
from ._transfer import transfer_route as transfer_route
from ._value import CPU as CPU
from ._value import DeviceBuffer as DeviceBuffer
from ._value import OrtValue as OrtValue
from ._value import Provenance as Provenance
from ._value import WebGPU as WebGPU

__all__: list[str]
