#!/usr/bin/env python3
"""Writes the GGUF test fixtures of tests/test_gguf.cpp (seeded: the same bytes every run), with
gguf-py's GGUFWriter, and the expectations the tests check into tests/data/gguf/fixtures.json.
The expectations come from what this script wrote (values, types, shapes, sha256 of each
tensor's bytes); offsets are those gguf-py's GGUFReader reports for the written file, which the
script checks against the bytes it passed in.

The repository keeps only text under tests/data: the files are written into a temporary
directory, and what goes into tests/data/gguf/ is their text form, <name>.gguf.json
(scripts/gguf_json.py: metadata, tensor infos and tensor bytes as hex, and the file's sha256),
from which tests/gguf_writer.hpp writes the same bytes back at test time.

  values.gguf        every metadata value type, scalar and array (nested too), and tensors of
                     F32, F16, BF16, Q8_0, Q4_1, I8 and I32 (1 to 4 dimensions)
  v2.gguf            a GGUF version 2 file (v2 and v3 are the same for little-endian files;
                     gguf-py writes v3, so the version field is set to 2)
  align64.gguf       general.alignment 64
  llama_tied.gguf    a 2-layer llama (dim 32, 4/2 heads, hidden 64, vocab 40), F32 + F16 + Q8_0 +
                     Q4_1 weights, no output.weight (tied), rope_freqs.weight, a tokenizer
  llama_output.gguf  a 1-layer llama (dim 32, 2 heads, hidden 64, 48 tokens) with output.weight,
                     F16 and BF16 norms, Q4_0 weights, linear RoPE scaling, general.alignment 2
                     (so that some tensors lie at addresses that are not 4-byte aligned), and no
                     vocab_size, head_count_kv, freq_base or rms epsilon (the defaults apply)

With the real model present (--model, default $KVD_MODEL_DIR or ~/.cache/kvdrive/models, file
SmolLM2-135M-Instruct.Q4_1.gguf) it also writes tests/data/gguf/smollm2.json: what GGUFReader
reports for a few of its tensors (type, shape, offsets, sha256) and for its vocabulary. The model
is not committed; without it the existing smollm2.json is kept.

  python3 scripts/make-gguf-fixtures.py [--out tests/data/gguf] [--model PATH]
"""
import argparse
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V

import gguf_json  # scripts/gguf_json.py

SEED = 20240601
TYPE_NAMES = {V.UINT8: "uint8", V.INT8: "int8", V.UINT16: "uint16", V.INT16: "int16", V.UINT32: "uint32",
              V.INT32: "int32", V.FLOAT32: "float32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array",
              V.UINT64: "uint64", V.INT64: "int64", V.FLOAT64: "float64"}


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def as_json_value(v, vtype, sub=None):
    """The expectation of a value: strings as hex of their bytes, float32 as the float32 value."""
    if vtype == V.STRING:
        return (v if isinstance(v, bytes) else v.encode("utf-8")).hex()
    if vtype == V.FLOAT32:
        return float(np.float32(v))
    if vtype == V.ARRAY:
        et = sub if sub is not None else V.get_type(v[0])
        return [as_json_value(x, et) for x in v]
    if vtype == V.BOOL:
        return bool(v)
    return v


def type_name(v, vtype, sub=None):
    if vtype != V.ARRAY:
        return TYPE_NAMES[vtype]
    et = sub if sub is not None else V.get_type(v[0])
    return f"array[{TYPE_NAMES[et]}; {len(v)}]"


