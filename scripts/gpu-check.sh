#!/usr/bin/env bash
# Runs on the GPU machine, from the folder gpu-build.sh made: the .cu tests against the CPU
# results, then the GPU benchmark, and writes one JSON file of everything (default:
# gpu-check.json beside this script, or $OUT/gpu-check.json when $OUT is set), rewritten after
# every step so that a run cut short still leaves what it did. Each test may take 15 s and the
# benchmark 110 s: under 4 minutes in all (a few seconds is usual). Needs only bash 5,
# coreutils, sed and awk. On this machine a test that reports itself skipped (exit 77: no usable
# device, e.g. a driver older than the runtime) is a failure.
#
#   ./gpu-check.sh [RESULT_JSON]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
result=${1:-${OUT:-$here}/gpu-check.json}
tests=(test_dense_decode test_page_scores test_sparse_decode test_top_k test_page_gather test_hierarchical test_device_manager)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A JSON string of stdin: control bytes other than tab and newline dropped.
json_escape() {
  tr -d '\000-\010\013-\037' | sed 's/\\/\\\\/g; s/"/\\"/g; s/\t/\\t/g' | awk 'BEGIN { printf "\"" } { printf "%s\\n", $0 } END { printf "\"" }'
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$work/gpu.txt" 2>&1 || echo "nvidia-smi unavailable" > "$work/gpu.txt"
failed=0
entries=()
brc=null
write_result() {
  {
    echo "{"
    echo "  \"gpu\": $(json_escape < "$work/gpu.txt"),"
    echo "  \"passed\": $([ $failed -eq 0 ] && echo true || echo false),"
    echo "  \"tests\": ["
    local i sep
    for i in "${!entries[@]}"; do
      sep=","; [ "$i" -eq $((${#entries[@]} - 1)) ] && sep=""
      echo "    ${entries[$i]}$sep"
    done
    echo "  ],"
    echo "  \"bench_exit\": $brc,"
    if [ -f "$work/bench.txt" ]; then echo "  \"bench_output\": $(json_escape < "$work/bench.txt"),"; else echo "  \"bench_output\": null,"; fi
    if [ -s "$work/bench.json" ]; then echo "  \"bench\": $(cat "$work/bench.json")"; else echo "  \"bench\": null"; fi
    echo "}"
  } > "$result.tmp" && mv "$result.tmp" "$result"
}

for t in "${tests[@]}"; do
  start=$EPOCHREALTIME
  timeout 15 "$here/$t" > "$work/$t.txt" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
  case $rc in 0) status=passed ;; 77) status=skipped; failed=1 ;; 124) status=timeout; failed=1 ;; *) status=failed; failed=1 ;; esac
  echo "gpu-check: $t $status ($rc)"
  entries+=("{\"name\": \"$t\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $secs, \"output\": $(json_escape < "$work/$t.txt")}")
  write_result
done
timeout 110 "$here/bench_gpu" --json "$work/bench.json" > "$work/bench.txt" 2>&1
brc=$?
echo "gpu-check: bench_gpu exit $brc"
[ $brc -eq 0 ] || failed=1
write_result
echo "gpu-check: wrote $result ($([ $failed -eq 0 ] && echo 'all passed' || echo 'FAILURES'))"
exit $failed
