#!/usr/bin/env python3
"""Decision 2 on the real model, through the program as a user runs it: `kvd-llama --mode tiered`
with its defaults (the tiers sized so that the SSD serves reads, as `make demo` does) decodes the
same tokens as `--mode sparse` on SmolLM2 reading a needle document.

usage: kvd_llama_tiered_tokens.py KVD_LLAMA WORK_DIR

Skips (exit 77) when the model is not in ${KVD_MODEL_DIR:-~/.cache/kvdrive/models} (run
scripts/get-model), except under KVD_REQUIRE_MODEL=1, where that fails."""
import json
import os
import subprocess
import sys

MODEL = os.path.join(os.environ.get("KVD_MODEL_DIR") or os.path.expanduser("~/.cache/kvdrive/models"),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
# make demo's document and question, at half its length; 16 MB of fast tier and 8 MiB of DRAM
# tier hold about half of its 47 MB of f16 KV, so the rest is read from the SSD store.
PROMPT = ["--model", "smollm2", "--needle", "2000", "--needle-depth", "0.5", "--needle-seed", "1", "--steps", "24",
          "--ignore-eos", "--threads", "2", "--budget", "0.0625"]
TIERS = ["--fast-bytes", "16000000", "--host-bytes", "8388608"]


def generated(kvd, work, mode, extra):
    stats = os.path.join(work, f"tiered-tokens-{mode}.json")
    cmd = [kvd] + PROMPT + ["--mode", mode, "--stats-json", stats] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 3):  # 3: a wrong answer, which still has tokens to compare
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}")
    with open(stats) as f:
        j = json.load(f)
    return j["generated"], j


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kvd, work = sys.argv[1], sys.argv[2]
    if not os.path.isfile(MODEL):
        if os.environ.get("KVD_REQUIRE_MODEL") == "1":
            sys.exit(f"FAIL: KVD_REQUIRE_MODEL=1 but {MODEL} is missing (run scripts/get-model)")
        print(f"SKIP: {MODEL} is missing (run scripts/get-model)")
        sys.exit(77)
    sparse, _ = generated(kvd, work, "sparse", [])
    tiered, stats = generated(kvd, work, "tiered", TIERS + ["--ssd-path", os.path.join(work, "tiered-tokens.store")])
    ssd_kib = stats.get("tier_reads", {}).get("ssd", {}).get("kib_per_token", 0.0)
    print(f"sparse:  {sparse}\ntiered:  {tiered}\ntiered read {ssd_kib:.1f} KiB per token from the SSD store")
    if ssd_kib <= 0:
        sys.exit("FAIL: the tiered run read nothing from the SSD store, so it did not test the tiers")
    if len(sparse) != 24 or sparse != tiered:
        sys.exit("FAIL: --mode tiered with its defaults decoded other tokens than --mode sparse")
    print("PASS: the same 24 tokens")


if __name__ == "__main__":
    main()