class Fixture:
    """A GGUFWriter that remembers what it was given."""

    def __init__(self, path: Path, arch: str, alignment: int | None = None):
        self.path = path
        self.w = gguf.GGUFWriter(str(path), arch)
        self.kv = [("general.architecture", arch, V.STRING, None)]
        if alignment is not None:
            self.w.add_custom_alignment(alignment)
            self.kv.append(("general.alignment", alignment, V.UINT32, None))
        self.tensors = []  # (name, type name, ggml dims, bytes, values or None)

    def add(self, key, value, vtype, sub=None):
        self.w.add_key_value(key, value, vtype, sub_type=sub)
        self.kv.append((key, value, vtype, sub))

    def tensor(self, name, values: np.ndarray, qtype: Q, keep_values=False):
        """values: float (or int) data in numpy order (rows last-but-one); written as qtype."""
        if qtype in (Q.F32, Q.F16, Q.I8, Q.I16, Q.I32):
            data = values.astype({Q.F32: np.float32, Q.F16: np.float16, Q.I8: np.int8, Q.I16: np.int16,
                                  Q.I32: np.int32}[qtype])
            self.w.add_tensor(name, data)
        else:
            data = gguf.quants.quantize(values.astype(np.float32), qtype)
            self.w.add_tensor(name, data, raw_dtype=qtype)
        dims = list(reversed(values.shape))
        decoded = None
        if keep_values:  # the floats a reader must decode (F16/BF16 exactly representable in float)
            decoded = [float(x) for x in gguf.quants.dequantize(data, qtype).astype(np.float32).ravel()] \
                if qtype not in (Q.F32, Q.F16) else [float(x) for x in data.astype(np.float32).ravel()]
        self.tensors.append((name, qtype.name, dims, data.tobytes(), decoded))

    def write(self, version: int | None = None) -> dict:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        if version is not None:  # v2 files have the v3 layout (little-endian)
            with open(self.path, "r+b") as f:
                f.seek(4)
                f.write(struct.pack("<I", version))
        return self.expect()

    def expect(self) -> dict:
        r = gguf.GGUFReader(str(self.path))
        size = self.path.stat().st_size
        fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
        assert list(fields) == [k for k, *_ in self.kv], (list(fields), self.kv)
        kvs = []
        for key, value, vtype, sub in self.kv:
            kvs.append({"key": key, "type": type_name(value, vtype, sub), "value": as_json_value(value, vtype, sub),
                        "offset": int(fields[key].offset)})
        tensors, data_end = [], 0
        by_name = {t.name: t for t in r.tensors}
        for name, tname, dims, raw, decoded in self.tensors:
            t = by_name[name]
            got = bytes(np.asarray(t.data).tobytes())
            assert got == raw, f"{self.path}: {name}: the reader's bytes differ from the written ones"
            assert t.tensor_type.name == tname and [int(d) for d in t.shape] == dims
            rel = int(t.data_offset) - int(r.data_offset)
            data_end = max(data_end, int(t.data_offset) + len(raw))
            e = {"name": name, "type": tname, "dims": dims, "offset": rel, "file_offset": int(t.data_offset),
                 "bytes": len(raw), "sha256": sha256(raw), "info_offset": int(t.field.offset)}
            if decoded is not None:
                e["values"] = decoded
            tensors.append(e)
        version = struct.unpack("<I", self.path.read_bytes()[4:8])[0]
        return {"file": self.path.name, "version": version, "size": size, "alignment": int(r.alignment),
                "data_offset": int(r.data_offset), "data_end": data_end, "kv": kvs, "tensors": tensors}


