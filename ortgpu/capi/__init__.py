"""``onnxruntime.capi``'s Python-level names, for programs that import them (exception types, ``OrtValueVector``,
the provider-argument check).  Not a C layer: each name is ortgpu's Python object."""
