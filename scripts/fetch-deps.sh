#!/usr/bin/env bash
# Installs the pinned build dependencies that are not system packages into .deps/ (ignored):
# the CUTLASS/CuTe headers from the nvidia-cutlass 4.2.0.0 wheel (headers only, --no-deps).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.deps/cutlass"
if [ -f "$dest/cutlass_library/source/include/cute/tensor.hpp" ]; then
  echo "fetch-deps: CUTLASS headers already in $dest"
  exit 0
fi
python3 -m pip install --quiet --no-deps --target "$dest" "nvidia-cutlass==4.2.0.0"
echo "fetch-deps: CUTLASS 4.2.0.0 headers in $dest/cutlass_library/source/include"
