"""ONNX backend node tests on the wgpu (lavapipe) device, through the public InferenceSession.

Every node test of ``onnx.backend.test`` whose operators are all in
:data:`SUPPORTED` runs the way a user runs a model: ``ortgpu.InferenceSession(
model_bytes, env=env, device=env.default_device)`` and ``sess.run(None, feeds)``
on each of the case's data sets, one :class:`~ortgpu.Env` for the whole run and
the session closed after each case.  Outputs are compared with the case's
expected outputs under the case's tolerances (rtol 1e-3 / atol 1e-7 by
default, as onnx's backend runner does), and ``sess.get_node_placement`` says
whether the case ran wholly on WebGPU.

*Counted* cases are those whose inputs and outputs numpy can hold (the other
dtypes -- bfloat16, float8, int4, strings -- and sequences are outside ortgpu's
scope; they must still fail clearly).  Every counted case must pass except
those in ``conformance_exclusions.txt`` (name and reason per line), and at
least :data:`MIN_WEBGPU_SHARE` of the counted cases must run wholly on WebGPU.
An excluded or out-of-scope case must fail *clearly*: with
``UnsupportedOpError`` or another ``ModelError``.

As a pytest module (``wgpu_only``) there is one test per case plus
:func:`test_conformance_summary`, which runs whatever cases did not run yet,
asserts the totals, prints the per-operator table and writes it under pytest's temporary folder (never into the
source tree).  Set ``ORTGPU_CONFORMANCE_SHARD=i/n`` to run
one shard of the per-case tests.  As a script, ``python
tests/test_conformance.py [-j N] [-k FILTER]`` runs the cases in ``N`` worker
processes (one Env each), prints the table and writes the committed report, ``tests/conformance_report.txt``.
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

from ortgpu._model import _NUMPY_DTYPES  # noqa: E402 - the dtypes numpy (and so ortgpu) can hold
from ortgpu_core._errors import ModelError  # noqa: E402

SUPPORTED = frozenset(
    """Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu Sigmoid Tanh Erf Gelu HardSigmoid
    HardSwish Clip Where Equal Less Greater Not Cast MatMul Gemm Conv ConvTranspose MaxPool AveragePool
    GlobalAveragePool BatchNormalization Softmax LogSoftmax LayerNormalization ReduceMean ReduceSum ReduceMax
    ReduceMin Reshape Transpose Concat Split Slice Gather Unsqueeze Squeeze Flatten Expand Tile Shape
    ConstantOfShape Constant Identity Range""".split()
)
#: The share of counted cases that must run wholly on WebGPU (issue 3).
MIN_WEBGPU_SHARE = 0.90
EXCLUSIONS_PATH = os.path.join(HERE, "conformance_exclusions.txt")
REPORT_PATH = os.path.join(HERE, "conformance_report.txt")


@functools.lru_cache(maxsize=1)
def supported_cases() -> dict[str, Any]:
    """name -> onnx TestCase, for every node test whose operators are all supported."""
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = loader.load_node_model_tests()
    selected = {}
    for case in cases:
        ops = {node.op_type for node in case.model.graph.node}
        domains = {node.domain for node in case.model.graph.node}
        if ops <= SUPPORTED and domains <= {"", "ai.onnx"}:
            selected[case.name] = case
    if not selected:
        raise RuntimeError(
            f"no ONNX node test selected out of {len(cases)} loaded: the onnx package's backend test data is missing "
            f"or its layout changed; a conformance run of zero cases proves nothing"
        )
    return selected


def as_array(value: Any) -> Any:
    """A case's input or output as numpy (cases store some as TensorProto, some as numpy scalars);
    sequences and other values stay as they are."""
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def numpy_dtypes_only(case: Any) -> bool:
    """Whether every input and expected output is a numpy array of a standard dtype (a *counted* case)."""
    for inputs, outputs in case.data_sets:
        for value in list(inputs) + list(outputs):
            value = as_array(value)
            if not isinstance(value, np.ndarray) or value.dtype not in _NUMPY_DTYPES:
                return False
    return True


def primary_op(case: Any) -> str:
    """The operator a case tests, from its name (``test_reduce_mean_...`` -> ReduceMean)."""
    key = case.name[len("test_") :].replace("_", "").lower()
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
    counted: bool  # numpy can hold every input and output
    status: str  # "pass", "fail" (wrong values), "error" (unexpected exception), "unsupported" (clear ModelError)
    on_webgpu: bool  # every node of every data set placed on WebGPU (for passing cases)
    message: str = ""
    seconds: float = 0.0


def compare(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> str:
    """ "" when ``actual`` matches ``expected`` as onnx's backend runner checks it, else why not."""
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


def _placement(sess: Any, feeds: dict[str, np.ndarray]) -> list[Any]:
    """``sess.get_node_placement`` for these feeds (their values decide shapes in some models)."""
    return list(sess.get_node_placement({name: tuple(a.shape) for name, a in feeds.items()}, input_values=feeds))


