#!/usr/bin/env bash
# Kernel-variant timings on the shapes that matter (anchor and model layers), for a list of
# environment settings: CUDA-graph time of the whole forward plus per-kernel times (ncu), one line
# per (shape, variant). Needs a built CLI (build-gpu/apps/mamba2-ssd) on an H200.
#   VARIANTS="MAMBA2_SSD_HEADS_PER_CTA=1;MAMBA2_SSD_HEADS_PER_CTA=2" scripts/perf-variants.sh [shape...]
# Shapes: anchor16k anchor64k n64_64k n256_64k model4x8k model1x64k groups8
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
declare -A shapes=(
  [anchor16k]="--batch 4 --seqlen 16384 --heads 8 --headdim 64 --groups 1 --dstate 128 --chunk 128"
  [anchor64k]="--batch 4 --seqlen 65536 --heads 8 --headdim 64 --groups 1 --dstate 128 --chunk 128"
  [n64_64k]="--batch 4 --seqlen 65536 --heads 8 --headdim 64 --groups 1 --dstate 64 --chunk 128"
  [n256_64k]="--batch 4 --seqlen 65536 --heads 8 --headdim 64 --groups 1 --dstate 256 --chunk 128"
  [model4x8k]="--batch 4 --seqlen 8192 --heads 80 --headdim 64 --groups 1 --dstate 128 --chunk 256 --no-init --no-final --dt-bias --softplus"
  [model1x64k]="--batch 1 --seqlen 65536 --heads 80 --headdim 64 --groups 1 --dstate 128 --chunk 256 --no-init --no-final --dt-bias --softplus"
  [groups8]="--batch 8 --seqlen 4096 --heads 64 --headdim 64 --groups 8 --dstate 64 --chunk 256 --no-init --no-final --dt-bias --softplus"
)
list=("$@")
[ ${#list[@]} -eq 0 ] && list=(anchor64k model4x8k groups8)
for name in "${list[@]}"; do
  echo "== $name: ${shapes[$name]}"
  # shellcheck disable=SC2086
  "$root/scripts/profile-kernels.sh" ${shapes[$name]}
done
