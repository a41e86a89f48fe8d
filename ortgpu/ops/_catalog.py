"""The operator catalog: what ortgpu implements, by domain, and which operators have data-dependent output sizes.

Where each operator runs is measured, not declared: ``tests/test_conformance.py`` records the placement of every
node of every passing ONNX node test and writes the README's operator table from it (a test keeps the README and the
committed report equal).  A graph with a CPU-placed node runs, but cannot be captured (capture names the nodes);
``session.get_node_placement()`` says where each node of a given model runs, and why.
"""

from __future__ import annotations

from ._registry import _REGISTRY, _load_all

__all__ = ["DATA_DEPENDENT_OPS", "registered_operators"]

#: Operators whose output size depends on input values: planned where those values are known (constants, or graph
#: inputs whose values the plan is made for), refused for values computed on the device; never capturable.
DATA_DEPENDENT_OPS = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression"})


def registered_operators() -> dict[str, list[str]]:
    """domain ("ai.onnx" for the default one) -> sorted op types ortgpu implements."""
    _load_all()
    domains: dict[str, list[str]] = {}
    for domain, op_type in sorted(_REGISTRY):
        domains.setdefault(domain or "ai.onnx", []).append(op_type)
    return domains