def values_file(out: Path, rng) -> dict:
    f = Fixture(out / "values.gguf", "test")
    f.add("test.u8", 200, V.UINT8)
    f.add("test.i8", -100, V.INT8)  # same length as test.u8: the duplicate-key test renames it
    f.add("test.u16", 60000, V.UINT16)
    f.add("test.i16", -30000, V.INT16)
    f.add("test.u32", 4000000000, V.UINT32)
    f.add("test.i32", -2000000000, V.INT32)
    f.add("test.f32", 3.14159, V.FLOAT32)
    f.add("test.bool_true", True, V.BOOL)
    f.add("test.bool_false", False, V.BOOL)
    f.add("test.string", "hello, GGUF", V.STRING)
    f.add("test.utf8", "h\u00e9llo \u2603", V.STRING)
    f.add("test.bytes", b"\xff\x00raw\x80", V.STRING)  # not UTF-8, with a NUL: strings are bytes
    f.add("test.empty", "", V.STRING)
    f.add("test.u64", 2**64 - 1, V.UINT64)
    f.add("test.i64", -(2**63), V.INT64)
    f.add("test.i64_small", 42, V.INT64)
    f.add("test.f64", 2.718281828459045, V.FLOAT64)
    f.add("test.arr_u8", [0, 1, 255], V.ARRAY, V.UINT8)
    f.add("test.arr_i8", [-128, 0, 127], V.ARRAY, V.INT8)
    f.add("test.arr_u16", [0, 65535], V.ARRAY, V.UINT16)
    f.add("test.arr_i16", [int(x) for x in rng.integers(-32768, 32768, size=300)], V.ARRAY, V.INT16)
    f.add("test.arr_u32", [1, 4294967295], V.ARRAY, V.UINT32)
    f.add("test.arr_i32", [-7, 0, 7], V.ARRAY, V.INT32)
    f.add("test.arr_f32", [float(x) for x in rng.standard_normal(5)], V.ARRAY, V.FLOAT32)
    f.add("test.arr_bool", [True, False, True], V.ARRAY, V.BOOL)
    f.add("test.arr_string", ["a", "", "ccc", "\u00fcnic\u00f6de"], V.ARRAY, V.STRING)
    f.add("test.arr_u64", [0, 2**64 - 1], V.ARRAY, V.UINT64)
    f.add("test.arr_i64", [-(2**63), 2**63 - 1], V.ARRAY, V.INT64)
    f.add("test.arr_f64", [0.1, -1e300], V.ARRAY, V.FLOAT64)
    f.add("test.nested_i32", [[1, 2], [3]], V.ARRAY, V.ARRAY)
    f.add("test.nested_str", [["x", "yy"], ["zzz"]], V.ARRAY, V.ARRAY)
    f.add("test.nested3", [[[1.5]], [[2.5, 3.5]]], V.ARRAY, V.ARRAY)
    f.tensor("tensor.a", rng.standard_normal((2, 3)), Q.F32)  # same name length as tensor.b
    f.tensor("tensor.b", rng.standard_normal(4), Q.F16)
    f.tensor("q8_0", rng.standard_normal((2, 64)), Q.Q8_0)
    f.tensor("q4_1", rng.standard_normal((3, 32)), Q.Q4_1)
    f.tensor("bf16", rng.standard_normal(5), Q.BF16)
    f.tensor("i8", rng.integers(-128, 128, size=7), Q.I8)
    f.tensor("i32.4d", rng.integers(-1000, 1000, size=(2, 1, 3, 2)), Q.I32)
    return f.write()


def v2_file(out: Path, rng) -> dict:
    f = Fixture(out / "v2.gguf", "test")
    f.add("test.answer", 42, V.UINT32)
    f.add("test.s", "version two", V.STRING)
    f.tensor("w", rng.standard_normal(4), Q.F32)
    return f.write(version=2)


def align64_file(out: Path, rng) -> dict:
    f = Fixture(out / "align64.gguf", "test", alignment=64)
    f.tensor("a", rng.standard_normal(3), Q.F32)
    f.tensor("b", rng.standard_normal((1, 32)), Q.Q8_0)
    f.tensor("c", rng.standard_normal(5), Q.F16)
    return f.write()


