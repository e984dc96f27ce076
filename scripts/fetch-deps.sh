#!/usr/bin/env bash
# Installs the pinned build dependencies that are not system packages into .deps/ (ignored):
# the CUTLASS/CuTe headers from the nvidia-cutlass 4.2.0.0 wheel (headers only, --no-deps).
#
# Optional, with --bench: the mamba_ssm 2.3.2.post1 source distribution from PyPI, checked
# against its sha256 and unpacked to .deps/mamba_ssm-2.3.2.post1. bench/bench.py imports the
# Triton forward (the reference it compares against) from there. It is never committed.
#   scripts/fetch-deps.sh            CUTLASS headers
#   scripts/fetch-deps.sh --bench    CUTLASS headers and the mamba_ssm source
#   scripts/fetch-deps.sh --bench-only   only the mamba_ssm source
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

want_cutlass=1
want_bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    --bench-only) want_bench=1; want_cutlass=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fetch-deps: unknown argument '$arg' (--bench, --bench-only)" >&2; exit 2 ;;
  esac
done

fetch_cutlass() {
  local dest="$root/.deps/cutlass"
  if [ -f "$dest/cutlass_library/source/include/cute/tensor.hpp" ]; then
    echo "fetch-deps: CUTLASS headers already in $dest"
    return 0
  fi
  python3 -m pip install --quiet --no-deps --target "$dest" "nvidia-cutlass==4.2.0.0"
  echo "fetch-deps: CUTLASS 4.2.0.0 headers in $dest/cutlass_library/source/include"
}

MAMBA_VERSION="2.3.2.post1"
MAMBA_URL="https://files.pythonhosted.org/packages/af/48/aa7bec0efc7453fa0512276c0069c854bf684219050294266534bfef34bb/mamba_ssm-${MAMBA_VERSION}.tar.gz"
MAMBA_SHA256="104cc47e9101e5401a675fa2b784f2952b9b037f3b1dd83b5ac544394e95d028"

fetch_mamba_src() {
  local dest="$root/.deps/mamba_ssm-$MAMBA_VERSION"
  if [ -f "$dest/mamba_ssm/ops/triton/ssd_combined.py" ] && [ -f "$dest/.sha256-verified" ]; then
    echo "fetch-deps: mamba_ssm $MAMBA_VERSION source already in $dest"
    return 0
  fi
  mkdir -p "$root/.deps"
  tmp_fetch="$(mktemp -d "$root/.deps/.mamba-fetch.XXXXXX")"
  trap 'rm -rf "$tmp_fetch"' EXIT
  local tmp="$tmp_fetch"
  local tarball="$tmp/mamba_ssm-$MAMBA_VERSION.tar.gz"
  curl --fail --silent --show-error --location --retry 3 --output "$tarball" "$MAMBA_URL"
  local got
  got="$(sha256sum "$tarball" | cut -d' ' -f1)"
  if [ "$got" != "$MAMBA_SHA256" ]; then
    echo "fetch-deps: sha256 mismatch for mamba_ssm-$MAMBA_VERSION.tar.gz: got $got, want $MAMBA_SHA256" >&2
    return 1
  fi
  tar --no-same-owner -xzf "$tarball" -C "$tmp"
  if [ ! -f "$tmp/mamba_ssm-$MAMBA_VERSION/mamba_ssm/ops/triton/ssd_combined.py" ]; then
    echo "fetch-deps: unexpected layout in mamba_ssm-$MAMBA_VERSION.tar.gz" >&2
    return 1
  fi
  echo "$MAMBA_SHA256  mamba_ssm-$MAMBA_VERSION.tar.gz" > "$tmp/mamba_ssm-$MAMBA_VERSION/.sha256-verified"
  rm -rf "$dest"
  mv "$tmp/mamba_ssm-$MAMBA_VERSION" "$dest"
  echo "fetch-deps: mamba_ssm $MAMBA_VERSION source (sha256 verified) in $dest"
}

if [ "$want_cutlass" = 1 ]; then fetch_cutlass; fi
if [ "$want_bench" = 1 ]; then fetch_mamba_src; fi
