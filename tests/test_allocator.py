"""Shared and session allocators: ownership, closing, faults without leaks."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ortgpu_core as core
from ortgpu_core.backends.fake import FakeBackend


def test_session_allocator_close_releases_its_values(env: core.Env) -> None:
    allocator = core.SessionAllocator(env, env.default_device, 7)
    value = allocator.from_numpy(np.arange(3, dtype=np.float32))
    shared = env.shared_allocator().from_numpy(np.arange(3, dtype=np.float32))
    assert allocator.live_buffers() == 1
    allocator.close("session 7 closed")
    with pytest.raises(core.ReleasedValueError, match="session 7"):
        value.to_numpy()
    with pytest.raises(core.ReleasedValueError, match="closed"):
        allocator.empty((1,), "float32")
    np.testing.assert_array_equal(shared.to_numpy(), np.arange(3, dtype=np.float32))  # shared values outlive it


def test_dropping_a_value_frees_its_buffer(env: core.Env) -> None:
    before = env.live_handles()
    value = env.shared_allocator().empty((16,), "float32")
    assert env.live_handles() == before + 1
    del value
    gc.collect()
    assert env.live_handles() == before


def test_allocator_constructors(env: core.Env) -> None:
    with pytest.raises(TypeError, match="env.shared_allocator"):
        core.SharedAllocator()
    with pytest.raises(TypeError, match="session_id"):
        core.SessionAllocator(env, env.default_device, "x")  # type: ignore[arg-type]
    with core.Env(backend="fake") as other:
        with pytest.raises(core.ProvenanceError):
            core.SessionAllocator(env, other.default_device, 1)


def test_out_of_memory_is_typed_and_leaks_nothing() -> None:
    backend = FakeBackend()
    with core.Env(backend=backend) as env:
        keep = env.shared_allocator().empty((4,), "float32")
        backend.faults.out_of_memory_on_allocation(1)
        with pytest.raises(core.OutOfMemoryError) as raised:
            env.shared_allocator().empty((1024,), "float32")
        assert isinstance(raised.value, MemoryError)
        assert backend.live_handles() == 1
        again = env.shared_allocator().empty((1024,), "float32")  # the fault fired once
        del keep, again
        gc.collect()
        assert backend.live_handles() == 0


def test_device_lost_is_typed_and_leaks_nothing() -> None:
    backend = FakeBackend()
    env = core.Env(backend=backend)
    source = env.shared_allocator().from_numpy(np.ones(4, np.float32))
    target = env.shared_allocator().empty((4,), "float32")
    backend.faults.lose_device_on_submit(1)
    with pytest.raises(core.DeviceLostError):
        target.copy_from(source)  # a device copy is a submit
    with pytest.raises(core.DeviceLostError):
        source.to_numpy()
    env.close()
    assert backend.live_handles() == 0


def test_validation_fault_on_submit_changes_nothing() -> None:
    backend = FakeBackend()
    with core.Env(backend=backend) as env:
        source = env.shared_allocator().from_numpy(np.full(4, 2.0, np.float32))
        target = env.shared_allocator().from_numpy(np.zeros(4, np.float32))
        backend.faults.validation_error_on_submit(1)
        with pytest.raises(core.ValidationError):
            target.copy_from(source)
        np.testing.assert_array_equal(target.to_numpy(), np.zeros(4, np.float32))
        target.copy_from(source)
        np.testing.assert_array_equal(target.to_numpy(), np.full(4, 2.0, np.float32))
        del source, target


def test_values_in_garbage_cycles_are_freed(env: core.Env) -> None:
    """A value reachable only from a reference cycle (say, kept by an exception's traceback) is freed by the
    collector: the buffer keeps its device until its destructor has released the native buffer."""
    before = env.live_handles()

    class Holder:
        pass

    for _ in range(50):
        holder = Holder()
        holder.me = holder  # type: ignore[attr-defined]
        holder.value = env.shared_allocator().empty((4,), "float32")  # type: ignore[attr-defined]
        holder.buffer = holder.value._device_buffer  # type: ignore[attr-defined]
        del holder
    gc.collect()
    assert env.live_handles() == before


def test_value_created_in_a_refused_call_is_freed(env: core.Env) -> None:
    """The H200 case: a value created inside a call that raises lives on in the traceback's frames."""
    before = env.live_handles()
    for _ in range(10):
        try:
            env.shared_allocator().empty((2,), "float32").update_inplace(np.zeros(3, np.float32))
        except core.ShapeError as error:
            saved = error  # the traceback (and its frames) stay reachable from the exception
            saved.__traceback__  # noqa: B018
    del saved
    gc.collect()
    assert env.live_handles() == before
