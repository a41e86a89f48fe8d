"""Types of the compiled ``ortgpu_core.backends._commands`` (see ``_commands.pyx``)."""

from typing import Container, Final, Literal, final

from typing_extensions import Self

#: Record kinds, as stored in the C array.
DISPATCH: Final[int]
COPY: Final[int]
CLEAR: Final[int]
TIMESTAMP: Final[int]
RESOLVE: Final[int]
HANDLE_ADDRESS_MASK: Final[int]

_DispatchRecord = tuple[Literal["dispatch"], int, int, tuple[int, int, int]]
_CopyRecord = tuple[Literal["copy"], int, int, int, int, int]
_ClearRecord = tuple[Literal["clear"], int, int, int]
_TimestampRecord = tuple[Literal["timestamp"], int, int]
_ResolveRecord = tuple[Literal["resolve"], int, int, int, int, int]

@final
class NativeTable:
    """wgpu-native entry points and the device/queue they act on, as raw addresses."""

    def __init__(self, device: int, queue: int, addresses: dict[str, int], error_count: int = 0) -> None:
        """``addresses`` maps each name of :meth:`entry_point_names` to a function address;
        ``error_count`` is the address of a ``uint32_t`` the device's error callback increments (0: none)."""

    @staticmethod
    def entry_point_names() -> tuple[str, ...]: ...
    def submit_encoded(self, command_buffer: int) -> None:
        """Submit a command buffer from CommandList.encode_native and release it."""
    def release_encoded(self, command_buffer: int) -> None:
        """Release a command buffer from CommandList.encode_native without submitting it."""
    @property
    def submitted_flag_offset(self) -> int:
        """The offset of wgpu-native's "submitted" flag in its command buffer object (-1: unknown)."""
    @submitted_flag_offset.setter
    def submitted_flag_offset(self, offset: int) -> None: ...
    @property
    def timestamps_in_passes(self) -> bool:
        """Whether timestamp records inside a run of dispatches are written in the open compute pass."""
    @timestamps_in_passes.setter
    def timestamps_in_passes(self, value: bool) -> None: ...
    @property
    def timestamps_open_pass(self) -> bool:
        """Whether a timestamp record with no compute pass open begins one and is written inside it."""
    @timestamps_open_pass.setter
    def timestamps_open_pass(self, value: bool) -> None: ...

@final
class CommandList:
    """An ordered list of copies, clears, dispatches, timestamp writes and query resolves over integer handles."""

    def __init__(self) -> None: ...
    def add_dispatch(self, pipeline: int, bind_group: int, x: int, y: int = 1, z: int = 1) -> None: ...
    def add_copy(
        self, source: int, source_offset: int, destination: int, destination_offset: int, size: int
    ) -> None: ...
    def add_clear(self, buffer: int, offset: int, size: int) -> None: ...
    def add_timestamp(self, query_set: int, index: int) -> None: ...
    def add_resolve(
        self, query_set: int, first: int, count: int, destination: int, destination_offset: int
    ) -> None: ...
    def without_queries(self) -> CommandList: ...
    def extend(self, other: CommandList) -> None: ...
    def freeze(self) -> Self: ...
    @property
    def frozen(self) -> bool: ...
    @property
    def early_submit(self) -> int: ...
    @early_submit.setter
    def early_submit(self, dispatches: int) -> None: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
    @property
    def dispatch_count(self) -> int: ...
    @property
    def query_count(self) -> int: ...
    def written_among(self, bind_group_writes: dict[int, tuple[int, ...]], watched: Container[int]) -> set[int]:
        """The handles in ``watched`` that the records may write (bind groups' writable buffers, copy, clear and
        resolve destinations)."""
    def records(
        self,
    ) -> list[_DispatchRecord | _CopyRecord | _ClearRecord | _TimestampRecord | _ResolveRecord]: ...
    def encode_submit_with_tail_native(self, table: NativeTable, tail: CommandList) -> bool: ...
    def encode_native(self, table: NativeTable, tail: CommandList | None = None) -> int:
        """Encode the records (then tail's) into one unsubmitted command buffer; its address, or 0."""
    def encode_submit_native(self, table: NativeTable) -> bool:
        """Encode and submit with the GIL released; ``False`` if the command buffer was not submitted."""
    def profile_native(self, table: NativeTable) -> dict[str, float | bool]:
        """Like encode_submit_native, with the seconds of its phases (encode, finish, submit)."""
