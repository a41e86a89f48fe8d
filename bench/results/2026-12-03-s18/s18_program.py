"""Session 18's scripts: a captured graph's program and its buffers, to record and submit its lists directly."""

from __future__ import annotations

from typing import Any

from bench.harness import OrtgpuArms


class GraphProgram:
    """The program a captured graph replays (caught through the runner's profiling hook, which ``replay()`` hands it
    to while a profiler is set), its device, the buffer maps its lists are recorded on, and its read-ahead ranges."""

    def __init__(self, arms: OrtgpuArms) -> None:
        graph = arms.capture()
        runner: Any = arms.session._runner
        seen: dict[str, Any] = {}

        def catch(graph_: Any, program: Any, reads: Any = None) -> int:
            seen["program"] = program
            return 0  # replayed as usual

        runner.profiler, runner.profile_replay = object(), catch
        try:
            graph.replay()
        finally:
            del runner.profile_replay
            runner.profiler = None
        self.program: Any = seen["program"]
        self.device: Any = arms._backend_device
        binding = graph.binding
        unread = self.program.plan.unread_inputs
        self.inputs = {n: v._device_buffer for n, v in binding.inputs().items() if n not in unread}
        self.outputs = {n: v._device_buffer for n, v in binding.outputs().items()}
        self.ranges = graph._read_ahead_ranges()