def run_case(case: Any, env: Any) -> CaseResult:
    """Run one case through ``ortgpu.InferenceSession`` on ``env``'s default device."""
    import ortgpu

    start = time.perf_counter()
    op = primary_op(case)
    counted = numpy_dtypes_only(case)
    on_webgpu = True

    def result(status: str, message: str = "") -> CaseResult:
        return CaseResult(
            case.name, op, counted, status, on_webgpu and status == "pass", message, time.perf_counter() - start
        )

    try:
        sess = ortgpu.InferenceSession(case.model.SerializeToString(), env=env, device=env.default_device)
        try:
            names = sess.input_names
            for inputs, expected in case.data_sets:
                feeds = {name: as_array(value) for name, value in zip(names, inputs)}
                with np.errstate(all="ignore"):
                    outputs = sess.run(None, feeds)
                placement = _placement(sess, feeds)
                on_webgpu = on_webgpu and all(p.placement == "webgpu" for p in placement)
                for name, want, got in zip(sess.output_names, expected, outputs):
                    problem = compare(np.asarray(as_array(want)), got, case.rtol, case.atol)
                    if problem:
                        return result("fail", f"{name}: {problem}")
        finally:
            sess.close()
    except ModelError as error:
        return result("unsupported", f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001 - reported per case
        return result("error", " ".join(f"{type(error).__name__}: {error}".split())[:300])
    return result("pass")


def problems_of(result: CaseResult, exclusions: dict[str, str]) -> str:
    """Why ``result`` breaks the conformance requirement, or ""."""
    if result.name in exclusions or not result.counted:
        if result.status != "unsupported":
            why = (
                f"excluded ({exclusions[result.name]})"
                if result.name in exclusions
                else "out of scope (dtypes numpy cannot hold)"
            )
            return (
                f"{result.name} is {why} but did not fail with a clear ModelError: [{result.status}] {result.message}"
            )
        return ""
    if result.status != "pass":
        return f"{result.name} [{result.status}]: {result.message}"
    return ""


@dataclass
class Totals:
    counted: int
    passed: int
    webgpu: int
    excluded: int
    out_of_scope: int
    problems: list[str]

    @property
    def share(self) -> float:
        return self.webgpu / max(self.counted, 1)


def totals(results: list[CaseResult], exclusions: dict[str, str]) -> Totals:
    counted = [r for r in results if r.counted]
    return Totals(
        counted=len(counted),
        passed=sum(r.status == "pass" for r in counted),
        webgpu=sum(r.on_webgpu for r in counted),
        excluded=sum(r.name in exclusions for r in counted),
        out_of_scope=len(results) - len(counted),
        problems=[p for p in (problems_of(r, exclusions) for r in sorted(results, key=lambda r: r.name)) if p],
    )


def report(results: list[CaseResult], seconds: float, workers: int) -> str:
    """The per-operator table (counted cases) and the totals."""
    exclusions = load_exclusions()
    by_op: dict[str, list[CaseResult]] = {}
    for result in results:
        if result.counted:
            by_op.setdefault(result.op, []).append(result)
    lines = [
        "ONNX backend node tests of the supported operators, run through ortgpu.InferenceSession on the wgpu backend.",
        "Counted: cases whose inputs and outputs numpy can hold. webgpu: passing with every node placed on WebGPU.",
        "",
        f"{'operator':22s} {'cases':>5s} {'pass':>5s} {'webgpu':>6s} {'excl':>5s} {'fail':>5s}",
    ]
    for op in sorted(by_op):
        group = by_op[op]
        passed = sum(r.status == "pass" for r in group)
        webgpu = sum(r.on_webgpu for r in group)
        excluded = sum(r.name in exclusions for r in group)
        failed = sum(r.status != "pass" and r.name not in exclusions for r in group)
        lines.append(f"{op:22s} {len(group):5d} {passed:5d} {webgpu:6d} {excluded:5d} {failed:5d}")
    t = totals(results, exclusions)
    lines.append(
        f"{'TOTAL':22s} {t.counted:5d} {t.passed:5d} {t.webgpu:6d} {t.excluded:5d} "
        f"{t.counted - t.passed - t.excluded:5d}"
    )
    lines.append("")
    lines.append(
        f"passed {t.passed}/{t.counted} counted cases ({t.excluded} excluded); wholly on WebGPU {t.webgpu}/{t.counted} "
        f"({100.0 * t.share:.1f}%, required {100.0 * MIN_WEBGPU_SHARE:.0f}%); {t.out_of_scope} more cases use dtypes "
        f"numpy cannot hold and fail clearly; runtime {seconds:.1f} s with {workers} worker(s)"
    )
    if t.problems:
        lines.append("")
        lines.append("problems:")
        lines.extend(f"  {p}" for p in t.problems)
    cpu = [r for r in results if r.counted and r.status == "pass" and not r.on_webgpu]
    if cpu:
        lines.append("")
        lines.append("passing with nodes placed on the CPU: " + " ".join(sorted(r.name for r in cpu)))
    return "\n".join(lines) + "\n"


def write_report(text: str, path: str = REPORT_PATH) -> None:
    """Write the report to ``path`` unless only the runtime line would change (no churn in the tree)."""
    import re

    def stable(content: str) -> str:
        return re.sub(r"; runtime [0-9.]+ s with \d+ worker\(s\)", "", content)

    if os.path.exists(path):
        with open(path) as handle:
            if stable(handle.read()) == stable(text):
                return
    with open(path, "w") as handle:
        handle.write(text)


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


_RESULTS: dict[str, CaseResult] = {}
_STARTED: list[float] = []
_HANDLES: list[int] = []  # native objects owned before the first case (see conftest.owned_handles)


@pytest.fixture(scope="module")
def wgpu_env() -> Iterator[Any]:
    """The run's wgpu Env (shared with the other test modules; closed at the end of the session)."""
    from conftest import shared_env

    yield shared_env("wgpu")


@pytest.mark.wgpu_only
@pytest.mark.parametrize("name", _case_names())
def test_node_case(name: str, wgpu_env: Any) -> None:
    if not _STARTED:
        _start(wgpu_env)
    result = run_case(supported_cases()[name], wgpu_env)
    _RESULTS[name] = result
    problem = problems_of(result, load_exclusions())
    assert not problem, problem


def _start(env: Any) -> None:
    import gc

    from conftest import owned_handles

    gc.collect()
    _STARTED.append(time.perf_counter())
    _HANDLES.append(owned_handles(env))


@pytest.mark.wgpu_only
def test_conformance_summary(
    wgpu_env: Any, capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every case (running those the per-case tests did not), the totals asserted, the report written,
    and no native object left behind by the closed sessions."""
    import gc

    from conftest import owned_handles

    if not _STARTED:
        _start(wgpu_env)
    for name, case in sorted(supported_cases().items()):
        if name not in _RESULTS:
            _RESULTS[name] = run_case(case, wgpu_env)
    gc.collect()
    leaked = owned_handles(wgpu_env) - _HANDLES[0]
    results = list(_RESULTS.values())
    assert results, "the conformance run collected zero cases"
    text = report(results, time.perf_counter() - _STARTED[0], 1)
    path = str(tmp_path_factory.mktemp("conformance") / "conformance_report.txt")
    write_report(text, path)
    with capsys.disabled():
        print(
            "\n"
            + text
            + f"(written to {path}; `python tests/test_conformance.py` updates tests/conformance_report.txt)"
        )
    t = totals(results, load_exclusions())
    assert t.counted > 0, "the conformance run counted zero cases"
    assert not t.problems, "conformance problems:\n" + "\n".join(t.problems)
    assert t.passed + t.excluded == t.counted
    assert leaked == 0, f"the conformance sessions left {leaked} native object(s) behind after close()"
    assert t.share >= MIN_WEBGPU_SHARE, (
        f"only {t.webgpu}/{t.counted} counted cases ({100 * t.share:.1f}%) run wholly on WebGPU; "
        f"{100 * MIN_WEBGPU_SHARE:.0f}% required"
    )


def test_exclusions_name_real_counted_cases() -> None:
    cases = supported_cases()
    exclusions = load_exclusions()
    stale = [name for name in exclusions if name not in cases]
    assert not stale, f"conformance_exclusions.txt names cases that are not supported node tests: {stale}"
    uncounted = [name for name in exclusions if not numpy_dtypes_only(cases[name])]
    assert not uncounted, f"conformance_exclusions.txt lists cases outside the counted set (no need): {uncounted}"
    assert all(exclusions.values()), "every exclusion needs a one-line reason"


# -- script --------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _worker_init() -> None:
    import ortgpu

    _WORKER["env"] = ortgpu.Env(backend="wgpu")
    supported_cases()


def _worker_run(name: str) -> CaseResult:
    return run_case(supported_cases()[name], _WORKER["env"])


def main(argv: list[str] | None = None) -> int:
    import multiprocessing

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("-k", "--filter", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    names = [n for n in sorted(supported_cases()) if args.filter in n]
    start = time.perf_counter()
    if args.jobs <= 1:
        _worker_init()
        results = [_worker_run(n) for n in names]
        _WORKER["env"].close()
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(args.jobs, initializer=_worker_init) as pool:
            results = pool.map(_worker_run, names, chunksize=4)
    seconds = time.perf_counter() - start
    text = report(results, seconds, args.jobs)
    print(text)
    if not args.filter:
        write_report(text)
    t = totals(results, load_exclusions())
    return 0 if not t.problems and (args.filter or t.share >= MIN_WEBGPU_SHARE) else 1


if __name__ == "__main__":
    sys.exit(main())
