"""Session 17 experiment: compile the pure-Python modules on a captured step's path with Cython, in place, as they
are (no source change; annotations not used as C types).  The compiled module (.so) takes precedence over the .py
at import; deleting it brings the .py back.

python3 compile_py.py MODULE.py ...   (run from the repository root)
"""

import importlib
import os
import shutil
import sys
import tempfile
from typing import Any

# (imported by name: neither ships type information)
cythonize: Any = importlib.import_module("Cython.Build").cythonize
setuptools: Any = importlib.import_module("setuptools")
Extension, setup = setuptools.Extension, setuptools.setup

modules = sys.argv[1:]
root = os.getcwd()
# setuptools would read the project's pyproject.toml in the cwd; build from a scratch folder with absolute paths
build = tempfile.mkdtemp()
os.chdir(build)
extensions = [Extension(m[:-3].replace("/", "."), [os.path.join(root, m)]) for m in modules]
directives = {"language_level": "3", "annotation_typing": False, "auto_pickle": False, "binding": True}
setup(
    script_args=["build_ext", "--build-lib", build, "-j", "8"],
    ext_modules=cythonize(extensions, quiet=True, compiler_directives=directives),
)
for m in modules:
    name = m[:-3].replace("/", os.sep)
    folder, base = os.path.split(name)
    for found in os.listdir(os.path.join(build, folder)):
        if found.startswith(base + ".") and found.endswith(".so"):
            shutil.copy(os.path.join(build, folder, found), os.path.join(root, folder, found))
            print("compiled", os.path.join(folder, found))
