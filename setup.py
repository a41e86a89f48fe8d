"""Build the Cython modules of ortgpu_core; metadata lives in pyproject.toml.

Packages are listed here rather than in pyproject.toml because the PEP 561
stub package ``ortgpu_core-stubs`` (installed from ``stubs/ortgpu_core`` so
users' mypy sees the compiled modules' types) has a name pyproject's schema
rejects.
"""

from pathlib import Path

import Cython
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

# Cython 3.3.0 builds the subclassed cdef class DeviceAllocator with an undefined symbol
# (__pyx_tp_new_vectorcall_...), so _allocator fails to import; pyproject.toml excludes it for isolated builds, and
# this check covers `setup.py build_ext --inplace` with whatever Cython is installed.
if Cython.__version__ == "3.3.0":
    raise SystemExit(
        "Cython 3.3.0 builds a broken ortgpu_core._allocator (undefined __pyx_tp_new_vectorcall_ symbol); "
        "install another version first: pip install 'Cython>=3.0,!=3.3.0,<4' (3.2.4 and 3.3.1 work)"
    )

HERE = Path(__file__).parent


def extensions() -> list[Extension]:
    modules = []
    for pyx in sorted((HERE / "ortgpu_core").rglob("*.pyx")):
        relative = pyx.relative_to(HERE).with_suffix("")
        modules.append(Extension(".".join(relative.parts), [str(pyx.relative_to(HERE))]))
    return modules


setup(
    # Every package under ortgpu/ and ortgpu_core/, found rather than listed (a listed set once missed new
    # subpackages, which then imported only from the checkout), plus the stubs. bench/ is not installed (a
    # top-level package named "bench" would shadow users' own): run it from a checkout with `python -m bench`.
    packages=[
        *find_packages(include=["ortgpu", "ortgpu.*", "ortgpu_core", "ortgpu_core.*"]),
        "ortgpu_core.backends.resources",
        "ortgpu_core-stubs",
        "ortgpu_core-stubs.backends",
    ],
    package_dir={
        "ortgpu_core-stubs": "stubs/ortgpu_core",
        "ortgpu_core-stubs.backends": "stubs/ortgpu_core/backends",
    },
    package_data={
        "ortgpu": ["py.typed"],
        "ortgpu_core": ["*.pxd", "*.pyx", "py.typed"],
        "ortgpu_core.backends": ["*.pxd", "*.pyx"],
        "ortgpu_core.backends.resources": ["*.h"],
        "ortgpu_core-stubs": ["*.pyi", "py.typed"],
        "ortgpu_core-stubs.backends": ["*.pyi"],
    },
    ext_modules=cythonize(
        extensions(),
        # auto_pickle off: Cython would otherwise make every core class copyable and picklable, and a copy of an
        # object that owns a native buffer frees it twice.  Classes that mean something when copied say so.
        compiler_directives={"language_level": "3", "embedsignature": True, "auto_pickle": False},
    ),
)
