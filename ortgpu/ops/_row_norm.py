"""One row kernel shared by the normalisation operators (RMS, Instance, Group, Lp, MeanVariance).

Each row is the set of elements normalised together (the reduced axes of :func:`._tiling.row_layout`).  The
kernel walks a row up to three times: the row mean (when centring), the statistic (sum of squared deviations,
of squares or of absolute values), then the outputs ``(x - mean) * factor * scale + bias``.  The statistic is
summed over the row's invocations through workgroup memory, in float32.  Float16 tensors are read and written as
``f16`` arrays where the device has ``shader-f16`` (each invocation stores its own 16-bit elements), computed in
float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from ._kernel import Binding, DeviceCaps, NotOnDevice, OpPlan, TensorInfo
from ._tiling import BindingTable, row_kernel_header, row_kernel_prologue, row_layout, single_kernel_plan, wgsl_f32

__all__ = ["RowNorm", "row_norm_plan", "require_row_norm_dtypes", "widened", "narrowed"]

Statistic = Literal["variance", "std", "mean_square", "l1", "l2"]


@dataclass(frozen=True)
class RowNorm:
    """What one row kernel computes.

    ``statistic``: ``variance`` (centred, ``factor = 1 / sqrt(var + epsilon)``), ``std`` (centred,
    ``1 / (sqrt(var) + epsilon)``), ``mean_square`` (RMS: not centred, ``1 / sqrt(mean(x^2) + epsilon)``), ``l1``
    (``1 / sum|x|``) or ``l2`` (``1 / sqrt(sum x^2)``; both 0 for a zero norm).
    ``scale_index``/``bias_index``: WGSL bodies of ``fn(at: u32) -> u32`` giving the parameter index of input
    element ``at`` (its linear index; ``None``: no parameter).  ``scale_input``/``bias_input``: their node inputs.
    """

    statistic: Statistic
    epsilon: float = 0.0
    scale_input: int | None = None
    scale_index: str | None = None
    bias_input: int | None = None
    bias_index: str | None = None
    #: extra WGSL functions the index bodies call
    helpers: str = ""
    #: round the normalised value to the narrower of the input's and the output's type before the scale
    #: (RMSNormalization's definition casts it to the input's type)
    round_normalized: bool = False
    #: further inputs added to input 0 before normalising: (node input, WGSL body of ``fn(at: u32) -> u32`` giving
    #: the element of that input added to input element ``at``)
    addends: tuple[tuple[int, str], ...] = ()
    #: the node output receiving the value normalised (input 0 plus the addends, shaped as input 0); None: not stored
    sum_output: int | None = None
    #: the node outputs receiving each row's mean (0 where the statistic is not centred) and factor, one element per
    #: row in the rows' order (input 0's shape with the normalised axes set to 1); None: not stored
    mean_output: int | None = None
    factor_output: int | None = None
    #: store the normalised rows in output 0; False: the kernel computes only what the other outputs ask for (a node
    #: whose outputs need more bindings than a kernel may have splits them over two kernels)
    store_normalized: bool = True


def widened(element: str, load: str) -> str:
    """WGSL of ``load`` (an element of ``element`` storage) as an f32: the row kernels compute in f32 only."""
    return load if element == "f32" else f"f32({load})"


def narrowed(element: str, value: str) -> str:
    """WGSL of the f32 ``value`` as an ``element`` to store (the one rounding of a float16 result)."""
    return value if element == "f32" else f"{element}({value})"


def _element(info: TensorInfo, caps: DeviceCaps) -> str:
    if info.dtype == np.float32:
        return "f32"
    if info.dtype == np.float16 and caps.has_f16:
        return "f16"
    return ""


def require_row_norm_dtypes(op_type: str, infos: Sequence[TensorInfo | None], caps: DeviceCaps) -> None:
    """``NotOnDevice`` unless every tensor is float32, or float16 on a device with ``shader-f16``."""
    for info in infos:
        if info is not None and not _element(info, caps):
            why = "" if info.dtype != np.float16 else " (float16 needs the shader-f16 feature)"
            raise NotOnDevice(f"{op_type}: the WebGPU kernel computes float32 and float16 only, not {info.dtype}{why}")


def row_norm_plan(
    op_type: str,
    spec: RowNorm,
    axes: Sequence[int],
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
    shape: tuple[int, ...] | None = None,
) -> OpPlan:
    """The one-kernel plan normalising input 0 over ``axes`` of ``shape`` (a reshape of input 0, default its
    shape) into output 0; ``compute`` is the twin."""
    x = inputs[0]
    assert x is not None
    layout = row_layout(x.shape if shape is None else shape, axes)
    if layout.rows == 0 or layout.length == 0:
        return OpPlan()
    centred = spec.statistic in ("variance", "std")
    loops = 3 if centred else 2
    threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, op_type, loops=loops)
    require_row_norm_dtypes(op_type, list(inputs) + list(outputs), caps)
    table = BindingTable()
    x_name = table.add(Binding("input", 0), _element(x, caps))
    out_element = _element(outputs[0], caps)
    output = table.add(Binding("output", 0), out_element, writable=True) if spec.store_normalized else ""
    terms = ""
    helpers += spec.helpers
    value = f"f32({x_name}[at])"
    for count, (addend, addend_index) in enumerate(spec.addends):
        info = inputs[addend]
        assert info is not None
        name = table.add(Binding("input", addend), _element(info, caps))
        helpers += f"fn addend_{count}_index(at: u32) -> u32 {{ {addend_index} }}\n"
        value += f" + f32({name}[addend_{count}_index(at)])"
    helpers += f"fn value(at: u32) -> f32 {{ return {value}; }}\n"
    stores = ""
    if spec.sum_output is not None:
        info = outputs[spec.sum_output]
        name = table.add(Binding("output", spec.sum_output), _element(info, caps), writable=True)
        stores = f"            {name}[at] = {narrowed(_element(info, caps), 'v')};\n"
    stats = ""
    for statistic_output, statistic in ((spec.mean_output, "mean"), (spec.factor_output, "factor")):
        if statistic_output is not None:
            info = outputs[statistic_output]
            name = table.add(Binding("output", statistic_output), _element(info, caps), writable=True)
            stats += f"        {name}[row] = {narrowed(_element(info, caps), statistic)};\n"
    if stats:
        stats = f"    if (valid && t == 0u) {{\n{stats}    }}\n"
    for position, index, operator, function in (
        (spec.scale_input, spec.scale_index, "*", "scale_index"),
        (spec.bias_input, spec.bias_index, "+", "bias_index"),
    ):
        if position is None or index is None or not spec.store_normalized:
            continue
        info = inputs[position]
        assert info is not None
        name = table.add(Binding("input", position), _element(info, caps))
        helpers += f"fn {function}(at: u32) -> u32 {{ {index} }}\n"
        terms += f" {operator} f32({name}[{function}(at)])"
    enable = "enable f16;\n" if any(_element(i, caps) == "f16" for i in list(inputs) + list(outputs) if i) else ""
    epsilon = wgsl_f32(spec.epsilon)
    if centred:
        mean = """    var s = 0.0;
    if (valid) {
        for (var r = t; r < LENGTH; r = r + T) { s = s + value(base + row_offset(r)); }
    }
    let mean = wg_sum(s, t, slot) / f32(LENGTH);
