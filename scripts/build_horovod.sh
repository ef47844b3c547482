#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) for the torch in this environment, and cache the wheel.
#
# Usage: scripts/build_horovod.sh [PYTHON]     (default: .venv/bin/python)
#
# 0.28.1 does not build against torch >= 2.1 as shipped: its CMake asks for C++14, torch's
# headers need C++17. This script takes the PyPI sdist, sets CMAKE_CXX_STANDARD 17 in the
# two CMakeLists.txt that pin 14, and builds with PyTorch + Gloo only (no MPI, TensorFlow,
# MXNet). About 8 minutes on 2 cores. The wheel links against one torch build, so the cache
# key holds the torch and Python versions: ~/.cache/dalle_dist/wheels/<key>/horovod-*.whl.
# A cached wheel is reused and installed in seconds. Set DALLE_DIST_WHEELS to move the cache.
set -euo pipefail

PYTHON=${1:-.venv/bin/python}
VERSION=0.28.1
TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__)')
PYVER=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
CACHE=${DALLE_DIST_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/dalle_dist/wheels}/horovod-$VERSION-torch-$TORCH-$PYVER
PIP=("$PYTHON" -m pip --disable-pip-version-check)

wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "build_horovod: no cached wheel for torch $TORCH / $PYVER; building Horovod $VERSION (2 to 8 minutes)"
    command -v cmake >/dev/null || { echo "build_horovod: cmake (>= 3.13) is needed: apt-get install cmake" >&2; exit 1; }
    command -v g++ >/dev/null || { echo "build_horovod: a C++17 compiler is needed: apt-get install g++" >&2; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" install --quiet setuptools wheel packaging cloudpickle psutil pyyaml
    "${PIP[@]}" download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
    tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
    src="$work/horovod-$VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
        "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    mkdir -p "$CACHE"
    cp "$work"/dist/horovod-*.whl "$CACHE/"
    wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl | head -n 1)
    echo "build_horovod: cached $wheel"
fi
"${PIP[@]}" install --quiet "$wheel"
"$PYTHON" -c 'import horovod.torch as hvd; assert hvd.gloo_built(), "Horovod built without Gloo"'
echo "build_horovod: installed $(basename "$wheel")"
