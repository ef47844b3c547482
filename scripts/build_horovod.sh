#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) for the torch in this environment, and cache the wheel.
#
# Usage: scripts/build_horovod.sh [PYTHON]     (default: .venv/bin/python)
#
# 0.28.1 does not build against torch >= 2.1 as shipped: its CMake asks for C++14, torch's
# headers need C++17. This script takes the PyPI sdist, sets CMAKE_CXX_STANDARD 17 in the
# two CMakeLists.txt that pin 14, and builds with PyTorch + Gloo (no MPI, TensorFlow, MXNet).
# When torch is a CUDA build, Horovod also gets its NCCL operations (HOROVOD_GPU_OPERATIONS=NCCL,
# which needs the CUDA toolkit's nvcc and NCCL's headers): a Horovod without them fails at its
# first collective on a GPU tensor ("not compiled with CUDA"). A caller's
# HOROVOD_GPU_OPERATIONS wins (the Dockerfile sets NCCL; empty builds a CPU-only Horovod).
# It takes minutes (docs/benchmarks.md). The wheel links against one torch build, so the cache
# key holds the torch and Python versions and the GPU operations:
# ~/.cache/dalle_dist/wheels/<key>/horovod-*.whl. A cached wheel is reused and installed in
# seconds. Set DALLE_DIST_WHEELS to move the cache.
set -euo pipefail

PYTHON=${1:-.venv/bin/python}
VERSION=0.28.1
TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__)')
TORCH_CUDA=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
PYVER=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
if [ -n "$TORCH_CUDA" ] && [ -z "${HOROVOD_GPU_OPERATIONS+set}" ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
fi
GPU_OPS=${HOROVOD_GPU_OPERATIONS:-}
KEY=horovod-$VERSION-torch-$TORCH-$PYVER${GPU_OPS:+-gpu-$GPU_OPS}
CACHE=${DALLE_DIST_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/dalle_dist/wheels}/$KEY
PIP=("$PYTHON" -m pip --disable-pip-version-check)

wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "build_horovod: no cached wheel for torch $TORCH / $PYVER${GPU_OPS:+ / $GPU_OPS}; building Horovod $VERSION (minutes)"
    command -v cmake >/dev/null || { echo "build_horovod: cmake (>= 3.13) is needed: apt-get install cmake" >&2; exit 1; }
    command -v g++ >/dev/null || { echo "build_horovod: a C++17 compiler is needed: apt-get install g++" >&2; exit 1; }
    if [ -n "$GPU_OPS" ] && ! command -v nvcc >/dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        echo "build_horovod: torch $TORCH is a CUDA build, so Horovod needs its $GPU_OPS operations, which build with the CUDA toolkit (nvcc) and NCCL's headers: install them (e.g. an nvidia/cuda devel image, libnccl-dev), or set HOROVOD_GPU_OPERATIONS= for a Horovod that cannot reduce GPU tensors" >&2
        exit 1
    fi
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
if [ "$GPU_OPS" = NCCL ]; then
    "$PYTHON" -c 'import horovod.torch as hvd; assert hvd.nccl_built() and hvd.cuda_built(), "Horovod built without NCCL"'
fi
echo "build_horovod: installed $(basename "$wheel")"
