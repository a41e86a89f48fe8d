"""Benchmarks of ortgpu: ``python -m bench --help``."""
