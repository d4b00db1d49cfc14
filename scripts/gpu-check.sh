#!/usr/bin/env bash
# Runs on the GPU machine, from the folder gpu-build.sh made: the .cu tests against the CPU
# results, then the GPU benchmark, and writes one JSON file of everything (default:
# gpu-check.json beside this script, or $OUT/gpu-check.json when $OUT is set). Finishes in well
# under 4 minutes on one H100 or H200; each step has its own time limit.
#
#   ./gpu-check.sh [RESULT_JSON]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
result=${1:-${OUT:-$here}/gpu-check.json}
tests=(test_dense_decode test_page_scores test_sparse_decode test_top_k test_page_gather test_hierarchical)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

json_escape() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' 2>/dev/null || sed 's/\\/\\\\/g; s/"/\\"/g; s/\t/\\t/g' | awk 'BEGIN{printf "\""} {printf "%s\\n", $0} END{printf "\""}'; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$work/gpu.txt" 2>&1 || echo "nvidia-smi unavailable" > "$work/gpu.txt"
failed=0
entries=()
for t in "${tests[@]}"; do
  start=$(date +%s.%N)
  timeout 60 "$here/$t" > "$work/$t.txt" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
  case $rc in 0) status=passed ;; 77) status=skipped ;; 124) status=timeout; failed=1 ;; *) status=failed; failed=1 ;; esac
  echo "gpu-check: $t $status ($rc)"
  entries+=("{\"name\": \"$t\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $secs, \"output\": $(json_escape < "$work/$t.txt")}")
done
timeout 150 "$here/bench_gpu" --json "$work/bench.json" > "$work/bench.txt" 2>&1
brc=$?
echo "gpu-check: bench_gpu exit $brc"
[ $brc -eq 0 ] || [ $brc -eq 77 ] || failed=1
{
  echo "{"
  echo "  \"gpu\": $(json_escape < "$work/gpu.txt"),"
  echo "  \"tests\": ["
  for i in "${!entries[@]}"; do
    sep=","; [ "$i" -eq $((${#entries[@]} - 1)) ] && sep=""
    echo "    ${entries[$i]}$sep"
  done
  echo "  ],"
  echo "  \"bench_exit\": $brc,"
  echo "  \"bench_output\": $(json_escape < "$work/bench.txt"),"
  if [ -s "$work/bench.json" ]; then echo "  \"bench\": $(cat "$work/bench.json")"; else echo "  \"bench\": null"; fi
  echo "}"
} > "$result"
echo "gpu-check: wrote $result"
exit $failed
