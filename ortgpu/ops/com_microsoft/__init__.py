"""The contributed operators of onnxruntime's ``com.microsoft`` domain: what its transformer optimizer, quantization
tools and model builder emit (normalisations, activations, fused MatMul/Conv, attention, quantized weights, QLinear).

This package is their place, beside the standard domains, so that a contributed operator never shadows a standard
one of the same name (``com.microsoft`` has its own ``Attention``, ``Gelu``, ``LayerNormalization``...): the
registry keys implementations by (domain, op type).

To add one, write a module here in the shape of a sibling in :mod:`ortgpu.ops.ai_onnx` (say ``gelu.py`` beside
``ai_onnx/activations.py``) and decorate its class::

    from .._kernel import Operator
    from .._registry import register


    @register
    class Gelu(Operator):
        op_type = "Gelu"
        domain = "com.microsoft"
        since_version = 1  # the com.microsoft opset the operator appeared in

The registry imports every public module of this package on first use, and refuses a class whose ``domain`` is
not this package's (the folder and the registration say the same thing).  Add its test beside the standard
operators' (``tests/test_ops_*.py``), with a model that imports the ``com.microsoft`` opset.
"""
