#!/usr/bin/env python3
"""SmolLM2-135M on this machine: kvd-llama (dense, sparse Hierarchical and Quest at 6.25%, tiered
DRAM cache + SSD) against llama.cpp on the same GGUF, same threads, f16 KV, side by side in one
run. Decode and prefill tokens/s at 512, 2K, 4K and 8K tokens of context, and the peak RSS of
each at the largest. Not part of CI: llama.cpp comes from the llama-cpp-python package, which
builds llama.cpp from source (about 15 minutes on 2 cores):

  pip install llama-cpp-python      # once
  python3 scripts/bench-smollm2.py [--build build] [--contexts 512,2048,4096,8000] [--threads 2] [--repeat 3]

Every figure is the median of --repeat runs, the runs of one context alternating between the
programs (llama.cpp, then each kvd-llama mode, then again), so a slow minute of a noisy machine
falls on all of them. On CPUs with AMX, llama.cpp's extra CPU buffer types crash in decode, so
they are turned off there (use_extra_bufts).

The prompt is real text (the licence texts of /usr/share/common-licenses, through kvd-llama's
--needle document), decoding runs --steps tokens past any end-of-generation token.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = os.path.join(os.environ.get("KVD_MODEL_DIR", os.path.expanduser("~/.cache/kvdrive/models")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA_CPP = r'''
import json, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
if " amx" in open("/proc/cpuinfo").read():  # llama.cpp's AMX buffer types crash in decode
    _default_params = llama_cpp.llama_cpp.llama_model_default_params
    def _params():
        p = _default_params()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_cpp.llama_model_default_params = _params
model, n, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = open(sys.argv[5]).read()
llm = Llama(model_path=model, n_ctx=n + steps + 8, n_threads=threads, n_threads_batch=threads, n_batch=512,
            verbose=False, type_k=1, type_v=1)
ids = llm.tokenize(text.encode(), add_bos=True, special=False)
while len(ids) < n: ids += ids[1:]
ids = ids[:n]
t0 = time.perf_counter(); llm.eval(ids); t1 = time.perf_counter()
tok = 0
t2 = time.perf_counter()
for _ in range(steps):
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))  # the last token's
    tok = int(logits.argmax())
    llm.eval([tok])
t3 = time.perf_counter()
print(json.dumps({"prefill": n / (t1 - t0), "decode": steps / (t3 - t2),
                  }))
'''


def haystack(chars):
    out, d = [], "/usr/share/common-licenses"
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        if os.path.isfile(p) and not os.path.islink(p):
            out.append(open(p, encoding="utf-8", errors="replace").read())
    s = "\n\n".join(out)
    return s[:chars]


def run_measured(cmd):
    """Runs cmd; returns (returncode, stdout, stderr, its own peak RSS in MiB)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return p.returncode, out.read(), err.read(), usage.ru_maxrss / 1024


