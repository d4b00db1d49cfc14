#!/usr/bin/env python3
"""Writes the golden files of tests/test_quant.cpp: for each GGUF type the decoder computes with
(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), a few seeded random blocks and
the floats that the reference decoder, gguf-py's gguf.quants.dequantize, makes of them.

Blocks are random bytes for the quantized values (and for the 6-bit packed scales of Q4_K/Q5_K,
the int8 scales of Q6_K), with finite fp16 scales: the first blocks of each type take edge cases
(+0, -0, the smallest and largest subnormal, the smallest normal, +-65504, +-1, negative scales and
minimums), the others realistic magnitudes (|d| around 1e-4..5e-2, minimums around -8 d).

One JSON file per type, tests/data/quant/<TYPE>.json (text: the repository keeps no binary
test data):
  {"type": "Q4_K", "type_id": 12, "block_elements": 256, "block_bytes": 144, "elements": 3072,
   "rows": [{"bytes": HEX, "values": [BITS, ...]}, ...]}
each row one block (32 elements of the float types): "bytes" the blocks as a GGUF tensor stores
them, in hex; "values" what gguf.quants.dequantize makes of them, each float32 as the 8 hex
digits of its bits (exact, and NaNs and infinities are no JSON numbers).

Usage: scripts/make-quant-golden.py [out_dir]   (default tests/data/quant; needs numpy, gguf)
"""

import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

SEED = 20240611

# fp16 bit patterns of the edge-case scales (all finite).
EDGE_F16 = [
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal, 2^-24
    0x03FF,  # largest subnormal
    0x8001,  # negative subnormal
    0x0400,  # smallest normal, 2^-14
    0x7BFF,  # 65504, the largest finite
    0xFBFF,  # -65504
    0x3C00,  # 1
    0xBC00,  # -1
    0x2E66,  # ~0.1
]


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint16)


def realistic_d(rng, n, signed=True):
    mag = np.exp(rng.uniform(np.log(1e-4), np.log(5e-2), n))
    if signed:
        mag *= rng.choice([-1.0, 1.0], n)
    return f16_bits(mag)


def scale_pair(rng, i, n_edge, realistic_min):
    """fp16 bits of (d, m) for block i: edge cases first, then realistic values."""
    if i < n_edge:
        d = EDGE_F16[i % len(EDGE_F16)]
        m = EDGE_F16[(i * 5 + 3) % len(EDGE_F16)]
        return np.uint16(d), np.uint16(m)
    d = realistic_d(rng, 1, signed=not realistic_min)[0]
    dv = float(np.uint16(d).view(np.float16))
    m = f16_bits(-8.0 * abs(dv) * rng.uniform(0.5, 1.5))[()] if realistic_min else realistic_d(rng, 1)[0]
    return np.uint16(d), np.uint16(m)


def u16le(v):
    return np.array([v], dtype="<u2").view(np.uint8)


