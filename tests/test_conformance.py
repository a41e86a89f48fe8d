"""ONNX backend node tests on the wgpu (lavapipe) device, through the executor.

Every node test of ``onnx.backend.test`` whose operators are all in
:data:`SUPPORTED` runs through :func:`ortgpu._executor.run_model` on one
device with one shared :class:`PipelineCache`, and is compared with the
case's expected outputs under the case's tolerances (rtol 1e-3 / atol 1e-7
by default, as onnx's backend runner does).  Cases listed in
``conformance_exclusions.txt`` must fail *clearly*: with ``UnsupportedOpError``
or ``ModelError``.

As a pytest module it runs on the wgpu backend (``wgpu_only``); set
``ORTGPU_CONFORMANCE_SHARD=i/n`` to run one shard of the cases.  As a script,
``python tests/test_conformance.py [-j N]`` runs every case in ``N`` worker
processes (one device each), prints the per-operator table and writes it to
``tests/conformance_report.txt``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

from ortgpu_core._errors import ModelError  # noqa: E402

SUPPORTED = frozenset(
    """Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu Sigmoid Tanh Erf Gelu HardSigmoid
    HardSwish Clip Where Equal Less Greater Not Cast MatMul Gemm Conv ConvTranspose MaxPool AveragePool
    GlobalAveragePool BatchNormalization Softmax LogSoftmax LayerNormalization ReduceMean ReduceSum ReduceMax
    ReduceMin Reshape Transpose Concat Split Slice Gather Unsqueeze Squeeze Flatten Expand Tile Shape
    ConstantOfShape Constant Identity Range""".split()
)
EXCLUSIONS_PATH = os.path.join(HERE, "conformance_exclusions.txt")
REPORT_PATH = os.path.join(HERE, "conformance_report.txt")
_NUMPY_DTYPES = frozenset(
    np.dtype(n)
    for n in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
)


@functools.lru_cache(maxsize=1)
def supported_cases() -> dict[str, Any]:
    """name -> onnx TestCase, for every node test whose operators are all supported."""
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_node_model_tests()
    selected = {}
    for case in cases:
        ops = {node.op_type for node in case.model.graph.node}
        domains = {node.domain for node in case.model.graph.node}
        if ops <= SUPPORTED and domains <= {"", "ai.onnx"}:
            selected[case.name] = case
    return selected


def as_array(value: Any) -> Any:
    """A case's input or output as numpy (cases store some as TensorProto); sequences stay as they are."""
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def numpy_dtypes_only(case: Any) -> bool:
    """Whether every input and expected output is a numpy array of a standard dtype."""
    for inputs, outputs in case.data_sets:
        for value in list(inputs) + list(outputs):
            value = as_array(value)
            if not isinstance(value, np.ndarray) or value.dtype not in _NUMPY_DTYPES:
                return False
    return True


def primary_op(case: Any) -> str:
    """The operator a case tests, from its name (``test_reduce_mean_...`` -> ReduceMean)."""
    key = case.name[len("test_"):].replace("_", "").lower()
    best = ""
    for op in SUPPORTED:
        if key.startswith(op.lower()) and len(op) > len(best):
            best = op
    return best or case.model.graph.node[0].op_type


def load_exclusions() -> dict[str, str]:
    """``name -> reason`` from ``conformance_exclusions.txt`` (``name  reason`` per line, ``#`` comments)."""
    exclusions = {}
    if os.path.exists(EXCLUSIONS_PATH):
        with open(EXCLUSIONS_PATH) as handle:
            for line in handle:
                line = line.split("#", 1)[0].strip()
                if line:
                    name, _, reason = line.partition(" ")
                    exclusions[name] = reason.strip()
    return exclusions


@dataclass
class CaseResult:
    name: str
    op: str
    status: str  # "pass", "fail" (wrong values), "error" (exception), "unsupported" (clear ModelError)
    on_webgpu: bool
    message: str = ""
    seconds: float = 0.0


