#!/usr/bin/env bash
# The main job (README): builds the mamba2-ssd CLI if needed (fetching the pinned CUTLASS headers
# first) and runs one forward: `scripts/run.sh [mamba2-ssd run flags]`, e.g.
#   scripts/run.sh --seqlen 65536            # the GPU when one is present, else the CPU reference
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-$root/build}"
cuda=ON
command -v nvcc >/dev/null 2>&1 || cuda=OFF
if [ ! -x "$build/apps/mamba2-ssd" ]; then
  scripts/fetch-deps.sh >&2
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAMBA2_SSD_CUDA="$cuda" >&2
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target mamba2_ssd_cli >&2
fi
exec "$build/apps/mamba2-ssd" run "$@"
