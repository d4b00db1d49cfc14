#!/usr/bin/env python3
"""How far greedy decoding follows an fp32 reference on real prompts: SmolLM2-135M-Instruct (Q4_1
GGUF) through (a) the numpy fp32 forward pass of make-reference-logits.py (weights dequantized by
the `gguf` package, nothing of kvdrive), (b) llama.cpp (llama-cpp-python, f32 KV cache),
(c) kvd-llama's default block path (weights in their GGUF blocks, activations quantized per block)
and (d) kvd-llama --weights f32, all with an f32 KV cache. For each prompt and each of (b)-(d):
how many of the first --steps greedy ids equal the reference's, and the reference's top-2 logit
margin at the first departure (a near-tie excuses a departure: any rounding may flip it).

The prompts are openings and passages of the licence texts in /usr/share/common-licenses, other
than the Apache-2.0 and GPL-3 openings that tests/data/smollm2/reference.json uses. A benchmark,
not part of CI (the reference pass takes several minutes; llama-cpp-python and gguf must be installed):

  pip install gguf llama-cpp-python
  python3 scripts/fidelity-greedy.py [--build build] [--steps 24] [--json out.json]
      [--cache refs.json]              # keeps (a) and (b) between runs, e.g. while trying kernels
      [--kvd NAME=BINARY[:ARGS]] ...   # further kvd-llama runs to compare, e.g. an older build
"""
import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LICENCES = "/usr/share/common-licenses"
MODEL = os.path.join(os.environ.get("KVD_MODEL_DIR", os.path.expanduser("~/.cache/kvdrive/models")), "SmolLM2-135M-Instruct.Q4_1.gguf")

# (name, licence file, offset in characters of the whitespace-normalized text, length in characters):
# make-reference-logits.py's passage(), which moves an offset on to the next word's start and the
# end back to the last whole word.
PROMPTS = [
    ("bsd", "BSD", 0, 200),
    ("bsd-disclaimer", "BSD", 600, 220),
    ("lgpl21-preamble", "LGPL-2.1", 400, 200),
    ("lgpl3-defs", "LGPL-3", 300, 220),
    ("mpl2", "MPL-2.0", 0, 200),
    ("mpl2-mid", "MPL-2.0", 3000, 220),
    ("artistic", "Artistic", 0, 180),
    ("artistic-mid", "Artistic", 1500, 220),
    ("gfdl-preamble", "GFDL-1.3", 600, 200),
    ("cc0", "CC0-1.0", 400, 220),
    ("gpl2-mid", "GPL-2", 2000, 200),
    ("mpl11-defs", "MPL-1.1", 800, 200),
]


def load_reference_module():
    spec = importlib.util.spec_from_file_location("make_reference_logits", os.path.join(HERE, "make-reference-logits.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_greedy(ref_model, ids, steps):
    """The reference's greedy ids and, for each, its top-2 margin when it was chosen."""
    feed = ref_model.session()
    for t in ids:
        logits = feed(t)
    out, margins = [], []
    for _ in range(steps):
        top2 = np.sort(logits)[-2:]
        out.append(int(np.argmax(logits)))
        margins.append(float(top2[1] - top2[0]))
        logits = feed(out[-1])
    return out, margins


def llama_cpp_greedy(ids, steps, threads):
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(model_path=MODEL, n_ctx=len(ids) + steps + 8, n_threads=threads, n_threads_batch=threads, n_batch=512,
                verbose=False, type_k=0, type_v=0)  # 0: GGML_TYPE_F32, the KV cache in f32
    llm.eval(ids)
    out = []
    for _ in range(steps):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))  # the last token's
        out.append(int(logits.argmax()))
        llm.eval([out[-1]])
    return out


def kvd_greedy(binary, extra, ids, steps, threads):
    cmd = [binary, "--model", MODEL, "--prompt-ids", " ".join(map(str, ids)), "--print-ids", "--mode", "dense", "--dtype", "f32",
           "--steps", str(steps), "--ignore-eos", "--threads", str(threads)] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"kvd-llama failed: {shlex.join(cmd)}\n{r.stderr[-2000:]}")
    return [int(x) for x in r.stdout.strip().splitlines()[-1].split()]


def agreement(got, want, margins):
    """(leading ids equal to the reference's, the reference's margin at the first departure or None)."""
    n = 0
    while n < len(want) and n < len(got) and got[n] == want[n]:
        n += 1
    return n, (margins[n] if n < len(want) else None)


def tokenizer():
    from llama_cpp import Llama
    vocab = Llama(model_path=MODEL, vocab_only=True, verbose=False)
    return lambda text: vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def references(a):
    """(a) and (b) per prompt: from --cache when it has them for these prompts and steps."""
    if a.cache and os.path.exists(a.cache):
        cached = json.load(open(a.cache))
        if cached.get("steps") == a.steps and [c["name"] for c in cached["cases"]] == [p[0] for p in PROMPTS]:
            return cached["cases"]
    mrl = load_reference_module()
    tok, ref_model = tokenizer(), mrl.Model(MODEL)
    cases = []
    for name, licence, start, chars in PROMPTS:
        text = mrl.passage(licence, start, chars)
        ids = tok(text)
        ref, margins = reference_greedy(ref_model, ids, a.steps)
        cases.append({"name": name, "text": text, "ids": ids, "reference": ref, "margins": margins,
                      "llama.cpp": llama_cpp_greedy(ids, a.steps, a.threads)})
        print(f"{name}: {len(ids)} prompt ids, reference {ref}", file=sys.stderr)
    if a.cache:
        json.dump({"steps": a.steps, "cases": cases}, open(a.cache, "w"))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="", help="a JSON file keeping the reference's and llama.cpp's ids between runs")
    ap.add_argument("--kvd", action="append", default=[], help="NAME=BINARY[:ARGS]: a further kvd-llama run (ARGS space-separated)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    binary = os.path.join(a.build, "examples/llama3/kvd-llama")
    runs = {"kvd blocks": (binary, []), "kvd --weights f32": (binary, ["--weights", "f32"])}
    for spec in a.kvd:
        name, _, rest = spec.partition("=")
        path, _, args = rest.partition(":")
        runs[name] = (path, args.split())
    cases = references(a)
    systems = ["llama.cpp"] + list(runs)
    for c in cases:
        for name, (path, extra) in runs.items():
            c[name] = kvd_greedy(path, extra, c["ids"], a.steps, a.threads)
    print(f"\nGreedy ids equal to the fp32 reference's, of {a.steps} (the reference's top-2 margin at the first departure)\n")
    print("| prompt | ids | " + " | ".join(systems) + " |")
    print("|---" * (2 + len(systems)) + "|")
    totals = {s: 0 for s in systems}
    for c in cases:
        cells = []
        for s in systems:
            n, m = agreement(c[s], c["reference"], c["margins"])
            totals[s] += n
            cells.append(f"{n}" + (f" ({m:.2f})" if m is not None else ""))
        print(f"| {c['name']} | {len(c['ids'])} | " + " | ".join(cells) + " |")
    print(f"| total | | " + " | ".join(f"{totals[s]} of {a.steps * len(cases)}" for s in systems) + " |")
    if a.json:
        json.dump({"steps": a.steps, "cases": cases, "totals": totals}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
