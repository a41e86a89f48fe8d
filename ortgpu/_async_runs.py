"""Runs in worker threads: ``InferenceSession.run_async`` in both of its spellings (asyncio, onnxruntime's callback).

The worker threads are made on first use and shared by every session; a session's runs stay serialized by the
session itself, so the pool only bounds how many runs wait at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Awaitable, Callable, TypeVar

from ortgpu_core import ArgumentTypeError

__all__ = ["RunAsyncCallback", "start_run_async"]

_UserData = TypeVar("_UserData")
#: onnxruntime's ``run_async`` callback: ``callback(results, user_data, error)``.
RunAsyncCallback = Callable[[Any, _UserData, Any], None]

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_guard = threading.Lock()


def _run_async_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_guard:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="ortgpu-run-async"
            )
        return _pool


def start_run_async(
    run: Callable[[], list[Any]], callback: RunAsyncCallback[Any] | None, user_data: Any
) -> Awaitable[list[Any]] | None:
    """Start ``run()`` in a worker thread.

    Parameters
    ----------
    run
        The run, its arguments bound.
    callback
        None: return an awaitable of ``run()``'s results (a running event loop is required).  Else onnxruntime's
        callback, called from the worker as ``callback(results, user_data, "")`` or, when the run raised,
        ``callback(None, user_data, error)``.
    user_data
        Passed through to ``callback``.

    Returns
    -------
    Awaitable or None
        The awaitable when ``callback`` is None, else None at once.
    """
    pool = _run_async_pool()
    if callback is None:
        return asyncio.get_running_loop().run_in_executor(pool, run)
    if not callable(callback):
        raise ArgumentTypeError(f"callback must be callable (results, user_data, error), got {type(callback).__name__}")

    def work() -> None:
        try:
            results = run()
        except Exception as error:  # delivered to this caller's callback only
            callback(None, user_data, error)
            return
        callback(results, user_data, "")

    pool.submit(work)
    return None
