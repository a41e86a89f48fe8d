"""ortgpu.serve: one replica's ModelServer (no Ray) on both backends, and the Ray Serve deployment on a local
cluster (loopback only, started and stopped by the module's fixture): concurrent clients get their own rows back
from batched replays, HTTP JSON answers, a replica whose device is lost reports unhealthy and is replaced, a replica
killed mid-load costs no request silently (each gets its result or an error), an uncapturable model serves
uncaptured and says so."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgpu.serve import ModelServer, ReplicaFailedError
from ortgpu_core import InvalidArgumentError, ModelError

W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


def _model(einsum: bool = False) -> bytes:
    """y = relu(x @ W), x [N, 4]; ``einsum`` puts an Einsum (no WebGPU kernel: it runs on the CPU) in front."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    if einsum:
        nodes.insert(0, helper.make_node("Einsum", ["x0"], ["x"], equation="ij->ij"))
    graph = helper.make_graph(
        nodes,
        "serve",
        [helper.make_tensor_value_info("x0" if einsum else "x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W, 0)


# -- ModelServer ---------------------------------------------------------------------------------------------------


@pytest.fixture
def server(backend_name: str) -> Iterator[ModelServer]:
    s = ModelServer(_model(), buckets=(1, 2, 4), backend=backend_name)  # type: ignore[arg-type]
    yield s
    s.close()


def test_each_request_gets_its_own_rows(server: ModelServer) -> None:
    """Requests of 1-3 rows batched together, beyond the largest bucket too: padded, replayed, split back."""
    rng = np.random.default_rng(1)
    requests = [{"x": rng.standard_normal((k, 4)).astype(np.float32)} for k in (1, 3, 2, 1, 3, 1)]  # 11 rows
    answers = server.infer(requests)
    for request, answer in zip(requests, answers):
        assert set(answer) == {"y"}
        np.testing.assert_allclose(answer["y"], _expected(request["x"]), rtol=1e-5, atol=1e-6)
    status = server.status()
    assert status["captured"] and status["healthy"] and status["capture_error"] is None
    # replays of 4, 4 and 3 rows (the last padded into the bucket of 4)
    assert (status["requests"], status["rows"], status["batches"], status["padded_rows"]) == (6, 11, 3, 1)
    assert status["batch_fill"] == pytest.approx(11 / 12)


def test_invalid_requests_are_refused_and_change_nothing(server: ModelServer) -> None:
    good = {"x": np.ones((2, 4), np.float32)}
    for bad, message in (
        ({"z": np.ones((1, 4), np.float32)}, "missing \\['x'\\], unknown \\['z'\\]"),
        ({"x": np.ones((1, 5), np.float32)}, "must be \\[rows >= 1, 4\\]"),
        ({"x": np.ones((0, 4), np.float32)}, "must be \\[rows >= 1, 4\\]"),
        ({"x": np.ones((1, 4), np.complex64)}, "the model takes float32"),
        (["x"], "a request is a mapping"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            server.infer([good, bad])  # type: ignore[list-item]
    assert server.status()["requests"] == 0
    np.testing.assert_allclose(server.infer([good])[0]["y"], _expected(good["x"]), rtol=1e-5)
    # integers cast to the model's float (same kind is not required: int -> float is safe)
    ints = server.validate({"x": np.ones((1, 4), np.int64)})
    assert ints["x"].dtype == np.float32


def test_invalid_data_fails_its_request_alone(backend_name: str) -> None:
    """An index out of range (found by a kernel, on a captured replay too) fails that request with
    InvalidArgumentError; the batch's other requests are answered and the replica stays healthy."""
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("i", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    s = ModelServer(model, buckets=(1, 4), backend=backend_name)  # type: ignore[arg-type]
    try:
        assert s.status()["captured"]
        requests = [{"i": np.array([1, 2])}, {"i": np.array([15])}, {"i": np.array([9])}]
        with pytest.raises(InvalidArgumentError):
            s.infer(requests)
        answers = s.answer(requests)
        assert isinstance(answers[1], InvalidArgumentError)
        np.testing.assert_array_equal(answers[0]["y"], table[[1, 2]])  # type: ignore[index]
        np.testing.assert_array_equal(answers[2]["y"], table[[9]])  # type: ignore[index]
        s.check_health()
        with pytest.raises(InvalidArgumentError, match="outside int64"):
            s.validate({"i": np.array([2**64 - 1], np.uint64)})
    finally:
        s.close()


def test_a_lost_device_fails_the_batch_and_the_replica() -> None:
    """No result from a batch whose device work failed, none afterwards, and the health check says so (the fake
    backend's injected device loss)."""
    s = ModelServer(_model(), buckets=(1, 2), backend="fake")
    try:
        x = {"x": np.ones((1, 4), np.float32)}
        s.infer([x])
        s.check_health()
        s.inject_fault("lose_device_on_submit")
        with pytest.raises(ReplicaFailedError, match="no result"):
            s.infer([x, x])
        with pytest.raises(ReplicaFailedError, match="unhealthy: DeviceLostError"):
            s.check_health()
        with pytest.raises(ReplicaFailedError, match="awaits replacement"):
            s.infer([x])
        assert not s.status()["healthy"]
        with pytest.raises(InvalidArgumentError, match="fake backend"):
            s.inject_fault("melt")
    finally:
        s.close()


def test_a_model_that_cannot_be_captured_serves_uncaptured(backend_name: str) -> None:
    s = ModelServer(_model(einsum=True), buckets=(1, 2), backend=backend_name)  # type: ignore[arg-type]
    try:
        status = s.status()
        assert not status["captured"] and "Einsum" in status["capture_error"]
        x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_allclose(s.infer([{"x0": x}])[0]["y"], _expected(x), rtol=1e-5, atol=1e-6)
    finally:
        s.close()


def test_start_up_refusals_say_what_to_do(backend_name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="buckets must be positive"):
        ModelServer(_model(), buckets=(0, 2), backend=backend_name)  # type: ignore[arg-type]
    model = onnx.load_from_string(_model())
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "features"
    with pytest.raises(ModelError, match="give its row shape"):
        ModelServer(model.SerializeToString(), backend=backend_name)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="no inputs called"):
        ModelServer(_model(), backend=backend_name, row_shapes={"q": [4]})  # type: ignore[arg-type]
    s = ModelServer(model.SerializeToString(), buckets=(2,), backend=backend_name, row_shapes={"x": [4]})  # type: ignore[arg-type]
    try:
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(s.infer([{"x": x}])[0]["y"], _expected(x), rtol=1e-5)
    finally:
        s.close()


def _two_adapters() -> Any:
    """A fake backend declaring two adapters (the GPUs of a two-GPU host), as a picklable factory."""
    import functools

    from ortgpu_core.backends.fake import FakeBackend, FakeDeviceSpec

    spec = FakeDeviceSpec(vendor_id=0x10DE, device_id=0x2335, adapter_type="DiscreteGPU")
    return functools.partial(FakeBackend, devices=[spec, spec])


def test_a_server_runs_on_the_adapter_it_is_given() -> None:
    """``device`` picks ``env.devices[device % count]``: replica ranks spread over the adapters."""
    x = np.ones((2, 4), np.float32)
    for device, index in ((None, 0), (0, 0), (1, 1), (2, 0), (5, 1)):
        s = ModelServer(_model(), buckets=(2,), backend=_two_adapters(), device=device)
        try:
            assert s.status()["device_index"] == index and s.session.device is s.env.devices[index]
            np.testing.assert_allclose(s.infer([{"x": x}])[0]["y"], _expected(x), rtol=1e-5)
        finally:
            s.close()
    with pytest.raises(InvalidArgumentError, match="non-negative adapter index"):
        ModelServer(_model(), backend="fake", device=-1)


def test_servers_refuse_copies_serve_two_threads_and_clean_up_when_dropped() -> None:
    """Copy and pickle are refused (a server owns its session and buffers); two threads at once each get their own
    rows; a server dropped without close() leaves no device object behind."""
    import copy
    import gc
    import pickle
    import threading

    from ortgpu.serve._onnxruntime_server import OnnxruntimeServer
    from ortgpu_core import UnsafeAccessError

    backend = _two_adapters()()
    s = ModelServer(_model(), buckets=(1, 2), backend=lambda: backend)
    peer = OnnxruntimeServer(_model(), buckets=(1, 2))
    for target in (s, peer):
        with pytest.raises(UnsafeAccessError, match="cannot be copied"):
            copy.copy(target)
        with pytest.raises(UnsafeAccessError, match="cannot be copied"):
            copy.deepcopy(target)
        with pytest.raises(UnsafeAccessError, match="cannot be pickled"):
            pickle.dumps(target)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(40)]
    wrong: list[int] = []

    def client(servers: tuple[Any, ...], offset: int) -> None:
        for index in range(offset, len(inputs), 2):
            for server in servers:
                (answer,) = server.infer([{"x": inputs[index]}])
                if not np.allclose(answer["y"], _expected(inputs[index]), rtol=1e-5, atol=1e-6):
                    wrong.append(index)

    threads = [threading.Thread(target=client, args=((s, peer), offset)) for offset in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == [] and s.status()["requests"] == peer.status()["requests"] == 40
    assert backend.live_handles() > 0
    del s, peer, target, threads
    gc.collect()
    assert backend.live_handles() == 0


def test_a_trace_of_the_served_batches(server: ModelServer) -> None:
    server.profile()
    server.infer([{"x": np.ones((3, 4), np.float32)}])
    trace = json.loads(server.end_profile())
    assert any(event.get("cat") == "replay" for event in trace["traceEvents"])
    assert server.end_profile() == ""


# -- the Ray Serve deployment --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[int]:
    """A local Ray cluster with Serve on a free loopback port (yielded), shut down after the module."""
    import ray
    from ray import serve

    from ortgpu.serve._deployment import free_loopback_port, start_local

    port = free_loopback_port()
    start_local(port, num_cpus=4)
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


def _deploy(name: str, **options: Any) -> Any:
    from ray import serve

    from ortgpu.serve import application

    return serve.run(application(_model(), name=name, **options), name=name, route_prefix=f"/{name}")


def _call(handle: Any, x: np.ndarray) -> str:
    """One request: "ok" for a right answer, "wrong" for a wrong one, else the error's name."""
    try:
        y = handle.remote({"x": x}).result(timeout_s=60)["y"]
    except Exception as error:  # noqa: BLE001 - Ray wraps the replica's errors
        return type(error).__name__
    return "ok" if np.allclose(y, _expected(x), rtol=1e-5, atol=1e-6) else "wrong"


def test_the_ingress_is_chosen_when_ray_starts(cluster: int) -> None:
    """Ray runs (the module's cluster, with Serve's own proxy): asking for HAProxy now, or for an unknown ingress,
    is refused with what to do, and changes nothing."""
    from ortgpu.serve._deployment import start_local

    before = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY")
    with pytest.raises(InvalidArgumentError, match="chosen when Ray starts"):
        start_local(cluster, ingress="haproxy")
    with pytest.raises(InvalidArgumentError, match="'proxy' or 'haproxy'"):
        start_local(cluster, ingress="nginx")  # type: ignore[arg-type]
    assert os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == before
    handle = _deploy("after-refusals", backend="fake", buckets=(1,))
    assert _call(handle, np.ones((1, 4), np.float32)) == "ok"


def test_concurrent_clients_get_their_own_answers(cluster: int) -> None:
    """32 clients at once on two replicas (lavapipe): every answer is the client's own, and requests were batched."""
    handle = _deploy("concurrent", backend="wgpu", buckets=(1, 2, 4, 8), num_replicas=2, batch_wait_timeout_s=0.05)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda x: _call(handle, x), inputs))
    assert results == ["ok"] * 32
    statuses = {s["pid"]: s for s in (handle.status.remote().result() for _ in range(8))}
    assert all(s["captured"] for s in statuses.values())
    served = sum(s["requests"] for s in statuses.values())
    batches = sum(s["batches"] for s in statuses.values())
    assert batches < served  # some replays answered several clients


def test_http_json_on_the_loopback_address(cluster: int) -> None:
    _deploy("http", backend="fake", buckets=(1, 2))
    url = f"http://127.0.0.1:{cluster}/http"
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)

    def post(body: object) -> tuple[int, Any]:
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, body = post({"inputs": {"x": x.tolist()}})
    assert status == 200
    np.testing.assert_allclose(np.array(body["outputs"]["y"], np.float32), _expected(x), rtol=1e-5, atol=1e-6)
    status, body = post({"inputs": {"x": [[1.0, 2.0]]}})
    assert status == 400 and "must be [rows >= 1, 4]" in body["error"]
    status, body = post({"x": x.tolist()})
    assert status == 400 and '{"inputs"' in body["error"]


def _until(condition: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for Serve"
        time.sleep(0.2)


def test_a_lost_device_makes_the_replica_unhealthy_and_it_is_replaced(cluster: int) -> None:
    handle = _deploy("faults", backend="fake", buckets=(1, 2), health_check_period_s=0.5)
    x = np.ones((1, 4), np.float32)
    first = handle.status.remote().result()["pid"]
    handle.inject_fault.remote("lose_device_on_submit").result()
    outcomes = [_call(handle, x) for _ in range(3)]
    assert "wrong" not in outcomes and outcomes[0] == "RayTaskError(ReplicaFailedError)"
    _until(lambda: _call(handle, x) == "ok" and handle.status.remote().result()["pid"] != first)
    assert handle.status.remote().result()["healthy"]


def test_a_replica_killed_mid_load_loses_no_request_silently(cluster: int) -> None:
    """SIGKILL one of two replicas while 16 clients send requests: each request gets its right answer or an
    error, none a wrong one; Serve brings the replica back and every later request is answered."""
    handle = _deploy("killed", backend="fake", buckets=(1, 2, 4), num_replicas=2, health_check_period_s=0.5)
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    pids = {handle.status.remote().result()["pid"] for _ in range(16)}
    victim = min(pids)

    def client(index: int) -> list[str]:
        outcomes = []
        for _ in range(15):
            outcomes.append(_call(handle, x))
            if index == 0 and len(outcomes) == 5:
                os.kill(victim, signal.SIGKILL)
        return outcomes

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outcomes = [o for result in pool.map(client, range(16)) for o in result]
    assert len(outcomes) == 16 * 15 and "wrong" not in outcomes
    assert outcomes.count("ok") >= len(outcomes) // 2
    _until(
        lambda: victim not in {handle.status.remote().result()["pid"] for _ in range(8)} and _call(handle, x) == "ok"
    )
    assert all(_call(handle, x) == "ok" for _ in range(10))


def test_spread_replicas_take_one_adapter_each(cluster: int) -> None:
    """``devices="spread"`` on a host of two (fake) adapters: two replicas, one on each, both answering."""
    handle = _deploy("spread", backend=_two_adapters(), devices="spread", buckets=(1, 2), num_replicas=2)
    seen = {}
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        status = handle.status.remote().result()
        seen[status["pid"]] = status["device_index"]
    assert sorted(seen.values()) == [0, 1]
    x = np.ones((1, 4), np.float32)
    assert all(_call(handle, x) == "ok" for _ in range(8))


def test_an_uncapturable_model_serves_uncaptured_and_says_so(cluster: int) -> None:
    from ray import serve

    from ortgpu.serve import application

    handle = serve.run(application(_model(einsum=True), name="einsum", backend="fake", buckets=(1, 2)),
                       name="einsum", route_prefix="/einsum")  # fmt: skip
    status = handle.status.remote().result()
    assert not status["captured"] and "Einsum" in status["capture_error"] and status["runtime"] == "ortgpu"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(handle.remote({"x0": x}).result()["y"], _expected(x), rtol=1e-5)


def test_the_demo_command_serves_and_answers(backend_name: str) -> None:
    """``python -m ortgpu.serve --demo`` (the README's example): its own Ray and Serve, one HTTP request, stopped."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "ortgpu.serve", "--demo", "--backend", backend_name],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "serving the demo MLP at http://127.0.0.1:" in result.stdout and "captured" in result.stdout
    assert "with 3 rows: output [3, 64], max difference from numpy" in result.stdout


def test_bench_serve_reports_each_configuration(tmp_path: Any) -> None:
    """``python -m bench --serve``: one row per runtime x replicas x batching, requests answered, none failed (its
    own Ray cluster, in its own process)."""
    import subprocess
    import sys

    path = tmp_path / "serve.json"
    argv = ["--serve", "--model", "mlp16", "--backend", "fake", "--replicas", "1", "--batching", "on,off",
            "--serve-runtimes", "ortgpu,onnxruntime", "--clients", "2", "--seconds", "0.5", "--serve-warmup", "0",
            "--json", str(path)]  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "bench", *argv], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(path.read_text())["rows"]
    assert [(r["runtime"], r["replicas"], r["batching"]) for r in rows] == [
        ("ortgpu", 1, "on"), ("ortgpu", 1, "off"), ("onnxruntime", 1, "on"), ("onnxruntime", 1, "off")
    ]  # fmt: skip
    assert all(r["requests_per_s"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] for r in rows)
    assert rows[0]["captured"] and "| ortgpu | Fake WebGPU device" in result.stdout
    assert all(r["ingress"] == "proxy" for r in rows)
