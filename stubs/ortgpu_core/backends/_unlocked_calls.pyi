from types import TracebackType

from ._commands import NativeTable

DONE: int
NOT_SUBMITTED: int
WAIT_IDLE: int
CLOSING: int
LOST: int
MAP_FAILED: int

class NativeLock:
    def acquire(self, blocking: bool = True) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> NativeLock: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

class MapWait:
    @property
    def status(self) -> int: ...

class UnlockedCalls:
    def __init__(
        self,
        table: NativeTable,
        poll_lock: NativeLock,
        device: int,
        map_async: int,
        device_poll: int,
        queue_write: int,
        map_mode: int,
        callback_mode: int,
        lost_flag: int,
    ) -> None: ...
    blocking_polls: int
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def inflight(self) -> int: ...
    def copy_and_map(self, source: int, offset: int, staging: int, size: int, wait: MapWait) -> int: ...
    def staged_write(
        self,
        staging: int,
        mapped_range: int,
        unmap: int,
        data: int,
        size: int,
        target: int,
        offset: int,
        write_mode: int,
        map_size: int,
        wait: MapWait,
    ) -> int: ...
    def submit_encoded(self, command_buffer: int, sentinel: int) -> int: ...
    def submit_and_map(self, command_buffer: int, staging: int, size: int, wait: MapWait, sentinel: int) -> int: ...
    def lock_taken(self) -> None: ...
    def lock_released(self) -> None: ...
    def request_map(self, staging: int, size: int, wait: MapWait) -> None: ...
    def queue_write(self, buffer: int, offset: int, data: int, size: int) -> None: ...
    def try_enter_write(self) -> bool: ...
    def leave_write(self) -> None: ...
    def write_entered(self, buffer: int, offset: int, data: int, size: int) -> None: ...
    def read_mapped(
        self,
        staging: int,
        size: int,
        wait: MapWait,
        spin_seconds: float,
        nap_seconds: float,
        mapped_range: int,
        unmap: int,
        success: int,
        destination: int,
        count: int,
        offset: int,
        sentinel: int,
    ) -> int: ...
    def wait(self, wait: MapWait, spin_seconds: float, nap_seconds: float) -> int: ...
