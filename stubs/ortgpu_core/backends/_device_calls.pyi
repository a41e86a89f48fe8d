MAP_CALLBACK_INFO_SIZE: int
MAP_CALLBACK: int
WORK_DONE_CALLBACK: int
COMPLETION_MAP: int
COMPLETION_WORK_DONE: int

def spin_poll(device_poll: int, device: int, flag: int, seconds: float) -> int: ...
def map_read(
    map_async: int,
    buffer: int,
    mode: int,
    size: int,
    callback_mode: int,
    callback: int,
    token: int,
    userdata2: int = 0,
) -> None: ...
def copy_out(mapped_range: int, unmap: int, buffer: int, size: int, regions: list[tuple[int, int, int]]) -> bool: ...

class Completions:
    @property
    def address(self) -> int: ...
    @property
    def fired_address(self) -> int: ...
    @property
    def fired(self) -> bool: ...
    @property
    def pending(self) -> int: ...
    def clear_fired(self) -> None: ...
    def take(self) -> list[tuple[int, int, int, str]]: ...
