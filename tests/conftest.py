"""Shared fixtures: the backends under test, one Env per backend, and a leak check.

Backends: both by default; ``--backend=fake`` / ``--backend=wgpu`` or
``ORTGPU_BACKEND=fake`` selects one.  Tests marked ``wgpu_only`` /
``fake_only`` are deselected (not skipped) when their backend is not selected.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Iterator

import pytest
from hypothesis import settings

import ortgpu_core

# In CI (``CI`` set by .ci/run) every hypothesis test replays derandomized examples, so a landing never hinges on
# luck; locally each run draws new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

ALL_BACKENDS = ("fake", "wgpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        action="store",
        default=os.environ.get("ORTGPU_BACKEND", "all"),
        choices=("all", *ALL_BACKENDS),
        help="device backend(s) to test: all (default), fake or wgpu; also $ORTGPU_BACKEND",
    )


def selected_backends(config: pytest.Config) -> tuple[str, ...]:
    choice = config.getoption("--backend")
    return ALL_BACKENDS if choice == "all" else (str(choice),)


def pytest_report_header(config: pytest.Config) -> str:
    """Name the peer the comparisons run against, and say so when it is older than the one they were validated with
    (onnxruntime 1.32: older ones lack newer opsets' kernels and differ on some edge cases, see
    ``tests/test_ops_elementwise.py``'s ``PEER_DEFECTS_BEFORE_VALIDATED``)."""
    import onnxruntime

    from tests.test_ops_elementwise import PEER_REQUIREMENT, PEER_TOO_OLD

    line = f"peer: onnxruntime {onnxruntime.__version__}"
    if PEER_TOO_OLD:
        line += f" (older than the one the comparisons with it were validated against: install {PEER_REQUIREMENT})"
    return line


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "wgpu_only: needs the wgpu-native backend")
    config.addinivalue_line("markers", "fake_only: needs the fake backend")
    # Values made through the default Env (ortvalue_from_numpy(..., "webgpu")) use the selected backend.
    backends = selected_backends(config)
    if len(backends) == 1:
        os.environ["ORTGPU_BACKEND"] = backends[0]
    if "wgpu" not in backends:
        # --backend=fake runs no wgpu test: a test that opens wgpu-native anyway fails, naming itself.
        from ortgpu_core.backends import wgpu_native

        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError(
                "this test uses wgpu-native under --backend=fake; mark it wgpu_only or use backend_name"
            )

        wgpu_native.WgpuBackend.__init__ = refuse  # type: ignore[method-assign,assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backends = selected_backends(config)
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend_name") if callspec else None
        if backend is not None and backend not in backends:
            drop.append(item)
        elif item.get_closest_marker("wgpu_only") and "wgpu" not in backends:
            drop.append(item)
        elif item.get_closest_marker("fake_only") and "fake" not in backends:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_ENVS: dict[str, ortgpu_core.Env] = {}


def shared_env(backend_name: str) -> ortgpu_core.Env:
    """One Env per backend for the whole run (opening a lavapipe device is slow)."""
    env = _ENVS.get(backend_name)
    if env is None or env.closed:
        env = _ENVS[backend_name] = ortgpu_core.Env(backend=backend_name)
    return env


@pytest.fixture(params=ALL_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def owned_handles(environment: ortgpu_core.Env) -> int:
    """Native objects alive on ``environment``'s backend that someone owns, i.e. not counting the
    compute pipelines that sessions cache per device (shared by every session on the device and kept
    for the device's lifetime, so a test that compiles a kernel first has not leaked it)."""
    from ortgpu import _device_caches

    with _device_caches._pipeline_caches_guard:
        cached = sum(
            len(cache)
            for backend_device, cache in list(_device_caches._pipeline_caches.items())
            if getattr(backend_device, "_backend", None) is environment.backend
        )
    return int(environment.live_handles()) - cached


@pytest.fixture
def env(backend_name: str) -> Iterator[ortgpu_core.Env]:
    """The run's Env of this backend; fails the test if it leaked native objects."""
    environment = shared_env(backend_name)
    gc.collect()
    before = owned_handles(environment)
    yield environment
    gc.collect()
    after = owned_handles(environment) if not environment.closed else before
    if after != before:
        describe = getattr(environment.backend, "describe_live_handles", None)
        live = "\n  ".join(describe()) if describe is not None else "(no description)"
        buffers = [o for o in gc.get_objects() if isinstance(o, ortgpu_core.DeviceBuffer) and not o.released]
        live += "\n unreleased DeviceBuffer objects:\n  " + "\n  ".join(
            f"{b!r} held by {sorted({type(r).__name__ for r in gc.get_referrers(b)})}" for b in buffers
        )
        raise AssertionError(
            f"test leaked {after - before} native object(s) on the {backend_name} backend; live now:\n  {live}"
        )


@pytest.fixture
def device(env: ortgpu_core.Env) -> ortgpu_core.Device:
    return env.default_device


@pytest.fixture(scope="module")
def wgpu_backend() -> Iterator[Any]:
    """A wgpu backend with its default settings, for the tests of the raw wgpu device (wgpu only)."""
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    instance = WgpuBackend()
    yield instance
    instance.close()


@pytest.fixture
def wgpu_device(wgpu_backend: Any) -> Iterator[Any]:
    """A raw device of :func:`wgpu_backend` (its default adapter), destroyed after the test."""
    opened = wgpu_backend.open_device(wgpu_backend.default_adapter_index())
    yield opened
    opened.destroy()


@pytest.fixture(scope="module", params=[None, 300.0], ids=["default-wait", "spin-300us"])
def waiting_backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A wgpu backend with each way of waiting: the adapter's default (lavapipe: no spin) and a 300 us spin first
    (the GPU adapters' default: the poll loop in C without the GIL).  For the tests of waits (wgpu only)."""
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    instance = WgpuBackend(spin_wait_us=request.param)
    yield instance
    instance.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for environment in _ENVS.values():
        environment.close()