def compare(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> str:
    """"" when ``actual`` matches ``expected`` as onnx's backend runner checks it, else why not."""
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    try:
        if expected.dtype.kind in "fc":
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(actual, expected)
    except AssertionError as error:
        return " ".join(str(error).split())[:300]
    return ""


def run_case(case: Any, device: Any, cache: Any) -> CaseResult:
    from ortgpu._executor import run_model
    from ortgpu._model import load_model

    start = time.perf_counter()
    op = primary_op(case)
    on_webgpu = True
    try:
        loaded = load_model(case.model)
        for inputs, expected in case.data_sets:
            feeds = {name: as_array(value) for name, value in zip(loaded.input_names, inputs)}
            with np.errstate(all="ignore"):
                outputs, plan = run_model(loaded, feeds, device, pipeline_cache=cache)
            on_webgpu = on_webgpu and plan.capturable
            for name, want, got in zip(loaded.output_names, expected, outputs):
                problem = compare(np.asarray(as_array(want)), got, case.rtol, case.atol)
                if problem:
                    return CaseResult(case.name, op, "fail", on_webgpu, f"{name}: {problem}", time.perf_counter() - start)
    except ModelError as error:
        return CaseResult(case.name, op, "unsupported", False, f"{type(error).__name__}: {error}", time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 - reported per case
        message = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        return CaseResult(case.name, op, "error", False, message, time.perf_counter() - start)
    return CaseResult(case.name, op, "pass", on_webgpu, "", time.perf_counter() - start)


def report(results: list[CaseResult], seconds: float, workers: int) -> str:
    by_op: dict[str, list[CaseResult]] = {}
    for result in results:
        by_op.setdefault(result.op, []).append(result)
    exclusions = load_exclusions()
    lines = [f"{'operator':22s} {'cases':>5s} {'pass':>5s} {'webgpu':>6s} {'excl':>5s} {'fail':>5s}"]
    for op in sorted(by_op):
        group = by_op[op]
        passed = sum(r.status == "pass" for r in group)
        webgpu = sum(r.status == "pass" and r.on_webgpu for r in group)
        excluded = sum(r.name in exclusions for r in group)
        failed = sum(r.status != "pass" and r.name not in exclusions for r in group)
        lines.append(f"{op:22s} {len(group):5d} {passed:5d} {webgpu:6d} {excluded:5d} {failed:5d}")
    total = len(results)
    passed = sum(r.status == "pass" for r in results)
    webgpu = sum(r.status == "pass" and r.on_webgpu for r in results)
    excluded = sum(r.name in exclusions for r in results)
    lines.append(
        f"{'TOTAL':22s} {total:5d} {passed:5d} {webgpu:6d} {excluded:5d} {total - passed - excluded:5d}"
    )
    lines.append("")
    lines.append(
        f"passed {passed}/{total} ({100.0 * passed / max(total, 1):.1f}%); wholly on WebGPU {webgpu} "
        f"({100.0 * webgpu / max(passed, 1):.1f}% of passing); excluded {excluded}; "
        f"runtime {seconds:.1f} s with {workers} worker(s)"
    )
    problems = [r for r in results if r.status != "pass" and r.name not in exclusions]
    if problems:
        lines.append("")
        lines.append("failing cases not in the exclusions:")
        lines.extend(f"  {r.name} [{r.status}] {r.message}" for r in sorted(problems, key=lambda r: r.name))
    cpu = [r for r in results if r.status == "pass" and not r.on_webgpu]
    if cpu:
        lines.append("")
        lines.append("passing with CPU nodes: " + " ".join(sorted(r.name for r in cpu)))
    return "\n".join(lines) + "\n"


# -- pytest --------------------------------------------------------------------------------------


def _shard(names: list[str]) -> list[str]:
    spec = os.environ.get("ORTGPU_CONFORMANCE_SHARD", "")
    if not spec:
        return names
    index, count = (int(x) for x in spec.split("/"))
    return names[index::count]


def _case_names() -> list[str]:
    try:
        return _shard(sorted(supported_cases()))
    except Exception:  # noqa: BLE001 - onnx without its test data: nothing to parametrize
        return []


_RESULTS: list[CaseResult] = []


@pytest.fixture(scope="module")
def wgpu_device_and_cache() -> Iterator[tuple[Any, Any]]:
    from ortgpu._executor import PipelineCache
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    backend = WgpuBackend()
    device = backend.open_device(backend.default_adapter_index())
    cache = PipelineCache(device)
    start = time.perf_counter()
    yield device, cache
    cache.release()
    device.destroy()
    if len(_RESULTS) == len(supported_cases()):
        with open(REPORT_PATH, "w") as handle:
            handle.write(report(_RESULTS, time.perf_counter() - start, 1))


@pytest.mark.wgpu_only
@pytest.mark.parametrize("name", _case_names())
def test_node_case(name: str, wgpu_device_and_cache: tuple[Any, Any]) -> None:
    device, cache = wgpu_device_and_cache
    case = supported_cases()[name]
    result = run_case(case, device, cache)
    _RESULTS.append(result)
    exclusions = load_exclusions()
    if name in exclusions:
        assert result.status == "unsupported", (
            f"{name} is excluded ({exclusions[name]}) but did not raise a clear ModelError: {result.status} {result.message}"
        )
        return
    assert result.status == "pass", f"{name} [{result.status}]: {result.message}"


def test_exclusions_name_real_cases() -> None:
    cases = supported_cases()
    stale = [name for name in load_exclusions() if name not in cases]
    assert not stale, f"conformance_exclusions.txt names cases that are not supported node tests: {stale}"
    assert all(reason for reason in load_exclusions().values()), "every exclusion needs a one-line reason"


# -- script --------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _worker_init() -> None:
    from ortgpu._executor import PipelineCache
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    backend = WgpuBackend()
    device = backend.open_device(backend.default_adapter_index())
    _WORKER.update(backend=backend, device=device, cache=PipelineCache(device))
    supported_cases()


def _worker_run(name: str) -> CaseResult:
    return run_case(supported_cases()[name], _WORKER["device"], _WORKER["cache"])


def main(argv: list[str] | None = None) -> int:
    import multiprocessing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("-k", "--filter", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    names = [n for n in sorted(supported_cases()) if args.filter in n]
    start = time.perf_counter()
    if args.jobs <= 1:
        _worker_init()
        results = [_worker_run(n) for n in names]
    else:
        # Slow cases first so the pool drains evenly.
        context = multiprocessing.get_context("fork")
        with context.Pool(args.jobs, initializer=_worker_init) as pool:
            results = pool.map(_worker_run, names, chunksize=4)
    seconds = time.perf_counter() - start
    text = report(results, seconds, args.jobs)
    print(text)
    if not args.filter:
        with open(REPORT_PATH, "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