def tokenizer(f: Fixture, n: int, rng, with_scores: bool):
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(n - 3)]
    f.add("tokenizer.ggml.model", "gpt2", V.STRING)
    f.add("tokenizer.ggml.pre", "smollm", V.STRING)
    f.add("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING)
    f.add("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (n - 3), V.ARRAY, V.INT32)
    if with_scores:
        f.add("tokenizer.ggml.scores", [float(x) for x in -rng.random(n)], V.ARRAY, V.FLOAT32)
    f.add("tokenizer.ggml.merges", ["t 1", "t 2", "t1 0", "t 3", "t2 1"], V.ARRAY, V.STRING)
    f.add("tokenizer.ggml.bos_token_id", 1, V.UINT32)
    f.add("tokenizer.ggml.eos_token_id", 2, V.UINT32)
    f.add("tokenizer.ggml.unknown_token_id", 0, V.UINT32)
    f.add("tokenizer.ggml.add_bos_token", True, V.BOOL)
    f.add("tokenizer.ggml.add_space_prefix", False, V.BOOL)
    f.add("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}", V.STRING)


def llama_tied(out: Path, rng) -> dict:
    dim, hidden, layers, heads, kv_heads, vocab, ctx = 32, 64, 2, 4, 2, 40, 256
    hd = dim // heads
    kv = kv_heads * hd
    f = Fixture(out / "llama_tied.gguf", "llama")
    f.add("general.name", "tiny tied llama", V.STRING)
    f.add("llama.block_count", layers, V.UINT32)
    f.add("llama.context_length", ctx, V.UINT32)
    f.add("llama.embedding_length", dim, V.UINT32)
    f.add("llama.feed_forward_length", hidden, V.UINT32)
    f.add("llama.attention.head_count", heads, V.UINT32)
    f.add("llama.attention.head_count_kv", kv_heads, V.UINT32)
    f.add("llama.rope.freq_base", 500000.0, V.FLOAT32)
    f.add("llama.attention.layer_norm_rms_epsilon", 1e-6, V.FLOAT32)
    f.add("llama.vocab_size", vocab, V.UINT32)
    f.add("llama.rope.dimension_count", hd, V.UINT32)
    tokenizer(f, vocab, rng, with_scores=True)
    m = lambda rows, cols: rng.standard_normal((rows, cols)) * 0.1  # noqa: E731
    f.tensor("token_embd.weight", m(vocab, dim), Q.Q8_0)
    f.tensor("rope_freqs.weight", np.array([1.0, 2.0, 4.0, 8.0]), Q.F32, keep_values=True)
    types = [  # per layer: q, k, v, o, gate, down, up
        [Q.Q4_1, Q.Q4_1, Q.Q8_0, Q.Q4_1, Q.Q4_1, Q.Q4_1, Q.Q8_0],
        [Q.F32, Q.F16, Q.Q4_1, Q.Q8_0, Q.Q4_1, Q.Q8_0, Q.Q4_1],
    ]
    for l in range(layers):
        t = types[l]
        f.tensor(f"blk.{l}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.F32)
        f.tensor(f"blk.{l}.attn_q.weight", m(dim, dim), t[0])
        f.tensor(f"blk.{l}.attn_k.weight", m(kv, dim), t[1])
        f.tensor(f"blk.{l}.attn_v.weight", m(kv, dim), t[2])
        f.tensor(f"blk.{l}.attn_output.weight", m(dim, dim), t[3])
        f.tensor(f"blk.{l}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.F32)
        f.tensor(f"blk.{l}.ffn_gate.weight", m(hidden, dim), t[4])
        f.tensor(f"blk.{l}.ffn_down.weight", m(dim, hidden), t[5])
        f.tensor(f"blk.{l}.ffn_up.weight", m(hidden, dim), t[6])
    f.tensor("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.F32)
    e = f.write()
    e["config"] = {"dim": dim, "hidden_dim": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads,
                   "vocab": vocab, "max_seq": ctx, "rope_theta": 500000.0, "rms_eps": float(np.float32(1e-6)),
                   "tied_embeddings": True, "rope_freq_factors": [1.0, 2.0, 4.0, 8.0]}
    return e


def llama_output(out: Path, rng) -> dict:
    dim, hidden, heads, vocab, ctx = 32, 64, 2, 48, 128
    f = Fixture(out / "llama_output.gguf", "llama", alignment=2)
    f.add("llama.block_count", 1, V.UINT32)
    f.add("llama.context_length", ctx, V.UINT64)  # any integer type will do
    f.add("llama.embedding_length", dim, V.INT32)
    f.add("llama.feed_forward_length", hidden, V.UINT32)
    f.add("llama.attention.head_count", heads, V.UINT16)
    f.add("llama.rope.scaling.type", "linear", V.STRING)
    f.add("llama.rope.scaling.factor", 4.0, V.FLOAT32)
    tokenizer(f, vocab, rng, with_scores=False)
    m = lambda rows, cols: rng.standard_normal((rows, cols)) * 0.1  # noqa: E731
    f.tensor("token_embd.weight", m(vocab, dim), Q.Q8_0)
    f.tensor("blk.0.attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.F16, keep_values=True)
    f.tensor("blk.0.attn_q.weight", m(dim, dim), Q.Q4_0)  # the non-computable-type test makes it IQ4_NL
    f.tensor("blk.0.attn_k.weight", m(dim, dim), Q.Q8_0)
    f.tensor("blk.0.attn_v.weight", m(dim, dim), Q.Q4_1)
    f.tensor("blk.0.attn_output.weight", m(dim, dim), Q.Q4_0)
    f.tensor("blk.0.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.BF16, keep_values=True)
    f.tensor("blk.0.ffn_gate.weight", m(hidden, dim), Q.Q4_1)
    f.tensor("blk.0.ffn_down.weight", m(dim, hidden), Q.Q4_0)
    f.tensor("blk.0.ffn_up.weight", m(hidden, dim), Q.Q8_0)
    f.tensor("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim), Q.F32)
    f.tensor("output.weight", m(vocab, dim), Q.Q4_0)
    e = f.write()
    misaligned = [t["name"] for t in e["tensors"] if t["file_offset"] % 4 != 0]
    assert any(t["type"] == "F32" for t in e["tensors"] if t["name"] in misaligned) and \
        any(t["type"] not in ("F16", "BF16", "F32") for t in e["tensors"] if t["name"] in misaligned), misaligned
    e["misaligned"] = misaligned
    e["config"] = {"dim": dim, "hidden_dim": hidden, "layers": 1, "heads": heads, "kv_heads": heads, "vocab": vocab,
                   "max_seq": ctx, "rope_theta": 10000.0, "rms_eps": float(np.float32(1e-5)),
                   "tied_embeddings": False, "rope_freq_factors": [4.0] * (dim // heads // 2)}
    return e


def smollm2(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in r.tensors}
    tensors = []
    for name in ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                 "blk.29.ffn_down.weight", "output_norm.weight"]:
        t = by_name[name]
        raw = bytes(np.asarray(t.data).tobytes())
        tensors.append({"name": name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape],
                        "offset": int(t.data_offset) - int(r.data_offset), "file_offset": int(t.data_offset),
                        "bytes": len(raw), "sha256": sha256(raw)})
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]) for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]) for i in f["tokenizer.ggml.merges"].data]
    return {"file": path.name, "size": path.stat().st_size, "version": int(f["GGUF.version"].parts[0][0]),
            "tensor_count": len(r.tensors), "kv_count": int(f["GGUF.kv_count"].parts[0][0]),
            "data_offset": int(r.data_offset), "tensors": tensors,
            "vocab": {"tokens": len(tokens), "merges": len(merges),
                      "tokens_sha256": sha256(b"\n".join(tokens)), "merges_sha256": sha256(b"\n".join(merges)),
                      "first_tokens": [t.hex() for t in tokens[:4]], "first_merges": [m.hex() for m in merges[:3]],
                      "bos": int(f["tokenizer.ggml.bos_token_id"].parts[-1][0]),
                      "eos": int(f["tokenizer.ggml.eos_token_id"].parts[-1][0])}}


def dump(expect: dict) -> str:
    """JSON with one line per key/value, tensor and setting (small, and diffs stay readable)."""
    def block(d: dict, pad: str) -> str:
        rows = []
        for k, v in d.items():
            if isinstance(v, dict):
                rows.append(f"{pad} {json.dumps(k)}: {block(v, pad + ' ')}")
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                items = ",\n".join(f"{pad}  {json.dumps(x)}" for x in v)
                rows.append(f"{pad} {json.dumps(k)}: [\n{items}\n{pad} ]")
            else:
                rows.append(f"{pad} {json.dumps(k)}: {json.dumps(v)}")
        return "{\n" + ",\n".join(rows) + f"\n{pad}}}"
    return block(expect, "") + "\n"


def main():
    root = Path(__file__).resolve().parent.parent
    model_dir = Path(os.environ.get("KVD_MODEL_DIR") or Path.home() / ".cache" / "kvdrive" / "models")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=root / "tests" / "data" / "gguf")
    ap.add_argument("--model", type=Path, default=model_dir / "SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    expect = {"seed": SEED}
    written = [args.out / "fixtures.json"]
    with tempfile.TemporaryDirectory(prefix="kvd-gguf-fixtures-") as tmp:
        for make in (values_file, v2_file, align64_file, llama_tied, llama_output):
            e = make(Path(tmp), rng)
            expect[Path(e["file"]).stem] = e
            written.append(args.out / (e["file"] + ".json"))
            gguf_json.write_text_form(Path(tmp) / e["file"], written[-1])
    written[0].write_text(dump(expect))
    total = sum(p.stat().st_size for p in written)
    print(f"make-gguf-fixtures: wrote {len(written)} files into {args.out} ({total} bytes)")
    if args.model.is_file():
        (args.out / "smollm2.json").write_text(dump(smollm2(args.model)))
        print(f"make-gguf-fixtures: wrote {args.out / 'smollm2.json'} from {args.model}")
    else:
        print(f"make-gguf-fixtures: {args.model} is absent; smollm2.json kept as it was")


if __name__ == "__main__":
    main()
