"""The package version, one statement that the package and its onnxruntime-style API both read."""

__version__ = "0.1.0"
