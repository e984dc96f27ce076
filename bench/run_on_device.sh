#!/usr/bin/env bash
# The benchmark run on the H200 machine, from the repository root, writing everything to $OUT.
#
# Before it (here, once): scripts/fetch-deps.sh --bench   (mamba_ssm 2.3.2.post1 source in .deps/)
# On the device, the package must be built and installed first, e.g. in an earlier call:
#   python3 -m pip install --no-build-isolation --no-deps .
# and the call that runs this script must carry the mamba_ssm tree (it is git-ignored):
#   carry: [".deps/mamba_ssm-2.3.2.post1"]
#
#   bash bench/run_on_device.sh [full|quick|anchor|models|breakdown] [extra bench.py arguments]
#
#   full (default)  anchor + models sweeps, then the per-kernel breakdown (4 x 64K, dstate 128);
#                   no shape starts after 480 s, so the whole run ends inside a 10-minute call
#                   (expected: 4-6 minutes, most of it Triton's first-call autotuning per shape class)
#   quick           anchor at 1K/16K/64K + models, 0.1 s per measurement (about 3 minutes)
#   anchor, models  one sweep; breakdown: only the breakdown
#
# Outputs in $OUT: bench.log, results.json, results.csv, breakdown.csv, env.txt, PERFORMANCE.md
# (docs/PERFORMANCE.md regenerated from this run, its design log kept) and the plot next to it,
# performance-anchor.png (anchor.png when the report fails): 7 files. Back here:
#   python3 bench/make_report.py <fetched>/results.json      # rewrites docs/PERFORMANCE.md
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/bench}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Never touch the NVLink multicast settings of the device image (see the device notes).

mode="${1:-full}"
[ $# -gt 0 ] && shift
case "$mode" in
  full)      args=(--sweep anchor,models --breakdown --time-limit-s 480) ;;
  quick)     args=(--sweep anchor,models --quick --breakdown --time-limit-s 480) ;;
  anchor)    args=(--sweep anchor --time-limit-s 480) ;;
  models)    args=(--sweep models --time-limit-s 480) ;;
  breakdown) args=(--breakdown) ;;
  *) echo "run_on_device: unknown mode '$mode' (full, quick, anchor, models, breakdown)" >&2; exit 2 ;;
esac

MAMBA_SRC="${MAMBA_SRC:-.deps/mamba_ssm-2.3.2.post1}"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
    --format=csv 2>&1 || true
  python3 - <<'EOF' 2>&1
import sys, torch, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| triton", triton.__version__, "| GPUs", torch.cuda.device_count())
try:
    import mamba2_ssd
    print("mamba2_ssd", getattr(mamba2_ssd, "__version__", "?"), "from", mamba2_ssd.__file__)
except Exception as e:
    print("mamba2_ssd NOT importable:", repr(e))
for m in ("einops", "packaging", "matplotlib", "numpy"):
    try:
        __import__(m)
    except Exception as e:
        print(m, "NOT importable:", repr(e))
EOF
} | tee "$OUT/env.txt"

# torch first, as bench.py does: on the H200 (2026-11-29) this check without it crashed at
# interpreter exit (open defect, docs/PERFORMANCE.md).
if ! python3 -c "import torch, mamba2_ssd; mamba2_ssd.mamba_chunk_scan_combined" 2>/dev/null; then
  if [ "${ALLOW_TRITON_ONLY:-0}" != 1 ]; then
    echo "run_on_device: mamba2_ssd is not installed (python3 -m pip install --no-build-isolation --no-deps .);" \
         "set ALLOW_TRITON_ONLY=1 to time the Triton reference alone" >&2
    exit 3
  fi
fi
if [ ! -f "$MAMBA_SRC/mamba_ssm/ops/triton/ssd_combined.py" ]; then
  echo "run_on_device: no mamba_ssm source at $MAMBA_SRC: run scripts/fetch-deps.sh --bench here and carry" \
       "\".deps/mamba_ssm-2.3.2.post1\" (or set MAMBA_SRC)" >&2
  exit 3
fi

python3 bench/bench.py "${args[@]}" --mamba-src "$MAMBA_SRC" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}

if [ -f "$OUT/results.json" ]; then
  if [ -f docs/PERFORMANCE.md ]; then cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"; fi
  python3 bench/make_report.py "$OUT/results.json" --doc "$OUT/PERFORMANCE.md" || true
  # make_report draws the plot next to the document it writes (performance-anchor.png); bench.py's
  # copy of the same plot goes, so that everything fits in the 8 files the device returns
  if [ -f "$OUT/performance-anchor.png" ]; then rm -f "$OUT/anchor.png"; fi
fi
exit "$rc"
