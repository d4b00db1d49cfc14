#!/usr/bin/env bash
# make fuzz: runs every libFuzzer target of BUILD (made with -DKVD_FUZZ=ON) for SECONDS each,
# starting from the seeds kvd-fuzz-seeds writes and the corpus earlier runs grew (BUILD/corpus).
# A crash, a hang (10 s per input), a leak or an allocation over 2 GiB stops the target and fails
# the run; libFuzzer leaves the input as BUILD/findings/<target>/crash-*, to become a regression
# test. Prints the executions and the coverage (libFuzzer's cov: edges) each target reached.
# With RUNS, a target stops after RUNS executions or SECONDS, whichever comes first. FUZZ_TARGETS
# (names separated by spaces) runs only those targets.
#
#   scripts/fuzz.sh BUILD [SECONDS] [RUNS]
set -uo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD [SECONDS]}
secs=${2:-60}
runs_cap=${3:-}
targets=(fuzz_llama2c fuzz_safetensors fuzz_hf_config fuzz_tokenizer_llama2c fuzz_tokenizer_tiktoken fuzz_hf_index fuzz_trace fuzz_ssd_recover fuzz_args fuzz_redis_url fuzz_gguf fuzz_tokenizer_gguf)
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a targets <<< "$FUZZ_TARGETS"; fi
# Input size caps where the corpus's largest file would otherwise set it: the store's log needs a
# few 4 KiB blocks, not the 200 KB inputs it grew to (each input is a whole store opened and read).
declare -A max_len=([fuzz_ssd_recover]=32768)
"$build/fuzz/kvd-fuzz-seeds" "$build/seeds" || exit 1
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/findings/$t" "$build/seeds/$t"
  log="$build/findings/$t/run.log"
  "$build/fuzz/$t" -max_total_time="$secs" ${runs_cap:+-runs="$runs_cap"} ${max_len[$t]:+-max_len=${max_len[$t]}} -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t/" "$build/corpus/$t" "$build/seeds/$t" > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    took=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' | tail -1)
    echo "fuzz: $t: ${runs:-?} executions in ${took:-$secs} s, ${cov:-no coverage line}, nothing found"
  else
    failed=1
    echo "fuzz: $t: FAILED (exit $rc) after ${runs:-?} executions; see $log and $build/findings/$t/"
    grep -m 3 -E 'ERROR|SUMMARY|terminate|uncaught' "$log" | sed 's/^/  /'
  fi
done
exit $failed
