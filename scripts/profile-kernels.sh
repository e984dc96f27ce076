#!/usr/bin/env bash
# Per-kernel GPU time of one forward (Nsight Compute, clocks left alone) and the whole forward
# by CUDA graph replay (the CLI's --graph), for kernel variants given as environment settings.
#   scripts/profile-kernels.sh [mamba2-ssd run flags...]
#   VARIANTS="MAMBA2_SSD_PASS_STATE_NT=32;MAMBA2_SSD_PASS_STATE_NT=64" scripts/profile-kernels.sh --seqlen 65536
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cli="${CLI:-$root/build-gpu/apps/mamba2-ssd}"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--batch 4 --seqlen 65536 --heads 8 --headdim 64 --groups 1 --dstate 128 --chunk 128)
IFS=';' read -r -a variants <<<"${VARIANTS:-default}"
echo "shape: ${args[*]}"
for var in "${variants[@]}"; do
  envs=()
  [ "$var" != "default" ] && read -r -a envs <<<"$var"
  graph=$(env "${envs[@]}" "$cli" run "${args[@]}" --graph --iters 50 --warmup 5 2>&1 | grep -E "^ *time" | head -1)
  per_kernel=$(env "${envs[@]}" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "$cli" run "${args[@]}" --iters 1 --warmup 0 2>/dev/null |
    awk -F'","' '/gpu__time_duration/ {
        name = $5; gsub(/\(anonymous namespace\)::|mamba2_ssd::kernels::|cutlass::/, "", name);
        sub(/\([^()]*\)$/, "", name); sub(/^void /, "", name); gsub(/ /, "", name);
        unit = $(NF-1); v = $NF; gsub(/"/, "", v); gsub(/,/, "", v);
        if (unit == "nsecond" || unit == "ns") v = v / 1000.0; else if (unit == "msecond" || unit == "ms") v = v * 1000.0;
        t[name] += v } END { for (k in t) printf("%s=%.1fus ", k, t[k]) }')
  echo "[$var] ${graph# *} | $per_kernel"
done
