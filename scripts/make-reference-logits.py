#!/usr/bin/env python3
"""Writes tests/data/smollm2/reference.json: an independent fp32 forward pass of SmolLM2-135M
(the project's real model) over a few short real prompts, for test_smollm2.

The pass is plain numpy over weights dequantized by the `gguf` package (pip install gguf numpy):
embedding, per layer RMSNorm, Q/K/V projections, RoPE on adjacent pairs (GGUF stores llama's Q/K
rows permuted for it), causal GQA attention in float64 softmax, output projection, SwiGLU FFN,
final norm, tied output head. Nothing of kvdrive is used. For each prompt it records the prompt
ids, the top logits at every prompt position (teacher forcing), and 24 greedy continuation ids
with the top logits after each of them.

Prompt ids come from llama.cpp's tokenizer (llama-cpp-python, vocab_only) when installed, so the
reference does not depend on kvdrive's tokenizer either; the ids are stored, and the test feeds
them as they are.

  python3 scripts/make-reference-logits.py [--model PATH] [--out tests/data/smollm2/reference.json]
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

TOP = 8          # logits kept per position
GREEDY = 24      # greedy tokens generated per prompt

LICENCES = "/usr/share/common-licenses"


def licence_text(name):
    """A licence of /usr/share/common-licenses with its whitespace runs as single spaces."""
    with open(os.path.join(LICENCES, name), encoding="utf-8") as f:
        return " ".join(f.read().split())


def passage(name, start, chars):
    """About `chars` characters of a licence from `start`: from the next word's start (0: the
    opening), back to the last whole word."""
    text = licence_text(name)
    if start > 0:
        start = text.index(" ", start) + 1
    piece = text[start:start + chars]
    return piece[:piece.rindex(" ")] if start + chars < len(text) else piece


def prompts():
    """Short real texts: the openings and passages of licences every Debian machine has, and a
    chat turn. bsd and lgpl3-defs are two of scripts/fidelity-greedy.py's prompts on which
    8-bit activations (this decoder's before, and llama.cpp's) leave the reference's greedy ids
    early, at reference margins of 0.03 to 0.2."""
    return [
        ("apache", licence_text("Apache-2.0")[:180]),
        ("gpl3", licence_text("GPL-3")[:160]),
        ("chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
        ("bsd", passage("BSD", 0, 200)),
        ("lgpl3-defs", passage("LGPL-3", 300, 220)),
    ]


def tokenize(model_path, text):
    from llama_cpp import Llama  # llama.cpp's own tokenizer
    llm = tokenize.llm = getattr(tokenize, "llm", None) or Llama(model_path=model_path, vocab_only=True, verbose=False)
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        f = lambda k: r.fields[k].contents()
        assert f("general.architecture") == "llama"
        self.layers = int(f("llama.block_count"))
        self.dim = int(f("llama.embedding_length"))
        self.heads = int(f("llama.attention.head_count"))
        self.kv_heads = int(f("llama.attention.head_count_kv"))
        self.theta = float(f("llama.rope.freq_base"))
        self.eps = float(f("llama.attention.layer_norm_rms_epsilon"))
        self.hd = self.dim // self.heads
        t = {x.name: x for x in r.tensors}
        deq = lambda n: np.asarray(gguf.quants.dequantize(t[n].data, t[n].tensor_type), dtype=np.float32).reshape(
            [int(d) for d in reversed(t[n].shape)] if len(t[n].shape) > 1 else [-1])
        self.embed = deq("token_embd.weight")                       # [vocab][dim]
        self.out = deq("output.weight") if "output.weight" in t else self.embed
        self.norm = deq("output_norm.weight")
        self.w = []
        for l in range(self.layers):
            p = f"blk.{l}."
            self.w.append({k: deq(p + k + ".weight") for k in
                           ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        half = self.hd // 2
        self.inv_freq = 1.0 / self.theta ** (np.arange(half, dtype=np.float64) * 2.0 / self.hd)

    def rms(self, x, w):
        return (x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + self.eps)).astype(np.float32) * w

    def rope(self, x, pos):  # x [heads][hd], pairs (2i, 2i+1)
        a = pos * self.inv_freq
        c, s = np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)
        x0, x1 = x[:, 0::2].copy(), x[:, 1::2].copy()
        y = np.empty_like(x)
        y[:, 0::2] = x0 * c - x1 * s
        y[:, 1::2] = x0 * s + x1 * c
        return y

    def session(self):
        """A KV cache; feed(token) runs one position and returns the [vocab] float32 logits after it."""
        model, kc, vc = self, [[] for _ in range(self.layers)], [[] for _ in range(self.layers)]
        group = self.heads // self.kv_heads

        def feed(tok):
            pos = len(kc[0])
            x = model.embed[tok].astype(np.float32).copy()
            for l, w in enumerate(model.w):
                h = model.rms(x, w["attn_norm"])
                q = model.rope((w["attn_q"] @ h).reshape(model.heads, model.hd), pos)
                k = model.rope((w["attn_k"] @ h).reshape(model.kv_heads, model.hd), pos)
                v = (w["attn_v"] @ h).reshape(model.kv_heads, model.hd)
                kc[l].append(k)
                vc[l].append(v)
                K, V = np.stack(kc[l]), np.stack(vc[l])          # [t][kv][hd]
                att = np.empty((model.heads, model.hd), dtype=np.float32)
                for hq in range(model.heads):
                    kv = hq // group
                    s = (K[:, kv, :].astype(np.float64) @ q[hq].astype(np.float64)) / np.sqrt(model.hd)
                    p = np.exp(s - s.max())
                    p /= p.sum()
                    att[hq] = (p @ V[:, kv, :].astype(np.float64)).astype(np.float32)
                x = x + w["attn_output"] @ att.reshape(-1)
                h = model.rms(x, w["ffn_norm"])
                g, u = w["ffn_gate"] @ h, w["ffn_up"] @ h
                x = x + w["ffn_down"] @ ((g / (1.0 + np.exp(-g))) * u)
            return model.out @ model.rms(x, model.norm)
        return feed


def top(logits):
    idx = np.argsort(-logits, kind="stable")[:TOP]
    return {"ids": [int(i) for i in idx], "logits": [round(float(logits[i]), 5) for i in idx]}


def main():
    ap = argparse.ArgumentParser()
    cache = os.environ.get("KVD_MODEL_DIR", os.path.expanduser("~/.cache/kvdrive/models"))
    ap.add_argument("--model", default=os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "smollm2", "reference.json"))
    a = ap.parse_args()
    m = Model(a.model)
    cases = []
    for name, text in prompts():
        ids = tokenize(a.model, text)  # SmolLM2's add_bos_token is false: no BOS, as llama.cpp tokenizes it
        feed = m.session()
        rows = [feed(t) for t in ids]
        prompt_top = [top(r) for r in rows]
        greedy, gen_top = [], []
        nxt = int(np.argmax(rows[-1]))
        for _ in range(GREEDY):
            greedy.append(nxt)
            last = feed(nxt)
            gen_top.append(top(last))
            nxt = int(np.argmax(last))
        cases.append({"name": name, "text": text, "ids": ids, "prompt_top": prompt_top, "greedy": greedy, "greedy_top": gen_top})
        print(f"{name}: {len(ids)} prompt ids, greedy {greedy}", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model": os.path.basename(a.model), "top": TOP, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
