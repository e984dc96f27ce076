#!/usr/bin/env bash
# One command for the H200 machine: builds, runs every C++ test (CPU and GPU), runs
# compute-sanitizer memcheck and racecheck on small shapes, times the anchor shape, and prints a
# summary last. Logs go to $OUT (or ./out). Needs the CUTLASS headers in .deps (scripts/fetch-deps.sh
# on a machine with network; carry .deps to the GPU machine) and GoogleTest (system package or
# .deps/googletest).
#   scripts/gpu-check.sh            everything
#   SKIP_SANITIZER=1 scripts/gpu-check.sh
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
t_start=$(date +%s)
status=()

log() { echo "[gpu-check] $*"; }

log "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
log "nvcc: $(nvcc --version | tail -1)"

# ---- build
t0=$(date +%s)
if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/configure.log" 2>&1 &&
   cmake --build "$build" -j "$jobs" --target test_gpu test_reference test_validate test_tuning >"$out/build.log" 2>&1; then
  status+=("build: ok ($(( $(date +%s) - t0 )) s)")
  # The CLI is only needed for the timing at the end: its failure is reported, not fatal.
  cmake --build "$build" -j "$jobs" --target mamba2_ssd_cli >>"$out/build.log" 2>&1 || status+=("cli build: FAILED")
else
  tail -40 "$out/configure.log" "$out/build.log"
  log "BUILD FAILED"
  exit 1
fi

# ---- CPU tests (reference, validation)
cpu_line="cpu tests: not run"
if "$build/tests/test_reference" --gtest_brief=1 >"$out/test_reference.log" 2>&1 &&
   "$build/tests/test_validate" --gtest_brief=1 >"$out/test_validate.log" 2>&1 &&
   "$build/tests/test_tuning" --gtest_brief=1 >"$out/test_tuning.log" 2>&1; then
  cpu_line="cpu tests: ok"
else
  cpu_line="cpu tests: FAILED (see test_reference.log / test_validate.log / test_tuning.log)"
fi
cpu_counts=$(cat "$out/test_reference.log" "$out/test_validate.log" "$out/test_tuning.log" | grep -E "^\[  PASSED  \]|^\[  FAILED  \]|tests? ran" | tr '\n' ' ')
status+=("$cpu_line: $cpu_counts")

# ---- GPU tests
t0=$(date +%s)
"$build/tests/test_gpu" >"$out/test_gpu.log" 2>&1
gpu_rc=$?
gpu_counts=$(grep -E "^\[==========\] .* ran|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|^\[  FAILED  \] [0-9]" "$out/test_gpu.log" | tr '\n' ' ')
status+=("gpu tests: rc=$gpu_rc ($(( $(date +%s) - t0 )) s) $gpu_counts")
grep -E "^\[  FAILED  \]" "$out/test_gpu.log" | head -20

# ---- compute-sanitizer on small shapes
if [ -z "${SKIP_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
  small="Gpu.SeqIdxInsideAndOnChunkEdges:Gpu.VarlenLayout:Gpu.BatchedCuSeqlensVarlenStates:Gpu.SeqlenOneAndPartialChunks:Gpu.WalkSegments:Gpu.FusedWalk:Gpu.Chunk256RunsAs128:Gpu.WorkspaceFollowsTheSettings"
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test_gpu" --gtest_filter="$small" \
      >"$out/sanitizer_$tool.log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_$tool.log" | tail -1)
    status+=("sanitizer $tool: rc=$rc ($(( $(date +%s) - t0 )) s) ${summary:-no summary line}")
  done
fi

# ---- first look at the anchor shape (batch 4, 8 heads, headdim 64, dstate 128, chunk 128, 64K)
if [ -x "$build/apps/mamba2-ssd" ]; then
  "$build/apps/mamba2-ssd" run --batch 4 --seqlen 65536 --heads 8 --headdim 64 --groups 1 --dstate 128 \
    --chunk 128 --iters 20 >"$out/anchor_run.log" 2>&1
  status+=("anchor 64K: $(grep -iE "time|ms" "$out/anchor_run.log" | head -2 | tr '\n' ' ')")
fi

# ---- summary (last)
echo
echo "==================== gpu-check summary ===================="
for s in "${status[@]}"; do echo "  $s"; done
echo "  worst relative L2 error per option group (out / final / varlen / chunk states):"
awk '/^\[gpu-err\]/ {
  split($2, g, "="); grp = g[2];
  for (i = 3; i <= 6; ++i) { split($i, kv, "="); v = kv[2] + 0; k = grp SUBSEP i; if (!(k in w) || v > w[k]) w[k] = v }
  groups[grp] = 1; n[grp]++
} END {
  for (grp in groups) printf("    %-14s n=%-3d out=%.2e final=%.2e varlen=%.2e chunk=%.2e\n", grp, n[grp],
    w[grp SUBSEP 3], w[grp SUBSEP 4], w[grp SUBSEP 5], w[grp SUBSEP 6])
}' "$out/test_gpu.log" | sort
echo "  total time: $(( $(date +%s) - t_start )) s; logs in $out"
[ "$gpu_rc" -eq 0 ]
