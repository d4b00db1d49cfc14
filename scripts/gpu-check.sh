#!/usr/bin/env bash
# Runs on the GPU machine, from the folder gpu-build.sh made: the .cu tests against the CPU
# results, then the GPU benchmark, then kvd-llama end to end (a model of SmolLM2's shape with
# seeded weights, each mode decoded on the CPU and with --device cuda; the ids compared), and
# writes one JSON file of everything (default:
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
e2e=()
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
    if [ -s "$work/bench.json" ]; then echo "  \"bench\": $(cat "$work/bench.json"),"; else echo "  \"bench\": null,"; fi
    echo "  \"end_to_end\": ["
    for i in "${!e2e[@]}"; do
      sep=","; [ "$i" -eq $((${#e2e[@]} - 1)) ] && sep=""
      echo "    ${e2e[$i]}$sep"
    done
    echo "  ]"
    echo "}"
  } > "$result.tmp" && mv "$result.tmp" "$result"
}

# KVD_CHECK=e2e runs only the end-to-end part (with KVD_E2E_MODEL, on a real model).
[ "${KVD_CHECK:-all}" = e2e ] && tests=()
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
if [ "${KVD_CHECK:-all}" != e2e ]; then
  timeout 110 "$here/bench_gpu" --json "$work/bench.json" > "$work/bench.txt" 2>&1
  brc=$?
  echo "gpu-check: bench_gpu exit $brc"
  [ $brc -eq 0 ] || failed=1
  write_result
fi

# kvd-llama end to end: the same seeded model and prompt decoded on the CPU and on the GPU. The
# GPU's attention and cuBLAS round differently from the CPU's, and a model of random weights has
# close logits, so the ids may part after a while: the check asks for the first 8 to agree and
# records how many do. It needs libcublas.so.13 (the CUDA 13 toolkit, or pip's nvidia-cublas).
if [ -x "$here/kvd-llama" ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu $(ls -d /usr/local/lib/python3*/*-packages/nvidia/cu13/lib /usr/local/lib/python3*/*-packages/nvidia/cublas/lib 2>/dev/null); do
    if [ -e "$d/libcublas.so.13" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
  done
  ids_of() { tr -s ' ' '\n' < "$1" | grep -E '^[0-9]+$'; }
  if [ -n "${KVD_E2E_MODEL:-}" ]; then  # a real GGUF model: its needle document and question, f32 weights on the CPU as cuBLAS has
    common=(--model "$KVD_E2E_MODEL" --needle "${KVD_E2E_PROMPT:-4000}" --needle-depth 0.5 --needle-seed 1 --steps 24 --print-ids --threads 0)
    cpu_only=(--weights f32)
  else
    common=(--model synthetic:smollm2-shape --prompt-len "${KVD_E2E_PROMPT:-4096}" --steps 32 --ignore-eos --print-ids --threads 0)
    cpu_only=()
  fi
  for mode in dense sparse tiered:serial tiered:elastic; do
    # --tune off: cluster-size tuning times the selection, so its choice (and the index) may differ between runs
    m=${mode%%:*}; extra=(); [ "$m" = tiered ] && extra=(--pipeline "${mode#*:}" --tune off --ssd-path "$here/e2e.store")
    timeout 60 "$here/kvd-llama" "${common[@]}" "${cpu_only[@]}" --mode "$m" "${extra[@]}" --stats-json "$work/cpu.json" > "$work/cpu.txt" 2> "$work/cpu.err"
    crc=$?
    timeout 60 "$here/kvd-llama" "${common[@]}" --mode "$m" "${extra[@]}" --device cuda --stats-json "$work/gpu.json" > "$work/gpu.txt" 2> "$work/gpu.err"
    grc=$?
    ids_of "$work/cpu.txt" > "$work/cpu.ids"; ids_of "$work/gpu.txt" > "$work/gpu.ids"
    same=$(paste -d' ' "$work/cpu.ids" "$work/gpu.ids" | awk '$1 != $2 { exit } { n++ } END { print n + 0 }')
    total=$(wc -l < "$work/gpu.ids")
    # exit 3 is kvd-llama's wrong answer to a needle question: it ran; the ids say whether the devices agree.
    ran() { [ "$1" -eq 0 ] || [ "$1" -eq 3 ]; }
    if ran $crc && ran $grc && [ "$same" -ge 8 ]; then status=passed; else status=failed; failed=1; fi
    echo "gpu-check: kvd-llama $mode $status (cpu exit $crc, cuda exit $grc, $same of $total ids equal)"
    cj=null; [ -s "$work/cpu.json" ] && cj=$(cat "$work/cpu.json")
    gj=null; [ -s "$work/gpu.json" ] && gj=$(cat "$work/gpu.json")
    e2e+=("{\"mode\": \"$mode\", \"status\": \"$status\", \"cpu_exit\": $crc, \"cuda_exit\": $grc, \"ids_equal\": $same, \"ids\": $total, \"cpu_ids\": $(tr '\n' ' ' < "$work/cpu.ids" | json_escape), \"cuda_ids\": $(tr '\n' ' ' < "$work/gpu.ids" | json_escape), \"cpu_stderr\": $(tail -c 4000 "$work/cpu.err" | json_escape), \"cuda_stderr\": $(tail -c 4000 "$work/gpu.err" | json_escape), \"cpu_summary\": $cj, \"cuda_summary\": $gj}")
    rm -f "$work/cpu.json" "$work/gpu.json" "$here"/e2e.store*
    write_result
  done
fi
echo "gpu-check: wrote $result ($([ $failed -eq 0 ] && echo 'all passed' || echo 'FAILURES'))"
exit $failed
