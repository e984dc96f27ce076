#!/usr/bin/env bash
# The test command (README): fetches the pinned build dependencies, builds the library, the CLI
# and the tests (CUDA kernels included when nvcc is present), runs every C++ test through ctest
# (GPU tests skip themselves without a Hopper GPU), then builds + installs the Python package
# and runs the Python tests.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="${JOBS:-$(nproc)}"
build="${BUILD_DIR:-$root/build}"

cuda=ON
if ! command -v nvcc >/dev/null 2>&1; then
  echo "test: nvcc not found, building without the CUDA kernels"
  cuda=OFF
fi
scripts/fetch-deps.sh
# Python build and test tools, pinned like pyproject.toml (no-op when present).
python3 -c "import scikit_build_core, nanobind, numpy, pytest" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check "scikit-build-core==0.11.5" "nanobind==2.9.2" numpy pytest

echo "test: configure + build ($build, MAMBA2_SSD_CUDA=$cuda, $jobs jobs)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAMBA2_SSD_CUDA="$cuda"
cmake --build "$build" -j "$jobs"

echo "test: C++ tests"
(cd "$build" && ctest --output-on-failure -j "$jobs")

echo "test: Python package"
python3 -m pip install --quiet --no-build-isolation -C build-dir="$root/build-py" \
  -C cmake.define.MAMBA2_SSD_CUDA="$cuda" .
python3 -m pytest -q tests/python
