#!/usr/bin/env python3
"""Golden files for the GGUF tokenizer (examples/llama3/tokenizer/tokenizer_gguf.hpp), from llama.cpp.

Writes, under tests/data/tokenizer/:
  tiny-*.gguf.json the text form (scripts/gguf_json.py) of vocabulary-only GGUF files, one per
                   tokenizer kind the real model does not cover: byte-level BPE ("gpt2") with
                   the pre-tokenizers gpt-2, llama-bpe, qwen2 and llama.cpp's default, and
                   SentencePiece ("llama") with scores and byte fallback (with and without
                   add_space_prefix). Merges and pieces are learnt here from the licence texts
                   in /usr/share/common-licenses (and a few sentences in other scripts) by a
                   small BPE trainer; the layouts are those of real models: control tokens, byte
                   tokens, user-defined tokens. The GGUF files themselves (gguf-py's GGUFWriter)
                   go to a temporary directory, where llama.cpp reads them: the repository keeps
                   only text under tests/data, and the tests write the files back from their text
                   form (tests/gguf_writer.hpp), checking the sha256 it records.
  *.golden.json    for each of those and for SmolLM2-135M-Instruct (the model scripts/get-model
                   caches): llama.cpp's ids for a set of test texts with add_special and
                   parse_special true and false, its detokenized text, its pieces, its special
                   ids, add_bos/add_eos and its end-of-generation set.

The reference is llama.cpp's own tokenizer through the llama-cpp-python package (llama_tokenize,
llama_token_to_piece, llama_detokenize on a vocab_only model). Everything is seeded: a rerun
with the same llama.cpp writes the same files.

Other modes:
  --vocab-only            only the tiny vocabularies' text forms (needs gguf, not llama.cpp).
  --random N --out FILE   N random texts (a seeded mix of the characters that matter to the
                          pre-tokenizers, special-token strings, invalid UTF-8) for every model,
                          golden ids in one JSON file; the test reads it when
                          KVD_TOKENIZER_EXTRA_GOLDEN names it (a differential check, not committed).
  --unicode-table         prints the code point class table of tokenizer_gguf.hpp (needs the
                          unicodedata2 package at 15.1.0, the Unicode version of llama.cpp's tables).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import gguf_json  # scripts/gguf_json.py

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizer"
LICENCES = Path("/usr/share/common-licenses")
MODEL_DIR = Path(os.environ.get("KVD_MODEL_DIR") or Path.home() / ".cache" / "kvdrive" / "models")
SMOLLM2 = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 20240613

# A few sentences in other scripts, so that merges and pieces beyond ASCII exist.
MULTILINGUAL = (
    "Le logiciel est fourni « tel quel », sans garantie d'aucune sorte. C'est l'été à la plage; où est le café? "
    "Die Software wird ohne Gewähr bereitgestellt. Größe, Übung, Äpfel, schön. "
    "El software se proporciona tal cual, sin garantía. ¿Dónde está la niña? "
    "本软件按原样提供，不提供任何形式的保证。中文字符测试。 "
    "本ソフトウェアは現状のまま提供されます。日本語のテキストです。 "
    "Программное обеспечение предоставляется как есть. Русский текст. "
    "Το λογισμικό παρέχεται ως έχει. Ελληνικά. "
)

# ----------------------------------------------------------------------------- the test texts

LICENCE_PARAGRAPHS = [("GPL-3", 2), ("GPL-3", 9), ("Apache-2.0", 5), ("MPL-2.0", 12)]


def licence_text(name: str) -> str:
    return (LICENCES / name).read_text(encoding="utf-8")


def paragraph(name: str, index: int) -> str:
    paras = [p for p in re.split(r"\n\s*\n", licence_text(name)) if p.strip()]
    return paras[index]


def test_texts(paragraphs: int = len(LICENCE_PARAGRAPHS)) -> list[bytes]:
    """The test texts, with the first `paragraphs` licence paragraphs."""
    texts = [
        "",
        " ",
        "  ",
        "\n",
        "\n\n\n",
        "\t",
        "Hello world",
        " Hello world",
        "Hello  world",
        "Hello   world\n",
        "hello\tworld\r\nbye",
        "It's can't we're they've I'm you'll he'd IT'S CAN'T WE'RE THEY'VE I'M YOU'LL HE'D",
        "'s 'S 'Re 'll'd'' ' s",
        "0 1 12 123 1234 12345 1234567890 3.14159 1,000,000 -42 +7 x2 v1.2.3 2024-06-13",
        "\u0663\u0664\u0665 \uff11\uff12\uff13 \u00b2\u00b3 \u00bd \u216b 12\u0663456",
        "caf\u00e9 na\u00efve fa\u00e7ade r\u00e9sum\u00e9 \u00c5ngstr\u00f6m \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac "
        "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
        "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
        "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F1EB\U0001F1F7 \U0001F468\u200d\U0001F469\u200d\U0001F467 \u2713",
        "e\u0301 a\u0308 n\u0303 combining \u0308\u0308 \u0915\u094d\u0937",
        'def f(x):\n\treturn x**2  # square\n\nif __name__ == "__main__":\n    print(f(3))\n',
        "int main() {\n    std::vector<int> v{1, 2, 3};\n    return v[0] != 0 ? 1 : 0;\n}\n",
        "a    b\n\n\n\nc          d\t\t\te\r\n\r\nf \n  \n\t\n",
        "   leading and trailing   ",
        "\u00a0nbsp\u3000ideographic\u2028line\u0085nel\u180emvs\u1680ogham",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|><|im_end|><|im_start|>",
        "<|im_start user <|im_end|x <||> <|endoftext|> <|endoftext|><|endoftext|>",
        "<s>Hello</s> <unk> <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        '<tool_call>{"name": "f"}</tool_call> <think>hmm</think> <tool>x</tool>',
        "!!! ??? ... ,,, ;; -- __ ~~ $$$ +++ <<< >>> === ^^^ ||| ``` @@@ ### %%% &&& *** ((( ))) [[[ ]]] {{{ }}}",
        "C'est l'\u00e9t\u00e9. Don't stop\u2014it\u2019s \u201cquoted\u201d \u2018single\u2019 \u00abguillemets\u00bb \u2026",
        "URL: https://example.com/path?q=1&r=2#frag email: a.b@c.de",
        "\x00\x01\x1b[0m\x1c\x1d\x1e\x1f\x7f end",
        "\u0378\u0379 \U0001F6DC \U00031350 \U0002EBF0 \ue000 \ufffd",
        "Hello ,world . yes ! no ? it 's I 'm we 're ' quoted ' end .",
    ]
    texts += [paragraph(n, i) for n, i in LICENCE_PARAGRAPHS[:paragraphs]]
    out = [t.encode("utf-8") for t in texts]
    # Not valid UTF-8 (llama.cpp reads a bad byte as U+FFFD).
    out += [
        b"\xff\xfe abc",
        b"caf\xc3",
        b"\xc3\x28 \xa0\xa1 \xe2\x82 \xf0\x9f\x98 x",
        b"\xed\xa0\x80 surrogate \xed\xbf\xbf",
        b"\xc0\x80 overlong \xe0\x80\x80 \xc1\xbf",
    ]
    return out


# ----------------------------------------------------------------------------- BPE training


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 bytes."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + n)
            n += 1
    return table


BYTE_CHARS = bytes_to_unicode()
# GPT-2's vocabulary order of the byte tokens: the printable ones first, then the rest.
BYTE_ORDER = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
BYTE_ORDER += [b for b in range(256) if b not in BYTE_ORDER]


def corpus() -> str:
    parts = [licence_text(n)[:40000] for n in ("GPL-3", "Apache-2.0", "MPL-2.0", "BSD", "Artistic")]
    return "\n\n".join(parts) + "\n\n" + MULTILINGUAL * 8


def learn_merges(words: Counter, n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE: merge the most frequent adjacent pair (ties: the larger pair), n_merges times."""
    vocab = {tuple(w): c for w, c in words.items()}
    merges = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for w, c in vocab.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        merged: dict = {}
        for w, c in vocab.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        vocab = merged
    return merges