def blocks_32(rng, qtype, n):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 blocks."""
    out = []
    for i in range(n):
        has_min = qtype in (T.Q4_1, T.Q5_1)
        d, m = scale_pair(rng, i, len(EDGE_F16), has_min)
        parts = [u16le(d)]
        if has_min:
            parts.append(u16le(m))
        if qtype in (T.Q5_0, T.Q5_1):
            parts.append(rng.integers(0, 256, 4, dtype=np.uint8))  # qh: the 5th bits
        qbytes = 32 if qtype == T.Q8_0 else 16
        q = rng.integers(0, 256, qbytes, dtype=np.uint8)
        if i == 0:
            q[:] = 0x00
        elif i == 1:
            q[:] = 0xFF
        parts.append(q)
        out.append(np.concatenate(parts))
    return np.stack(out)


def blocks_k(rng, qtype, n):
    """Q4_K, Q5_K, Q6_K blocks."""
    out = []
    n_edge = 8
    for i in range(n):
        if qtype == T.Q6_K:
            ql = rng.integers(0, 256, 128, dtype=np.uint8)
            qh = rng.integers(0, 256, 64, dtype=np.uint8)
            sc = rng.integers(-128, 128, 16).astype(np.int8)
            if i == 0:
                sc[:] = -128
            elif i == 1:
                sc[:] = 127
            d, _ = scale_pair(rng, i, n_edge, False)
            out.append(np.concatenate([ql, qh, sc.view(np.uint8), u16le(d)]))
            continue
        d, dmin = scale_pair(rng, i, n_edge, False)
        if i >= n_edge:
            dmin = realistic_d(rng, 1, signed=False)[0]
        scales = rng.integers(0, 256, 12, dtype=np.uint8)
        if i == 0:
            scales[:] = 0xFF
        elif i == 1:
            scales[:] = 0x00
        parts = [u16le(d), u16le(dmin), scales]
        if qtype == T.Q5_K:
            parts.append(rng.integers(0, 256, 32, dtype=np.uint8))
        parts.append(rng.integers(0, 256, 128, dtype=np.uint8))
        out.append(np.concatenate(parts))
    return np.stack(out)


def plain(rng, qtype, n):
    if qtype == T.F32:
        v = rng.standard_normal(n).astype(np.float32)
        special = np.array([0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
                            0x7F800000, 0xFF800000, 0x7FC00001], dtype=np.uint32).view(np.float32)
        v[: len(special)] = special
        return v.view(np.uint8).reshape(n, 4)
    bits = rng.integers(0, 65536, n, dtype=np.uint16)
    special = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00], dtype=np.uint16)
    if qtype == T.BF16:
        special = np.array([0x0000, 0x8000, 0x0001, 0x007F, 0x8001, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC1],
                           dtype=np.uint16)
    else:  # F16: keep NaNs out (their payloads are not part of the format's definition)
        nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0)
        bits[nan] &= 0xBFFF
    bits[: len(special)] = special
    return bits.view(np.uint8).reshape(n, 2)


def golden_json(qtype, block_elems: int, block_bytes: int, raw: bytes, ref: np.ndarray) -> str:
    """The golden file's text: one line per row of blocks (a block, or 32 elements of a float type)."""
    per_row = max(1, 32 // block_elems)
    bits = np.ascontiguousarray(ref, dtype="<f4").view("<u4")
    rows = []
    for first in range(0, len(raw) // block_bytes, per_row):
        b = raw[first * block_bytes:(first + per_row) * block_bytes]
        v = bits[first * block_elems:first * block_elems + len(b) // block_bytes * block_elems]
        rows.append(f'  {{"bytes": "{b.hex()}", "values": {json.dumps([f"{int(x):08x}" for x in v])}}}')
    head = {"type": qtype.name, "type_id": int(qtype), "block_elements": block_elems, "block_bytes": block_bytes,
            "elements": int(ref.size)}
    return ("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()) + ' "rows": [\n'
            + ",\n".join(rows) + "\n ]\n}\n")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    jobs = [
        (T.F32, lambda: plain(rng, T.F32, 256)),
        (T.F16, lambda: plain(rng, T.F16, 512)),
        (T.BF16, lambda: plain(rng, T.BF16, 512)),
        (T.Q4_0, lambda: blocks_32(rng, T.Q4_0, 24)),
        (T.Q4_1, lambda: blocks_32(rng, T.Q4_1, 24)),
        (T.Q5_0, lambda: blocks_32(rng, T.Q5_0, 24)),
        (T.Q5_1, lambda: blocks_32(rng, T.Q5_1, 24)),
        (T.Q8_0, lambda: blocks_32(rng, T.Q8_0, 24)),
        (T.Q4_K, lambda: blocks_k(rng, T.Q4_K, 12)),
        (T.Q5_K, lambda: blocks_k(rng, T.Q5_K, 12)),
        (T.Q6_K, lambda: blocks_k(rng, T.Q6_K, 12)),
    ]
    total = 0
    for qtype, make in jobs:
        blocks = make()
        elems, type_bytes = GGML_QUANT_SIZES[qtype]
        assert blocks.dtype == np.uint8 and blocks.shape[1] == type_bytes, (qtype.name, blocks.shape)
        raw = np.ascontiguousarray(blocks).reshape(1, -1)
        ref = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1)
        n_elems = blocks.shape[0] * elems
        assert ref.size == n_elems
        if qtype != T.F32 and qtype != T.BF16:
            assert np.all(np.isfinite(ref) | np.isinf(ref)), qtype.name
        path = os.path.join(out_dir, qtype.name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(golden_json(qtype, elems, type_bytes, raw.tobytes(), ref))
        total += os.path.getsize(path)
        print(f"{os.path.relpath(path)}: {blocks.shape[0]} blocks of {elems}, {n_elems} values, {os.path.getsize(path)} bytes")
    print(f"{total} bytes in all")


if __name__ == "__main__":
    main()
