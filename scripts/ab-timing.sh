#!/usr/bin/env bash
# GPU time of several (binary, environment, shape) cases by CLI graph replay, for comparing builds
# and settings on the H200 in one job: every case runs once in file order, then once in reverse
# order (A B .. B A), and the table gives both means and their average. Needs built CLIs.
#
#   scripts/ab-timing.sh CASES [REPLAYS]
#
# CASES: one case per line, `label | binary | env | flags`, e.g.
#   n256 16K seg4 new | build-gpu/apps/mamba2-ssd | MAMBA2_SSD_PASS_STATE_SEGMENTS=4 | --seqlen 16384 --dstate 256
# (env: space-separated VAR=value, or '-'; flags: mamba2-ssd run flags). Empty lines and lines
# starting with # are skipped. The tuning cache is off (MAMBA2_SSD_TUNING_CACHE=off) unless a
# case sets it. REPLAYS: graph replays per run (default 60, after 5 warm-up calls).
set -uo pipefail
cases_file="${1:?usage: scripts/ab-timing.sh CASES [REPLAYS]}"
replays="${2:-60}"
mapfile -t lines < <(grep -v '^[[:space:]]*\(#\|$\)' "$cases_file")
n=${#lines[@]}
declare -a first second

# The time per call of one run, in microseconds ("time   41.2 us per call ..."), or "fail".
time_us() {
  local bin="$1" env="$2" flags="$3" out
  # shellcheck disable=SC2086
  out=$(env MAMBA2_SSD_TUNING_CACHE=off $([ "$env" = "-" ] || echo "$env") timeout 120 "$bin" run --graph \
        --iters "$replays" --warmup 5 $flags 2>&1)
  echo "$out" | awk '/^  time /{v=$2; u=$3; if (u=="ms") v*=1000; else if (u=="s") v*=1e6; else if (u=="ns") v/=1000;
                     printf "%.2f", v; found=1} END{if (!found) printf "fail"}'
}
field() { echo "$1" | awk -F'|' -v i="$2" '{gsub(/^[ \t]+|[ \t]+$/, "", $i); print $i}'; }

for ((i = 0; i < n; ++i)); do
  first[i]=$(time_us "$(field "${lines[i]}" 2)" "$(field "${lines[i]}" 3)" "$(field "${lines[i]}" 4)")
done
for ((i = n - 1; i >= 0; --i)); do
  second[i]=$(time_us "$(field "${lines[i]}" 2)" "$(field "${lines[i]}" 3)" "$(field "${lines[i]}" 4)")
done
printf '%-40s %10s %10s %10s\n' "case" "pass 1 us" "pass 2 us" "mean us"
for ((i = 0; i < n; ++i)); do
  mean=$(awk -v a="${first[i]}" -v b="${second[i]}" 'BEGIN{if (a=="fail"||b=="fail") print "fail"; else printf "%.2f", (a+b)/2}')
  printf '%-40s %10s %10s %10s\n' "$(field "${lines[i]}" 1)" "${first[i]}" "${second[i]}" "$mean"
done
