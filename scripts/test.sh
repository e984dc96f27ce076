#!/usr/bin/env bash
# The test command (README): fetches the pinned build dependencies, builds the library, the CLI
# and the tests (CUDA kernels included when nvcc is present), runs every C++ test through ctest
# (GPU tests skip themselves without a Hopper GPU), runs the Python tests on the extension of the
# same build and the benchmark's CPU tests (bench/tests), then checks `pip install .` (CPU-only,
# for speed).
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
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAMBA2_SSD_CUDA="$cuda" -DMAMBA2_SSD_PYTHON=ON
cmake --build "$build" -j "$jobs"

echo "test: C++ tests"
(cd "$build" && ctest --output-on-failure -j "$jobs")

# The Python tests use the extension of the build above (copied to python/mamba2_ssd/_C*.so), so
# the kernels are compiled once; `pip install .` is then checked with a CPU-only build (seconds).
echo "test: Python tests (extension from $build) and the benchmark's CPU tests"
PYTHONPATH="$root/python" python3 -m pytest -q tests/python bench/tests
echo "test: pip install . (CPU-only packaging check)"
python3 -m pip install --quiet --no-build-isolation -C build-dir="$root/build-py" \
  -C cmake.define.MAMBA2_SSD_CUDA=OFF .
(cd / && python3 -c "import mamba2_ssd; print('test: installed mamba2_ssd', mamba2_ssd.__version__, 'WITH_CUDA =', mamba2_ssd.WITH_CUDA)")
