# Sourced by this session's H200 scripts (run from the repository root, .gl and .whl carried): the Vulkan loader,
# the wheels, and the extension built in place.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace -j 8 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
