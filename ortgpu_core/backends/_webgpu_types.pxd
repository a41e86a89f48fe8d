# The webgpu.h types and entry-point signatures that the C parts of the wgpu backend pass by value or call through
# function pointers (_device_calls, _unlocked_calls).  Layouts are checked against cffi's view of the installed
# header by the wgpu backend's tests (MAP_CALLBACK_INFO_SIZE, WORK_DONE_CALLBACK_INFO_SIZE).
from libc.stdint cimport uint32_t, uint64_t

# WGPUStringView: a pointer and a length (SIZE_MAX: NUL-terminated)
ctypedef struct StringView:
    const char* data
    size_t length

# WGPUBufferMapCallbackInfo
ctypedef struct MapCallbackInfo:
    void* nextInChain
    uint32_t mode
    void* callback
    void* userdata1
    void* userdata2

# WGPUFuture
ctypedef struct Future:
    uint64_t id

# WGPUBool wgpuDevicePoll(WGPUDevice device, WGPUBool wait, WGPUSubmissionIndex const * submissionIndex)
ctypedef uint32_t (*device_poll_fn)(void*, uint32_t, const void*) noexcept nogil
# WGPUFuture wgpuBufferMapAsync(WGPUBuffer, WGPUMapMode, size_t offset, size_t size, WGPUBufferMapCallbackInfo)
ctypedef Future (*map_async_fn)(void*, uint64_t, size_t, size_t, MapCallbackInfo) noexcept nogil
# void const * wgpuBufferGetConstMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
ctypedef const void* (*mapped_range_fn)(void*, size_t, size_t) noexcept
# void wgpuBufferUnmap(WGPUBuffer buffer)
ctypedef void (*unmap_fn)(void*) noexcept