def byte_level_words(text: str) -> Counter:
    # An ASCII stand-in for the GPT-2 pattern is enough to learn from.
    pieces = re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+", text)
    return Counter("".join(BYTE_CHARS[b] for b in p.encode("utf-8")) for p in pieces)


# ----------------------------------------------------------------------------- GGUF files

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def write_gguf(path: Path, meta: dict) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(meta["name"])
    w.add_context_length(2048)
    w.add_tokenizer_model(meta["model"])
    if meta.get("pre") is not None:
        w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(meta["tokens"])
    w.add_token_types(meta["types"])
    if "scores" in meta:
        w.add_token_scores(meta["scores"])
    if "merges" in meta:
        w.add_token_merges(meta["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id), ("eot", w.add_eot_token_id)):
        if meta.get(key) is not None:
            add(meta[key])
    for key, add in (("add_bos", w.add_add_bos_token), ("add_eos", w.add_add_eos_token),
                     ("add_space_prefix", w.add_add_space_prefix)):
        if meta.get(key) is not None:
            add(meta[key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bpe_vocab(merges, front, back, extra_words=()):
    """Tokens (and their types) of a byte-level vocabulary: `front` specials, the bytes, the
    merges' results, words that no merge forms (extra_words), `back` specials."""
    tokens, types = [], []
    seen = set()

    def add(t, ty):
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(ty)

    for t, ty in front:
        add(t, ty)
    for b in BYTE_ORDER:
        add(BYTE_CHARS[b], NORMAL)
    for a, b in merges:
        add(a + b, NORMAL)
    for w in extra_words:
        add("".join(BYTE_CHARS[b] for b in w.encode("utf-8")), NORMAL)
    for t, ty in back:
        add(t, ty)
    return tokens, types


def make_tiny_files(gguf_dir: Path) -> list[tuple[str, Path]]:
    """Writes the tiny vocabularies' GGUF files into gguf_dir; returns (name, path) of each."""
    text = corpus()
    words = byte_level_words(text)
    merges = learn_merges(words, 420)
    merge_strings = [f"{a} {b}" for a, b in merges]
    files = []

    def emit(name, meta):
        path = gguf_dir / f"{name}.gguf"
        meta["name"] = f"kvdrive {name}"
        write_gguf(path, meta)
        files.append((name, path))

    # GPT-2: the bytes, the merges, <|endoftext|> last; user-defined tokens after it.
    toks, types = bpe_vocab(merges, [], [("<|endoftext|>", CONTROL), ("<tool_call>", USER_DEFINED),
                                         ("</tool_call>", USER_DEFINED), ("    ", USER_DEFINED)])
    eot = toks.index("<|endoftext|>")
    emit("tiny-gpt2", dict(model="gpt2", pre="gpt-2", tokens=toks, types=types, merges=merge_strings, bos=eot, eos=eot,
                           add_bos=False))

    # Llama 3: specials last; whole words that no merge forms (llama.cpp ignores merges for llama-bpe).
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_2|>", "<|eot_id|>"]
    extra = [" Hello", " world", "Hello", " licence", " Ångström", " 😀", "hello"]
    toks, types = bpe_vocab(merges, [], [(s, CONTROL) for s in specials], extra)
    emit("tiny-llama-bpe", dict(model="gpt2", pre="llama-bpe", tokens=toks, types=types, merges=merge_strings,
                                bos=toks.index("<|begin_of_text|>"), eos=toks.index("<|eot_id|>")))

    # Qwen2: specials last, no BOS key (llama.cpp's default BOS is then id 11), a FIM token.
    back = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<|fim_prefix|>", CONTROL),
            ("<|fim_pad|>", CONTROL), ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED),
            ("<think>", USER_DEFINED), ("</think>", USER_DEFINED)]
    toks, types = bpe_vocab(merges, [], back)
    emit("tiny-qwen2", dict(model="gpt2", pre="qwen2", tokens=toks, types=types, merges=merge_strings,
                            eos=toks.index("<|im_end|>"), pad=toks.index("<|endoftext|>"), add_bos=False))

    # No tokenizer.ggml.pre: llama.cpp's default pre-tokenizer; BOS and EOS added.
    toks, types = bpe_vocab(merges, [("<s>", CONTROL), ("</s>", CONTROL), ("<unk>", UNKNOWN)], [("<pad>", CONTROL)])
    emit("tiny-default", dict(model="gpt2", pre=None, tokens=toks, types=types, merges=merge_strings, bos=0, eos=1, unk=2,
                              add_bos=True, add_eos=True))

    # SentencePiece: <unk> <s> </s>, the 256 byte tokens, pieces by score, then added tokens.
    spm_words = Counter()
    for w in re.split(r"\s+", text):
        if w:
            spm_words[tuple("\u2581" + w)] += 1
    spm_merges = learn_merges(spm_words, 360)
    chars = Counter(c for w, n in spm_words.items() for c in w for _ in range(n))
    pieces, seen = [], set()
    for a, b in spm_merges:
        if a + b not in seen:
            seen.add(a + b)
            pieces.append(a + b)
    singles = [c for c, n in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])) if n >= 3 and c not in seen]
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(toks)
    for i, p in enumerate(pieces):
        toks.append(p)
        types.append(NORMAL)
        scores.append(-float(i))
    for i, c in enumerate(singles):
        toks.append(c)
        types.append(NORMAL)
        scores.append(-1000.0 - i)
    for t, ty in (("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<tool>", USER_DEFINED), ("</tool>", USER_DEFINED)):
        toks.append(t)
        types.append(ty)
        scores.append(0.0)
    spm = dict(model="llama", pre=None, tokens=toks, types=types, scores=scores, bos=1, eos=2, unk=0)
    emit("tiny-spm", dict(spm))
    emit("tiny-spm-noprefix", dict(spm, add_space_prefix=False, add_bos=False))
    return files


