#!/usr/bin/env python3
"""Cold-page codecs on the real model (docs/codecs.md): kvd-llama on SmolLM2 reading make demo's
needle document (the licence texts) at --tokens of context, sparse Hierarchical at --budget, with
cold pages in the KV dtype, INT8 and INT4. Three parts, side by side in one run:

  bytes     every page in DRAM (sparse mode) against a small DRAM cache (--miss-fast-bytes, no
            lookahead room, so most selected pages are misses) + an SSD store: the SSD bytes per
            decoded token, as stored (logical) and as read from the device (whole 4 KiB blocks;
            small pages packed several to a block), per codec, and the KV dtype once more with
            the store unpacked (--ssd-pack off: one page per block, the layout before packing).
            --tune off everywhere, so that every run has the same index and by Decision 2 the
            same ids: the script checks it.
  speed     DRAM only against a DRAM cache of --fast-bytes with a lookahead window + SSD: decode
            tokens/s and their ratio (the goal: DRAM + SSD within 1.2x of DRAM only).
  capacity  a fixed DRAM budget for pages (--host-bytes, a DRAM tier below the cache): one run
            per codec at --tokens, where none of them fits, and the pages the tier then holds
            (its own count), as tokens of context (pages x page tokens / (layers x KV heads)):
            the longest context whose pages that DRAM holds.

Writes --json (for scripts/report_cold_codec.py: docs/results.md's section and plot).

Usage: scripts/bench-cold-codec.py [--build build] [--tokens 8000] [--steps 32] [--threads 2] [--json FILE]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

IDS = re.compile(r"^generated ids: (.*)$", re.M)
CODECS = ("none", "int8", "int4")

# SmolLM2-135M: what a page takes in DRAM (kvd-llama's host tier: the coded page rounded up to
# 64 bytes; the KV dtype's page as is), for the capacity part. Checked against the run's own
# "cold pages" line.
LAYERS, KV_HEADS, PAGE_TOKENS = 30, 3, 8
HOST_SLOT = {"none": 2048, "int8": 1216, "int4": 704}
STORED = {"none": 2048, "int8": 1184, "int4": 672}


def run(kvd, args, stats):
    cmd = [kvd, *args, "--stats-json", stats]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode not in (0, 3):  # 3: the reply missed the expected answer
        sys.exit(f"bench-cold-codec: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    with open(stats) as f:
        j = json.load(f)
    m = IDS.search(out.stdout)
    j["ids"] = m.group(1).strip() if m else ""  # the summary's first 32 ids
    m = re.search(r"host [\d.]+ MiB \((\d+) pages stored\)", out.stdout)
    if m:
        j["host_pages"] = int(m.group(1))
    m = re.search(r"cold pages \S+ \((\d+) of (\d+) bytes\)", out.stdout)
    if m:
        j["stored_page_bytes"] = int(m.group(1))
    j["command"] = " ".join(os.path.relpath(a) if a == kvd else a for a in cmd)
    return j


def ssd_reads(j):
    r = j.get("tier_reads", {}).get("ssd", {})
    return r.get("kib_per_token", 0.0), r.get("device_kib_per_token", 0.0)


def ssd_ios(j):
    return j.get("tier_reads", {}).get("ssd", {}).get("device_reads_per_token", 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", default="0.0625")
    ap.add_argument("--miss-fast-bytes", default=str(16 << 20), help="bytes: the DRAM cache, with no room for a lookahead window")
    ap.add_argument("--fast-bytes", default=str(48 << 20), help="speed and capacity: the DRAM cache (a lookahead window)")
    ap.add_argument("--host-bytes", default=str(48 << 20), help="capacity: the DRAM tier below the cache")
    ap.add_argument("--parts", default="bytes,speed,capacity")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    kvd = os.path.join(a.build, "examples", "llama3", "kvd-llama")
    parts = a.parts.split(",")
    work = tempfile.mkdtemp(prefix="kvd-codec-bench-")
    store = os.path.join(work, "store")
    res = {"tokens": a.tokens, "steps": a.steps, "budget": float(a.budget), "threads": a.threads, "bytes": {}, "speed": {},
           "capacity": {}}

    def base(tokens):
        return ["--model", "smollm2", "--needle", str(tokens), "--needle-depth", "0.5", "--needle-seed", "1", "--steps", str(a.steps),
                "--ignore-eos", "--threads", str(a.threads), "--budget", a.budget]

    def dram(codec, tokens=a.tokens):
        j = res["speed"].get(codec, {}).get("dram") if tokens == a.tokens else None
        return j or run(kvd, [*base(tokens), "--mode", "sparse", "--cold-codec", codec], os.path.join(work, f"{codec}-dram.json"))

    def tiered(codec, fast, name, extra=(), tokens=a.tokens):
        return run(kvd, [*base(tokens), "--mode", "tiered", "--tune", "off", "--fast-bytes", fast, "--ssd-path", store, "--cold-codec", codec, *extra],
                   os.path.join(work, f"{codec}-{name}.json"))

    try:
        if "speed" in parts or "bytes" in parts:
            for codec in CODECS:
                res["speed"].setdefault(codec, {})["dram"] = dram(codec)
                print(f"{codec:5s} dram     decode {res['speed'][codec]['dram']['decode_tokens_per_s']:6.2f} tokens/s", flush=True)
        if "bytes" in parts:
            for codec, pack in [(c, "on") for c in CODECS] + [("none", "off")]:
                name = codec if pack == "on" else f"{codec}-unpacked"
                j = tiered(codec, a.miss_fast_bytes, f"miss-{pack}", ["--ssd-pack", pack])
                res["bytes"][name] = j
                logical, device = ssd_reads(j)
                print(f"{name:14s} misses   decode {j['decode_tokens_per_s']:6.2f} tokens/s  ssd {logical:7.1f} KiB/token as stored, "
                      f"{device:7.1f} KiB/token from the device in {ssd_ios(j):.0f} reads  hit rate {j['attention']['hit_rate']:.3f}", flush=True)
        if "speed" in parts:
            for codec in CODECS:
                j = tiered(codec, a.fast_bytes, "cache")
                res["speed"][codec]["tiered"] = j
                logical, device = ssd_reads(j)
                print(f"{codec:5s} cache    decode {j['decode_tokens_per_s']:6.2f} tokens/s  ssd {logical:7.1f} KiB/token as stored, "
                      f"{device:7.1f} from the device  hit rate {j['attention']['hit_rate']:.3f}", flush=True)
        if "capacity" in parts:
            dram_bytes = int(a.fast_bytes) + int(a.host_bytes)
            per_token = {c: LAYERS * KV_HEADS * HOST_SLOT[c] / PAGE_TOKENS for c in CODECS}
            res["capacity"] = {"dram_bytes": dram_bytes, "fast_bytes": int(a.fast_bytes), "host_bytes": int(a.host_bytes),
                               "host_bytes_per_token": per_token, "context": a.tokens, "runs": {}, "longest_context": {}}
            for codec in CODECS:
                j = tiered(codec, a.fast_bytes, "capacity", ["--host-bytes", a.host_bytes])
                res["capacity"]["runs"][codec] = j
                held = j.get("host_pages", 0) * PAGE_TOKENS // (LAYERS * KV_HEADS)
                res["capacity"]["longest_context"][codec] = held
                logical, device = ssd_reads(j)
                print(f"{codec:5s} DRAM tier {int(a.host_bytes) >> 20} MiB at {a.tokens} tokens: holds {j.get('host_pages', 0)} pages "
                      f"({held} tokens of context); ssd {logical:7.1f} KiB/token as stored, {device:7.1f} from the device; decode "
                      f"{j['decode_tokens_per_s']:6.2f} tokens/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    ok = True
    for codec in CODECS:
        got = res["speed"].get(codec, {}).get("dram", {}).get("stored_page_bytes")
        if got and codec != "none" and got != STORED[codec]:
            sys.exit(f"bench-cold-codec: kvd-llama stores {got}-byte {codec} pages; this script assumes {STORED[codec]}")
    if res["bytes"]:
        none_l, none_d = ssd_reads(res["bytes"]["none"])
        for name, j in res["bytes"].items():
            logical, device = ssd_reads(j)
            codec = name.split("-")[0]
            same = j["ids"] != "" and j["ids"] == res["speed"][codec]["dram"]["ids"]
            ok &= same
            print(f"{name:14s} SSD per token: {logical:7.1f} KiB as stored ({logical / none_l:.3f}x of none), {device:7.1f} KiB from the device "
                  f"({device / none_d:.3f}x of none; {device / logical:.2f} device bytes per stored byte), {ssd_ios(j):.0f} reads "
                  f"({ssd_ios(j) / ssd_ios(res['bytes']['none']):.3f}x); ids as DRAM only: "
                  f"{'yes' if same else 'NO'}")
    if res["speed"] and all("tiered" in v for v in res["speed"].values()):
        for codec in CODECS:
            d, t = res["speed"][codec]["dram"], res["speed"][codec]["tiered"]
            same = t["ids"] != "" and t["ids"] == d["ids"]
            ok &= same
            print(f"{codec:5s} DRAM + SSD (cache {int(a.fast_bytes) >> 20} MiB) / DRAM only decode time: "
                  f"{d['decode_tokens_per_s'] / t['decode_tokens_per_s']:.3f}x  (hit rate {t['attention']['hit_rate']:.3f}); ids as DRAM only: "
                  f"{'yes' if same else 'NO'}")
    if res["capacity"]:
        c = res["capacity"]
        for codec in CODECS:
            logical, device = ssd_reads(c["runs"][codec])
            print(f"{codec:5s} a {c['host_bytes'] >> 20} MiB DRAM tier holds {c['longest_context'][codec]} tokens of context "
                  f"({c['longest_context'][codec] / c['longest_context']['none']:.2f}x of none); at {c['context']} tokens the SSD "
                  f"serves {device:.1f} KiB/token from the device")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
