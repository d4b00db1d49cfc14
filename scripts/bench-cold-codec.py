#!/usr/bin/env python3
"""Cold-page codecs on the real model (docs/codecs.md): kvd-llama on SmolLM2 reading make demo's
needle document (the licence texts) at --tokens of context, sparse Hierarchical at --budget, with
cold pages in the KV dtype, INT8 and INT4, each twice:

  dram     sparse mode: every page in DRAM (the fast tier alone; cold pages coded in place)
  tiered   a DRAM cache of --fast-bytes (small by default, so that most selected pages are
           misses) + SSD store: misses read from the SSD
           (--tune off: the same index as dram, so by Decision 2 the same ids)

It prints, side by side in one run:
  - SSD bytes read per decoded token (as stored: coded bytes) and their ratio to the KV dtype's;
  - decode tokens/s, and tiered's decode time over DRAM-only's (the goal: within 1.2x);
  - whether dram and tiered generated the same ids for each codec (Decision 2 on the real model).

Usage: scripts/bench-cold-codec.py [--build build] [--tokens 8000] [--steps 32] [--threads 2] [--fast-bytes N]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

READS = re.compile(r"bytes read per decoded token .*: (.*)$", re.M)
IDS = re.compile(r"^generated ids: (.*)$", re.M)


def run(kvd, args, stats):
    cmd = [kvd, *args, "--stats-json", stats]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode not in (0, 3):  # 3: the reply missed the expected answer
        sys.exit(f"bench-cold-codec: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    with open(stats) as f:
        j = json.load(f)
    m = IDS.search(out.stdout)
    ids = m.group(1).strip() if m else ""  # the summary's first 32 ids
    ssd_kib = 0.0
    m = READS.search(out.stdout)
    if m:
        for part in m.group(1).split(","):
            name, kib = part.split()[0], float(part.split()[1])
            if name == "ssd":
                ssd_kib = kib
    return j, ids, ssd_kib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", default="0.0625")
    ap.add_argument("--fast-bytes", default=str(16 << 20), help="tiered: the DRAM cache (kvd-llama --fast-bytes)")
    a = ap.parse_args()
    kvd = os.path.join(a.build, "examples", "llama3", "kvd-llama")
    work = tempfile.mkdtemp(prefix="kvd-codec-bench-")
    rows = {}
    try:
        base = ["--model", "smollm2", "--needle", str(a.tokens), "--needle-depth", "0.5", "--needle-seed", "1", "--steps", str(a.steps),
                "--ignore-eos", "--threads", str(a.threads), "--budget", a.budget]
        for codec in ("none", "int8", "int4"):
            for mode in ("dram", "tiered"):
                extra = ["--mode", "sparse"] if mode == "dram" else ["--mode", "tiered", "--tune", "off", "--fast-bytes", a.fast_bytes, "--ssd-path", os.path.join(work, "store")]
                j, ids, ssd = run(kvd, [*base, *extra, "--cold-codec", codec], os.path.join(work, f"{codec}-{mode}.json"))
                rows[(codec, mode)] = (j, ids, ssd)
                print(f"{codec:5s} {mode:7s} decode {j['decode_tokens_per_s']:6.2f} tokens/s  ssd {ssd:6.1f} KiB/token  "
                      f"prefill {j['time_ms']['prefill'] / 1000:6.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    none_ssd = rows[("none", "tiered")][2]
    for codec in ("none", "int8", "int4"):
        dram, tiered = rows[(codec, "dram")], rows[(codec, "tiered")]
        ratio = dram[0]["decode_tokens_per_s"] / tiered[0]["decode_tokens_per_s"]
        same = dram[1] == tiered[1] and dram[1] != ""
        print(f"{codec:5s} SSD bytes per token {tiered[2]:6.1f} KiB ({tiered[2] / none_ssd if none_ssd else 0:.3f}x of none)  "
              f"tiered / DRAM-only decode time {ratio:.3f}x  dram and tiered ids the same: {'yes' if same else 'NO'}")
    return 0 if all(rows[(c, "dram")][1] == rows[(c, "tiered")][1] for c in ("none", "int8", "int4")) else 1


if __name__ == "__main__":
    sys.exit(main())