# ----------------------------------------------------------------------------- llama.cpp


class LlamaVocab:
    """llama.cpp's tokenizer of one GGUF file (a vocab_only model)."""

    _quiet = None

    def __init__(self, path: Path):
        import llama_cpp

        self.lc = llama_cpp
        if LlamaVocab._quiet is None:
            LlamaVocab._quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(LlamaVocab._quiet, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(text) + 8
        while True:
            buf = (self.lc.llama_token * cap)()
            r = self.lc.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
            if r >= 0:
                return list(buf[:r])
            cap = -r

    def piece(self, token: int, special: bool) -> bytes:
        cap = 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            r = self.lc.llama_token_to_piece(self.vocab, token, buf, cap, 0, special)
            if r >= 0:
                return buf.raw[:r]
            cap = -r

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (self.lc.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 8 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(cap)
            r = self.lc.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
            if r >= 0:
                return buf.raw[:r]
            cap = -r

    def info(self) -> dict:
        lc, v = self.lc, self.vocab
        null = lambda t: -1 if t is None or t < 0 else int(t)  # noqa: E731
        return {
            "n_tokens": self.n,
            "bos": null(lc.llama_vocab_bos(v)),
            "eos": null(lc.llama_vocab_eos(v)),
            "eot": null(lc.llama_vocab_eot(v)),
            "add_bos": bool(lc.llama_vocab_get_add_bos(v)),
            "add_eos": bool(lc.llama_vocab_get_add_eos(v)),
            "eog": [i for i in range(self.n) if lc.llama_vocab_is_eog(v, i)],
        }

    def attrs(self) -> list[int]:
        return [int(self.lc.llama_vocab_get_attr(self.vocab, i)) for i in range(self.n)]


SETTINGS = [(a, p) for a in (False, True) for p in (True, False)]  # (add_special, parse_special)


def key(add_special: bool, parse_special: bool) -> str:
    return f"{int(add_special)}{int(parse_special)}"


def bytes_value(b: bytes):
    """A byte string in JSON: the string itself when it is UTF-8, else {"hex": ...}."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def relative(got: list[int], earlier: dict[str, list[int]]):
    """got as stored: "=KEY" when it is an earlier setting's ids, "=KEY<a,b" and "=KEY>c" with at
    most two ids before (<) and after (>) them (BOS, EOS); else the ids themselves."""
    for k, v in earlier.items():
        if v is got:
            continue
        for pre in range(3):
            for suf in range(3):
                if len(got) == len(v) + pre + suf and got[pre:len(got) - suf] == v:
                    ref = f"={k}"
                    if pre:
                        ref += "<" + ",".join(map(str, got[:pre]))
                    if suf:
                        ref += ">" + ",".join(map(str, got[len(got) - suf:]))
                    return ref
    return got


def golden_cases(lv: LlamaVocab, texts: list[bytes], detok: bool = True) -> list[dict]:
    """Per text: the ids for each (add_special, parse_special) (see relative()), and
    llama_detokenize of the ids with both true for each (remove_special, unparse_special)
    (absent: the text itself)."""
    cases = []
    for t in texts:
        ids, full = {}, {}
        for a, p in SETTINGS:
            got = lv.tokenize(t, a, p)
            full[key(a, p)] = got
            ids[key(a, p)] = relative(got, full)
        case = {"text": bytes_value(t), "ids": ids}
        if detok:
            both = lv.tokenize(t, True, True)
            d = {}
            for r in (False, True):
                for u in (False, True):
                    text = lv.detokenize(both, r, u)
                    if text != t:
                        d[key(r, u)] = bytes_value(text)
            case["detok"] = d
        cases.append(case)
    return cases


def golden(lv: LlamaVocab, source: str, texts: list[bytes], piece_ids: list[int], attrs: bool) -> dict:
    """The vocabulary's facts, the cases, and llama_token_to_piece of piece_ids ("special":
    with special = true, only where it differs)."""
    import llama_cpp

    plain = [lv.piece(i, False) for i in piece_ids]
    special = {str(i): bytes_value(lv.piece(i, True)) for i, p in zip(piece_ids, plain) if lv.piece(i, True) != p}
    g = {
        "source": source,
        "llama_cpp_python": llama_cpp.__version__,
        "vocab": lv.info(),
        "cases": golden_cases(lv, texts),
        "pieces": {"ids": piece_ids, "plain": [bytes_value(p) for p in plain], "special": special},
    }
    if attrs:
        g["vocab"]["attrs"] = lv.attrs()
    return g


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n", encoding="utf-8")


def random_texts(rng: random.Random, n: int) -> list[bytes]:
    alphabet = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 3
        + list("0123456789") * 3
        + [" "] * 20 + ["\t", "\n", "\n", "\r", "\x0b", "\x0c"]
        + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") * 2
        + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'D"] * 2
        + list("éèàçüößñÅÆœ") + list("ελληνικάРусский") + list("中文字符日本語のテキスト한국어")
        + ["\U0001F600", "\U0001F44D", "\U0001F3FD", "\u200d", "\U0001F1EB"]
        + ["\u0301", "\u0308", "\u094d", "\u0915"]
        + ["\u0663", "\uff11", "\u00b2", "\u00bd", "\u216b"]
        + ["\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u1680", "\u2009", "\x1c", "\x1f", "\x00", "\x7f"]
        + ["\u0378", "\U0001F6DC", "\U00031350", "\ue000", "\ufffd", "\u00ad", "\u2014", "\u2019", "\u00ab", "\u2026"]
        + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", "<s>", "</s>", "<tool_call>", "<think>", "<tool>",
           "<|eot_id|>", "<|begin_of_text|>", "    "]
        + [" the", " licence", " software", " Hello", "Hello", " world"]
    )
    bad = [b"\xff", b"\xc3", b"\xa0", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\x80", b"\xf0\x9f\x98"]
    def any_code_point() -> bytes:
        # Anywhere in Unicode (surrogates too, as the bytes that would encode them), mostly where
        # scripts are.
        c = rng.choice([rng.randrange(0x80, 0x3000), rng.randrange(0x3000, 0x10000), rng.randrange(0x10000, 0x110000)])
        return chr(c).encode("utf-8", "surrogatepass")

    out = []
    for _ in range(n):
        parts = []
        if rng.random() < 0.25:
            for _ in range(rng.randint(1, 30)):
                r = rng.random()
                parts.append(any_code_point() if r < 0.6 else b" " if r < 0.8 else rng.choice(alphabet).encode("utf-8"))
            out.append(b"".join(parts))
            continue
        for _ in range(rng.randint(0, 40)):
            if rng.random() < 0.03:
                parts.append(rng.choice(bad))
            else:
                parts.append(rng.choice(alphabet).encode("utf-8"))
        out.append(b"".join(parts))
    return out


def unicode_table() -> None:
    import unicodedata2 as ud  # the Unicode version of llama.cpp's tables: 15.1

    if ud.unidata_version != "15.1.0":
        raise SystemExit(f"unicodedata2 is at Unicode {ud.unidata_version}; install unicodedata2==15.1.0")

    def cls(c: int) -> str:
        return {"L": "L", "N": "N", "P": "P"}.get(ud.category(chr(c))[0], "O")

    runs, start, cur = [], 0, cls(0)
    for c in range(1, 0x110001):
        k = cls(c) if c < 0x110000 else None
        if k != cur:
            runs.append(f"{cur}{c - start:x}")
            start, cur = c, k
    s = "".join(runs)
    for i in range(0, len(s), 110):
        print(f'    "{s[i:i + 110]}"')


def run(args, files: list[tuple[str, Path]]) -> None:
    """The text forms and golden files, from the tiny vocabularies' GGUF files (in a temporary
    directory, where llama.cpp reads them)."""
    models = []
    for name, path in files:
        text_form = OUT / f"{path.name}.json"
        if args.random:  # the random texts' golden is for the committed vocabularies: they must be these
            if not text_form.is_file() or text_form.read_text(encoding="utf-8") != gguf_json.dump(gguf_json.spec_of(path)):
                raise SystemExit(f"{text_form} is not the vocabulary this machine makes; rerun without --random first")
        else:
            gguf_json.write_text_form(path, text_form)
        # The source names the GGUF file; the test writes it back from tokenizer/<name>.gguf.json.
        models.append((name, path, f"tokenizer/{path.name}"))
    if args.vocab_only:
        print(f"{OUT}: {len(files)} vocabularies' text forms")
        return
    if SMOLLM2.is_file():
        models.append(("smollm2", SMOLLM2, "smollm2"))
    else:
        print(f"warning: {SMOLLM2} is absent (scripts/get-model fetches it); no SmolLM2 golden", file=sys.stderr)

    if args.random:
        if not args.out:
            raise SystemExit("--random needs --out")
        rng = random.Random(args.seed)
        texts = random_texts(rng, args.random)
        out = []
        for name, path, source in models:
            lv = LlamaVocab(path)
            out.append({"source": source, "vocab": lv.info(), "cases": golden_cases(lv, texts, detok=True)})
        write_json(args.out, out)
        print(f"{args.out}: {len(texts)} texts x {len(models)} models")
        return

    for name, path, source in models:
        lv = LlamaVocab(path)
        # The tiny vocabularies' ids are many: fewer licence paragraphs for them, to keep the files small.
        case_texts = test_texts({"smollm2": 3, "tiny-spm-noprefix": 0}.get(name, 1))
        if name == "smollm2":
            # A 16 KB document (the speed check) and a sample of pieces.
            case_texts.append(licence_text("GPL-3")[:16384].encode("utf-8"))
            piece_ids = sorted(set(range(0, lv.n, 97)) | set(range(0, 64)) | {lv.n - 1})
            attrs = False
        else:
            piece_ids = list(range(lv.n))
            attrs = True
        write_json(OUT / f"{name}.golden.json", golden(lv, source, case_texts, piece_ids, attrs))
        print(f"{name}: {len(case_texts)} texts, {len(piece_ids)} pieces")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{OUT}: {total / 1024:.0f} KiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-only", action="store_true", help="write only the tiny vocabularies' text forms")
    ap.add_argument("--random", type=int, default=0, help="write N random texts' golden ids to --out instead")
    ap.add_argument("--out", type=Path, help="the file --random writes")
    ap.add_argument("--unicode-table", action="store_true", help="print tokenizer_gguf.hpp's code point class table")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    if args.unicode_table:
        unicode_table()
        return

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvd-tokenizer-golden-") as tmp:
        run(args, make_tiny_files(Path(tmp)))


if __name__ == "__main__":
    main()
