#!/usr/bin/env bash
# ortgpu's one entry point for a fresh Debian/Ubuntu machine:
#   ./run.sh demo    set everything up, then build a small model, run it on the default device, print results and timings
#   ./run.sh test    set everything up, then ruff and cython-lint, then the test suite (both backends, one worker per core)
#   ./run.sh doctor  only say which system packages are missing (exit 1 if any)
# Set-up (idempotent): system packages when missing (python3-venv, a C compiler, and mesa-vulkan-drivers when no
# Vulkan driver is installed; installed when running as root, else the command to run is printed), a virtualenv in
# .venv, and the package with its test extras built from this checkout (pip install -e ".[test]").
set -euo pipefail
cd "$(dirname "$0")"
VENV=${ORTGPU_VENV:-.venv}
PYTHON=${PYTHON:-python3}

say() { printf '[run.sh] %s\n' "$*" >&2; }

# What is missing, as apt package names (no pipelines into `grep -q`: under pipefail, grep quitting early makes the
# producer die of SIGPIPE and the check fail although the thing is there).
missing_system_packages() {
need_apt=()
command -v "$PYTHON" >/dev/null 2>&1 || need_apt+=(python3)
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
"$PYTHON" -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' >/dev/null 2>&1 || need_apt+=(python3-dev)
# A Vulkan driver (any ICD manifest) and the Vulkan loader.
if ! compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null && ! compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null; then
  need_apt+=(mesa-vulkan-drivers)
fi
libraries=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
if [[ "$libraries" != *libvulkan.so.1* ]]; then
  need_apt+=(libvulkan1)
fi
}

if [ "${1:-}" = doctor ]; then
  missing_system_packages
  if [ ${#need_apt[@]} -gt 0 ]; then echo "missing: ${need_apt[*]}"; exit 1; fi
  echo "system packages: ok"
  exit 0
fi

missing_system_packages
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing system packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    say "missing system packages: ${need_apt[*]}; install them with: sudo apt-get install -y ${need_apt[*]}"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.ortgpu-installed"
# The editable install is "strict": a tree of links to this checkout's files (stub package included), which type
# checkers follow, unlike the default import hook. Edits show at once; added or removed files need a reinstall, so
# the stamp records the file list as well as the build inputs' times.
package_files=$(find ortgpu ortgpu_core stubs bench -type f \( -name '*.py' -o -name '*.pyi' -o -name '*.pyx' -o -name '*.pxd' -o -name 'py.typed' \) 2>/dev/null | LC_ALL=C sort | cksum)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$package_files" ] \
   || [ -n "$(find setup.py pyproject.toml ortgpu_core -newer "$stamp" \( -name '*.pyx' -o -name '*.pxd' -o -name 'setup.py' -o -name 'pyproject.toml' \) 2>/dev/null)" ]; then
  say "installing ortgpu and its test dependencies into $VENV (log: $VENV/install.log)"
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip \
         && "$VENV/bin/python" -m pip install -q -e ".[test]" --config-settings editable_mode=strict; } > "$VENV/install.log" 2>&1; then
    tail -40 "$VENV/install.log" >&2
    say "installation failed; the whole log is $VENV/install.log"
    exit 1
  fi
  printf '%s\n' "$package_files" > "$stamp"
fi

case "${1:-}" in
  demo)
    shift
    exec "$VENV/bin/python" -m ortgpu.demo "$@"
    ;;
  test)
    shift
    if [ $# -eq 0 ]; then  # the whole suite (CI): lint and format first, as configured in pyproject.toml
      "$VENV/bin/python" -m ruff check . && "$VENV/bin/python" -m ruff format --check . || {
        say "ruff found problems: fix them (ruff check --fix . && ruff format .) before the tests run"; exit 1; }
      # cython-lint runs pycodestyle as a program: the virtualenv's bin must be on PATH.
      PATH="$(cd "$VENV/bin" && pwd):$PATH" "$VENV/bin/cython-lint" ortgpu_core || {
        say "cython-lint found problems in the .pyx/.pxd files"; exit 1; }
    fi
    # One pytest worker per core (pytest-xdist), each worker taking tests from the others' queues when its own runs
    # dry (tests differ a thousandfold in cost).  ORTGPU_TEST_WORKERS=0 runs everything in this one process.
    exec "$VENV/bin/python" -m pytest -n "${ORTGPU_TEST_WORKERS:-auto}" --dist worksteal "$@"
    ;;
  *)
    echo "usage: ./run.sh demo [--backend wgpu|fake] | ./run.sh test [pytest args] | ./run.sh doctor" >&2
    exit 2
    ;;
esac
