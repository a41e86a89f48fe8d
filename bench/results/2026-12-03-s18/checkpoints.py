"""Session 18 (H200): the profiled replay's host path, statement by statement.  The runner's ``profile_replay`` and
the GPU step timer's ``run`` are recompiled with a ``perf_counter_ns`` checkpoint before each statement of their
bodies (and of the ``with`` blocks in them), and a profiled session (every replay timed whole unless DETAIL is set)
runs captured mlp16 steps (update_inplace + replay + to_numpy).  Printed: per statement, p50 and mean us until the
next checkpoint (the checkpoints' own cost, ~0.1 us each, included).

python3 checkpoints.py   (ITER=3000, DETAIL=1000000000)
"""

from __future__ import annotations

import ast
import inspect
import os
import statistics
import sys
import tempfile
import textwrap
import time
from typing import Any

sys.path.insert(0, os.getcwd())
import ortgpu  # noqa: E402
import ortgpu._profiling as profiling  # noqa: E402
import ortgpu._runner as runner_module  # noqa: E402
from bench.__main__ import build_model, model_feeds  # noqa: E402
from bench.harness import OrtgpuArms  # noqa: E402

ITER = int(os.environ.get("ITER", "3000"))
marks: list[tuple[str, int]] = []


class _Checkpoints(ast.NodeTransformer):
    def __init__(self, prefix: str, source: list[str]) -> None:
        self.prefix, self.source = prefix, source

    def _mark(self, statement: ast.stmt) -> ast.stmt:
        text = f"{self.prefix}:{statement.lineno}: {self.source[statement.lineno - 1].strip()[:60]}"
        return ast.parse(f"_MARKS.append(({text!r}, _NS()))").body[0]

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for statement in body:
            out.append(self._mark(statement))
            if isinstance(statement, ast.With):
                statement.body = self._body(statement.body)
            out.append(statement)
        return out

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.body = self._body(node.body) + [ast.parse(f"_MARKS.append(({self.prefix + ':end'!r}, _NS()))").body[0]]
        return node


def instrument(cls: type, name: str, module: Any, prefix: str) -> None:
    function = getattr(cls, name)
    source = textwrap.dedent(inspect.getsource(function))
    tree = _Checkpoints(prefix, source.split("\n")).visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    namespace = dict(vars(module))
    namespace.update(_MARKS=marks, _NS=time.perf_counter_ns)
    exec(compile(tree, f"<{prefix}>", "exec"), namespace)
    setattr(cls, name, namespace[name])


instrument(runner_module.SessionRunner, "profile_replay", runner_module, "replay")
instrument(profiling.GpuStepTimer, "run", profiling, "run")
model, shapes = build_model("mlp16", 1)
feeds = model_feeds("mlp16", model, shapes)
env = ortgpu.Env()
arms = OrtgpuArms(model.SerializeToString(), feeds, env)
graph = arms.capture()
arms.session.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
arms.session.start_profiling(int(os.environ.get("DETAIL", str(10**9))))
for _ in range(300):
    arms.captured_end_to_end()
spans: dict[str, list[int]] = {}
order: list[str] = []
for _ in range(ITER):
    del marks[:]
    arms._upload()
    start = time.perf_counter_ns()
    graph.replay()
    end = time.perf_counter_ns()
    arms._read()
    points = [("replay() entry", start)] + marks + [("replay() exit", end)]
    for (label, at), (_next, until) in zip(points, points[1:]):
        if label not in spans:
            order.append(label)
        spans.setdefault(label, []).append(until - at)
print(f"{ITER} steps; us from each checkpoint to the next (n: how often it was reached)")
for label in order:
    values = spans[label]
    print(f"{statistics.median(values) / 1e3:8.2f} {statistics.fmean(values) / 1e3:8.2f} {len(values):6d}  {label}")
os.remove(arms.session.end_profiling())