def run_kvd(build, n, steps, threads, mode, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as js:
        cmd = [os.path.join(build, "examples/llama3/kvd-llama"), "--model", MODEL, "--needle", str(n), "--steps", str(steps),
               "--ignore-eos", "--threads", str(threads), "--dtype", "f16", "--stats-json", js.name, "--mode", mode] + extra
        rc, _, err, rss = run_measured(cmd)
        if rc not in (0, 3):  # 3: the needle's answer was wrong, which does not change the speed
            sys.exit(f"kvd-llama failed: {' '.join(cmd)}\n{err}")
        j = json.load(open(js.name))
        return {"prefill": j["prefill_tokens_per_s"], "decode": j["decode_tokens_per_s"], "tokens": j["prompt_tokens"], "rss_mib": rss}


def run_llama_cpp(n, steps, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as t:
        t.write(haystack(8 * n))
        t.flush()
        rc, out, err, rss = run_measured([sys.executable, "-c", LLAMA_CPP, MODEL, str(n), str(steps), str(threads), t.name])
        if rc != 0:
            sys.exit(f"llama.cpp failed:\n{err[-2000:]}")
        r = json.loads(out.strip().splitlines()[-1])
        r["rss_mib"] = rss
        return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--contexts", default="512,2048,4096,8000")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each program at each context; figures are their medians")
    ap.add_argument("--runs", default="", help="comma-separated subset of the rows (e.g. 'kvd dense,kvd sparse hierarchical'); "
                    "llama.cpp dense always runs")
    ap.add_argument("--json", default="")
    ap.add_argument("--batches", default="1,4,8", help="batch sizes for the throughput table ('' to skip)")
    ap.add_argument("--batch-context", type=int, default=4000)
    a = ap.parse_args()
    tiered = ["--fast-bytes", "20000000", "--host-bytes", "16777216", "--ssd-path", os.path.join(a.build, "bench-smollm2.store")]
    runs = {
        "llama.cpp dense": lambda n: run_llama_cpp(n, a.steps, a.threads),
        "kvd dense": lambda n: run_kvd(a.build, n, a.steps, a.threads, "dense", []),
        "kvd sparse hierarchical": lambda n: run_kvd(a.build, n, a.steps, a.threads, "sparse", ["--index", "hierarchical", "--budget", "0.0625"]),
        "kvd sparse quest": lambda n: run_kvd(a.build, n, a.steps, a.threads, "sparse", ["--index", "quest", "--budget", "0.0625"]),
        "kvd tiered": lambda n: run_kvd(a.build, n, a.steps, a.threads, "tiered", ["--budget", "0.0625"] + tiered),
    }
    if a.runs:
        keep = {"llama.cpp dense"} | {r.strip() for r in a.runs.split(",")}
        unknown = keep - set(runs)
        if unknown:
            sys.exit(f"--runs: no such row {sorted(unknown)}; rows: {list(runs)}")
        runs = {name: f for name, f in runs.items() if name in keep}
    contexts = [int(x) for x in a.contexts.split(",")]
    results = {name: {} for name in runs}
    for n in contexts:
        samples = {name: [] for name in runs}
        for _ in range(a.repeat):
            for name, f in runs.items():
                r = f(n)
                samples[name].append(r)
                print(f"{name:26s} {n:6d}: prefill {r['prefill']:8.1f} tok/s, decode {r['decode']:7.2f} tok/s, {r['rss_mib']:.0f} MiB",
                      file=sys.stderr)
        for name in runs:
            results[name][n] = {key: statistics.median(r[key] for r in samples[name]) for key in samples[name][0]}
    print(f"\nSmolLM2-135M-Instruct Q4_1, {a.threads} threads, f16 KV, {a.steps} decode steps; tokens/s, medians of {a.repeat} "
          "alternating runs (ratio to llama.cpp)\n")
    print("| run | " + " | ".join(f"decode {n}" for n in contexts) + " | " + " | ".join(f"prefill {n}" for n in contexts) + " |")
    print("|---" * (1 + 2 * len(contexts)) + "|")
    base = results["llama.cpp dense"]
    for name in runs:
        r = results[name]
        cells = [f"{r[n]['decode']:.1f} ({r[n]['decode'] / base[n]['decode']:.2f}x)" for n in contexts]
        cells += [f"{r[n]['prefill']:.0f} ({r[n]['prefill'] / base[n]['prefill']:.2f}x)" for n in contexts]
        print(f"| {name} | " + " | ".join(cells) + " |")
    # Batch throughput: --batch B needle documents of about 4K tokens (the i-th 1 - i/(2B) of it).
    batch_rows = {}
    if a.batches:
        for mode in ("sparse", "tiered"):
            for b in [int(x) for x in a.batches.split(",")]:
                extra = ["--batch", str(b), "--index", "hierarchical", "--budget", "0.0625"]
                if mode == "tiered":
                    extra += ["--fast-bytes", str(20000000 * b), "--host-bytes", str(16777216 * b),
                              "--ssd-path", os.path.join(a.build, "bench-smollm2.store")]
                r = run_kvd(a.build, a.batch_context, a.steps, a.threads, mode, extra)
                batch_rows[(mode, b)] = r
                print(f"kvd {mode} batch {b}: decode {r['decode']:.1f} tok/s", file=sys.stderr)
        print(f"\nBatch decode throughput, tokens/s over all sequences ({a.batch_context}-token needle documents and shorter, "
              "hierarchical 6.25%)\n")
        bs = sorted({b for _, b in batch_rows})
        print("| mode | " + " | ".join(f"batch {b}" for b in bs) + " |")
        print("|---" * (1 + len(bs)) + "|")
        for mode in ("sparse", "tiered"):
            one = batch_rows[(mode, bs[0])]["decode"]
            print(f"| {mode} | " + " | ".join(f"{batch_rows[(mode, b)]['decode']:.1f} ({batch_rows[(mode, b)]['decode'] / one:.2f}x)" for b in bs) + " |")
    n = contexts[-1]
    print(f"\npeak RSS at {n} (medians): llama.cpp dense {base[n]['rss_mib']:.0f} MiB; " +
          "; ".join(f"{name} {results[name][n]['rss_mib']:.0f} MiB ({results[name][n]['rss_mib'] / base[n]['rss_mib']:.2f}x)" for name in runs if name != "llama.cpp dense"))
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
