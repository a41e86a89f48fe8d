"""The operators of the default ONNX domain (``ai.onnx``, written ``""`` in a model): one module per operator or
per family of same-shaped operators, each with its WGSL kernel generator and its numpy twin side by side.

The registry imports every public module here on first use (:func:`ortgpu.ops.get_operator`), so a module needs
no listing: a class decorated with :func:`~ortgpu.ops.register` is found.  Modules whose name starts with ``_``
are helpers of the operators in this folder (the recurrent and resize kernels), imported by them, not scanned.
"""
