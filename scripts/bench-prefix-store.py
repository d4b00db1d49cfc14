#!/usr/bin/env python3
"""The local prefix store's benchmark (docs/remote.md): the main job's document (make demo's
needle task on SmolLM2) asked twice through kvd-llama --prefix-store, the second time with a new
question, as a restarted engine would. It prints, side by side in one run:

  1. first   the standard question, an empty store: computes everything, stores the pages
  2. second  a new question, the store of run 1: reads the document's pages back
  3. cold    the new question again, without a store: what run 2 must reproduce

and the ratio of run 2's prefill time to run 3's, the tokens read back, and whether runs 2 and 3
generated the same token ids. Usage: scripts/bench-prefix-store.py [--build build] [--tokens 4000]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

QUESTION = "Which licences does the text quote? Name two."


def run(kvd, args, stats):
    cmd = [kvd, *args, "--stats-json", stats, "--print-ids"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode not in (0, 3):  # 3: the reply missed the expected answer (kvd-llama's kWrongAnswer)
        sys.exit(f"bench-prefix-store: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    with open(stats) as f:
        j = json.load(f)
    ids = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return j, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tokens", type=int, default=4000, help="the needle document's tokens (make demo: 4000)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    kvd = os.path.join(a.build, "examples", "llama3", "kvd-llama")
    work = tempfile.mkdtemp(prefix="kvd-prefix-bench-")
    try:
        store = os.path.join(work, "prefixes")
        base = ["--model", "smollm2", "--needle", str(a.tokens), "--needle-depth", "0.5", "--needle-seed", "1",
                "--steps", str(a.steps), "--ignore-eos", "--threads", str(a.threads), "--mode", "sparse", "--budget", "0.0625"]
        first, _ = run(kvd, [*base, "--prefix-store", store], os.path.join(work, "1.json"))
        second, ids2 = run(kvd, [*base, "--question", QUESTION, "--prefix-store", store], os.path.join(work, "2.json"))
        cold, ids3 = run(kvd, [*base, "--question", QUESTION], os.path.join(work, "3.json"))
        store_bytes = sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store) if f.endswith(".kvp"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def line(name, j):
        r = j.get("remote", {})
        print(f"{name:7s} prompt {j['prompt_tokens']:5d} tokens  prefill {j['time_ms']['prefill'] / 1000:7.2f} s  "
              f"read back {r.get('loaded_tokens', 0):5d} tokens ({r.get('load_ms', 0) / 1000:.2f} s)  "
              f"pages stored {r.get('pages_published', 0)}")

    line("first", first)
    line("second", second)
    line("cold", cold)
    print(f"store: {store_bytes / 2**20:.1f} MiB of page files")
    print(f"second / cold prefill time: {second['time_ms']['prefill'] / cold['time_ms']['prefill']:.3f}x "
          f"(first / cold: {first['time_ms']['prefill'] / cold['time_ms']['prefill']:.3f}x, the cost of storing)")
    print(f"second and cold generated the same ids: {'yes' if ids2 == ids3 and ids2 else 'NO'}")
    return 0 if ids2 == ids3 and ids2 else 1


if __name__ == "__main__":
    sys.exit(main())
