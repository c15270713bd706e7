#!/usr/bin/env bash
# Installs what the build and the tests need, pinned, and only what is missing: repeating it costs
# a few checks. Python packages go to a virtual environment in .deps/venv; the CUTLASS/CuTe headers
# come from PyPI's nvidia-cutlass wheel (headers only, its Python dependencies are not needed).
set -euo pipefail
cd "$(dirname "$0")/.."

NANOBIND=3.1.0
SCIKIT_BUILD_CORE=1.1.2
PYTEST=9.2.0
NUMPY=2.4.6
ML_DTYPES=0.7.0  # bfloat16 NumPy arrays: the binding's bf16 tests run on the CPU too
CUTLASS=4.2.0.0

deps=.deps
mkdir -p "$deps"

# Debian packages: GoogleTest, ninja, cmake, Python with its venv module and headers (the
# extension's build). As root, or through sudo where that exists.
need=()
dpkg -s libgtest-dev >/dev/null 2>&1 || need+=(libgtest-dev googletest)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if ! command -v python3 >/dev/null 2>&1; then
  need+=(python3 python3-venv python3-dev)
else
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    >/dev/null 2>&1 || need+=(python3-dev)
fi
if ((${#need[@]})); then
  echo "setup: apt-get install ${need[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: not root and no sudo: install ${need[*]} first" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc (CUDA 13) not found: the build will be CPU-only (install the CUDA toolkit for the CUDA backend)" >&2
fi

# Python environment.
stamp="$deps/venv/.pinned-$NANOBIND-$SCIKIT_BUILD_CORE-$PYTEST-$NUMPY-$ML_DTYPES"
if [ ! -f "$stamp" ]; then
  python3 -m venv "$deps/venv"
  "$deps/venv/bin/python" -m pip install -q --disable-pip-version-check \
    "nanobind==$NANOBIND" "scikit-build-core==$SCIKIT_BUILD_CORE" "pytest==$PYTEST" "numpy==$NUMPY" \
    "ml_dtypes==$ML_DTYPES"
  touch "$stamp"
fi

# CUTLASS/CuTe headers.
cutlass="$deps/cutlass-$CUTLASS"
if [ ! -d "$cutlass/include/cute" ]; then
  tmp=$(mktemp -d)
  "$deps/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$tmp" "nvidia-cutlass==$CUTLASS"
  mkdir -p "$cutlass"
  "$deps/venv/bin/python" - "$tmp" "$cutlass" <<'PY'
import sys, zipfile, glob, os
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            dst = os.path.join(sys.argv[2], "include", name[len(prefix):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(name) as src, open(dst, "wb") as out:
                out.write(src.read())
PY
  rm -rf "$tmp"
fi
echo "setup: ok (venv $deps/venv, CUTLASS headers $cutlass/include)"