"""
    else:
        mean = "    let mean = 0.0;\n"
    accumulate = {
        "variance": "q = fma(d, d, q);",
        "std": "q = fma(d, d, q);",
        "mean_square": "q = fma(d, d, q);",
        "l1": "q = q + abs(d);",
        "l2": "q = fma(d, d, q);",
    }[spec.statistic]
    factor = {
        "variance": f"inverseSqrt(total / f32(LENGTH) + {epsilon})",
        "std": f"1.0 / (sqrt(total / f32(LENGTH)) + {epsilon})",
        "mean_square": f"inverseSqrt(total / f32(LENGTH) + {epsilon})",
        "l1": "select(0.0, 1.0 / total, total > 0.0)",
        "l2": "select(0.0, inverseSqrt(total), total > 0.0)",
    }[spec.statistic]
    normalized = "(v - mean) * factor"
    # the narrower of X's and Y's types (they may differ): X's by the definition, Y's where a fused graph casts the
    # normalised value to Y's type before its scale
    narrow = "f16" if "f16" in (_element(x, caps), out_element) else "f32"
    if spec.round_normalized and narrow != "f32":
        normalized = f"f32({narrow}({normalized}))"
    if spec.store_normalized:
        stores += f"            {output}[at] = {out_element}({normalized}{terms});\n"
    final = ""
    if stores:
        final = f"""    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let at = base + row_offset(r);
            let v = value(at);
{stores}        }}
    }}
"""
    wgsl = f"""{enable}{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
{mean}    var q = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let d = value(base + row_offset(r)) - mean;
            {accumulate}
        }}
    }}
    let total = wg_sum(q, t, slot);
    let factor = {factor};
{final}{stats}}}
"""
    return single_kernel_plan(op_type, wgsl, grid, table, compute, inputs, outputs, caps)
