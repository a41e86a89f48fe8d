"""The model builders live in :mod:`bench.models` (shared by tests and benchmarks)."""

from bench.models import *  # noqa: F401,F403
from bench.models import __all__  # noqa: F401
