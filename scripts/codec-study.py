#!/usr/bin/env python3
"""INT4/INT8 KV-page quantization study on an attention trace that kvd-llama recorded.

It reads the trace (format: docs/trace-format.md, version 1), takes the prompt's keys and values
in whole 8-token pages (P = the prompt length rounded down to a multiple of 8; the prompt length
is --prompt-len, or by default the first decode position found in the record order) and quantizes
each page's [8 tokens x head_dim] block per KV head with several codecs, which differ in how the
block is grouped (per channel, per token, channel pairs (2i,2i+1) or (i,i+32)) and in how each
group's min/max is stored (fp16 min and scale, or u8 codes relative to the block's f32 min/max).
The last --last positions (the decode steps) are the queries; keys and values from P on stay
exact. For each codec and bit width (4, 8) it prints the block bytes and their ratio to f16, and
against exact attention: the logit error |dl| on quantized keys, the KL divergence of the
attention distribution (mean and worst layer) and the relative error of the attention output;
then K/V combinations, the per-layer KL at 4 bits, and the channels of K and V whose mean |x| is
over 4x their head's median channel (outliers). --extras adds the variants that fit a 0.30 page:
per-channel K with 4-bit min/max codes, and page 0 (the attention sink) kept exact.

Recording the trace (about 120 MB for a 2k-token prompt on SmolLM2):

  build/examples/llama3/kvd-llama --model smollm2 --prompt-file FILE --steps 16 --ignore-eos \
      --mode dense --record-trace FILE.trace --threads 2

The study's trace used the first 260 lines of /usr/lib/python3.11/argparse.py as FILE
(2059 prompt tokens, 2074 positions, P = 2056, 257 pages).

Usage: scripts/codec-study.py TRACE [--prompt-len N] [--last 16] [--extras]   (needs numpy)
"""
import argparse
import struct

import numpy as np

PT = 8  # tokens per page


# ----------------------------------------------------------------------------- trace reader
def read_trace(path):
    raw = np.fromfile(path, dtype=np.uint8)
    magic, ver, dt, L, QH, KH, D, r0, r1 = struct.unpack("<8s8I", raw[:40].tobytes())
    assert magic == b"KVDTRACE" and ver == 1, (magic, ver)
    foot = raw[-24:].tobytes()
    fmagic, nrec, _xxh = struct.unpack("<8sQQ", foot)
    assert fmagic == b"KVDTEND!", "no footer"
    vdt = {0: "<f4", 1: "<f2", 2: "<u2"}[dt]
    esz = 4 if dt == 0 else 2
    n = (QH + 2 * KH) * D
    rec = np.dtype([("pos", "<u8"), ("layer", "<u4"), ("res", "<u4"), ("x", vdt, (n,))])
    body = raw[40:-24]
    assert body.size == nrec * rec.itemsize, (body.size, nrec, rec.itemsize)
    recs = body.view(rec)
    x = recs["x"]
    if dt == 2:  # bf16 -> f32
        x = (x.astype(np.uint32) << 16).view(np.float32)
    x = x.astype(np.float32)
    pos = recs["pos"].astype(np.int64)
    lay = recs["layer"].astype(np.int64)
    N = int(pos.max()) + 1
    Q = np.zeros((L, N, QH, D), np.float32)
    K = np.zeros((L, N, KH, D), np.float32)
    V = np.zeros((L, N, KH, D), np.float32)
    seen = np.zeros((L, N), bool)
    # later record replaces earlier: plain fancy assignment keeps the last write for duplicates
    # in numpy only by accident, so dedupe explicitly.
    key = lay * N + pos
    _, last = np.unique(key[::-1], return_index=True)
    idx = len(key) - 1 - last
    q = x[idx, : QH * D].reshape(-1, QH, D)
    k = x[idx, QH * D: (QH + KH) * D].reshape(-1, KH, D)
    v = x[idx, (QH + KH) * D:].reshape(-1, KH, D)
    Q[lay[idx], pos[idx]] = q
    K[lay[idx], pos[idx]] = k
    V[lay[idx], pos[idx]] = v
    seen[lay[idx], pos[idx]] = True
    assert seen.all(), "missing (layer, position) records"
    meta = dict(dtype={0: "f32", 1: "f16", 2: "bf16"}[dt], layers=L, q_heads=QH, kv_heads=KH,
                head_dim=D, records=nrec, positions=N, rec_order_pos=pos, rec_order_layer=lay)
    return Q, K, V, meta


# ----------------------------------------------------------------------------- quantizers
# X: (..., 8, 64) page blocks. Each quantizer returns the dequantized block (float64).

def _levels(b):
    return (1 << b) - 1


def _quant_groups(G, gmin, gmax, b):
    """G: (..., groups, n) values; gmin/gmax: (..., groups, 1) the range the levels span."""
    s = (gmax - gmin) / _levels(b)
    safe = np.where(s > 0, s, 1.0)
    c = np.clip(np.rint((G - gmin) / safe), 0, _levels(b))
    return np.where(s > 0, gmin + c * s, gmin)


def _fp16_params(G, b):
    gmin = G.min(-1, keepdims=True)
    gmax = G.max(-1, keepdims=True)
    m16 = gmin.astype(np.float16).astype(np.float64)
    s16 = ((gmax - gmin) / _levels(b)).astype(np.float16).astype(np.float64)
    safe = np.where(s16 > 0, s16, 1.0)
    c = np.clip(np.rint((G - m16) / safe), 0, _levels(b))
    return np.where(s16 > 0, m16 + c * s16, m16)


def _u8_params(G, b, lo, hi):
    """lo/hi: block float32 min/max, shape (..., 1, 1)."""
    lo = lo.astype(np.float32).astype(np.float64)
    hi = hi.astype(np.float32).astype(np.float64)
    unit = ((hi - lo) / 255.0).astype(np.float32).astype(np.float64)
    safe = np.where(unit > 0, unit, 1.0)
    gmin = G.min(-1, keepdims=True)
    gmax = G.max(-1, keepdims=True)
    mc = np.clip(np.floor((gmin - lo) / safe), 0, 255)
    Mc = np.clip(np.ceil((gmax - lo) / safe), 0, 255)
    # guard against float rounding: make sure the decoded range covers the group
    mc = np.where(lo + mc * unit > gmin, np.maximum(mc - 1, 0), mc)
    Mc = np.where(lo + Mc * unit < gmax, np.minimum(Mc + 1, 255), Mc)
    return _quant_groups(G, lo + mc * unit, lo + Mc * unit, b)


# group layouts: to (..., groups, n) and back
def g_channel(X):            # (...,8,64) -> (...,64,8)
    return np.swapaxes(X, -1, -2)


def ug_channel(G):
    return np.swapaxes(G, -1, -2)


def g_token(X):
    return X


ug_token = g_token


def g_pair_adj(X):           # channels (2i,2i+1) -> (...,32,16)
    T, D = X.shape[-2:]
    Y = X.reshape(X.shape[:-1] + (D // 2, 2))          # (...,8,32,2)
    Y = np.moveaxis(Y, -3, -2)                          # (...,32,8,2)
    return Y.reshape(Y.shape[:-2] + (T * 2,))


def ug_pair_adj(G, T=PT):
    D2 = G.shape[-2]
    Y = G.reshape(G.shape[:-1] + (T, 2))               # (...,32,8,2)
    Y = np.moveaxis(Y, -2, -3)                          # (...,8,32,2)
    return Y.reshape(Y.shape[:-2] + (D2 * 2,))


def g_pair_half(X):          # channels (i,i+32) -> (...,32,16)
    T, D = X.shape[-2:]
    Y = X.reshape(X.shape[:-1] + (2, D // 2))          # (...,8,2,32)
    Y = np.moveaxis(Y, -1, -3)                          # (...,32,8,2)
    return Y.reshape(Y.shape[:-2] + (T * 2,))


def ug_pair_half(G, T=PT):
    D2 = G.shape[-2]
    Y = G.reshape(G.shape[:-1] + (T, 2))               # (...,32,8,2)
    Y = np.moveaxis(Y, -3, -1)                          # (...,8,2,32)
    return Y.reshape(Y.shape[:-2] + (D2 * 2,))


def make(layout, params):
    g, ug = layout

    def q(X, b):
        lo = X.min(axis=(-1, -2), keepdims=True)
        hi = X.max(axis=(-1, -2), keepdims=True)
        G = g(X)
        if params == "f16":
            Gq = _fp16_params(G, b)
        else:
            Gq = _u8_params(G, b, lo, hi)
        return ug(Gq)
    return q


CH = (g_channel, ug_channel)
TOK = (g_token, ug_token)
PADJ = (g_pair_adj, ug_pair_adj)
PHALF = (g_pair_half, ug_pair_half)


def block_bytes(groups, params, b, T=PT, D=64):
    data = T * D * b // 8
    if params == "f16":
        return data + 4 * groups
    return data + 2 * groups + 8


K_SCHEMES = {
    "K1 ch/f16":   (make(CH, "f16"), 64, "f16"),
    "K2 ch/u8":    (make(CH, "u8"), 64, "u8"),
    "K3 pair(2i,2i+1)/u8": (make(PADJ, "u8"), 32, "u8"),
    "K4 pair(i,i+32)/u8":  (make(PHALF, "u8"), 32, "u8"),
    "K5 tok/u8":   (make(TOK, "u8"), 8, "u8"),
}
V_SCHEMES = {
    "V1 tok/f16":  (make(TOK, "f16"), 8, "f16"),
    "V2 tok/u8":   (make(TOK, "u8"), 8, "u8"),
    "V3 ch/u8":    (make(CH, "u8"), 64, "u8"),
}


# ----------------------------------------------------------------------------- evaluation
def softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis, keepdims=True)


def log_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


class Evaluator:
    def __init__(self, Q, K, V, P, qpos):
        self.Q = Q.astype(np.float64)
        self.K = K.astype(np.float64)
        self.V = V.astype(np.float64)
        self.L, self.N, self.QH, self.D = Q.shape
        self.KH = K.shape[2]
        self.grp = self.QH // self.KH
        self.P = P
        self.qpos = np.asarray(qpos)
        self.scale = 1.0 / np.sqrt(self.D)
        # pages: (L, KH, npages, 8, D)
        npg = P // PT
        self.Kpg = self.K[:, :P].reshape(self.L, npg, PT, self.KH, self.D).transpose(0, 3, 1, 2, 4)
        self.Vpg = self.V[:, :P].reshape(self.L, npg, PT, self.KH, self.D).transpose(0, 3, 1, 2, 4)
        # exact logits for every query: (L, QH, nq, N); masked causally
        qs = self.Q[:, self.qpos]                      # (L, nq, QH, D)
        Kh = self.K[:, :, np.arange(self.QH) // self.grp]  # (L, N, QH, D)
        self.qs = qs
        self.raw = np.einsum("lqhd,lnhd->lhqn", qs, Kh) * self.scale
        pos = np.arange(self.N)
        self.causal = pos[None, :] <= self.qpos[:, None]                     # (nq, N)
        self.quantmask = (pos[None, :] < np.minimum(P, self.qpos)[:, None])  # keys that are quantized
        self.logit = np.where(self.causal[None, None], self.raw, -np.inf)
        self.p = softmax(self.logit)
        self.logp = log_softmax(self.logit)
        Vh = self.V[:, :, np.arange(self.QH) // self.grp]
        self.Vh = Vh
        self.out = np.einsum("lhqn,lnhd->lhqd", self.p, Vh)

    def unpage(self, Xpg, X):
        """(L,KH,npg,8,D) -> full (L,N,KH,D) with positions >= P taken from X."""
        Y = X.copy()
        Y[:, : self.P] = Xpg.transpose(0, 2, 3, 1, 4).reshape(self.L, self.P, self.KH, self.D)
        return Y

    def keys_metrics(self, Kq):
        """Kq: full (L,N,KH,D) with quantized first P positions."""
        Kh = Kq[:, :, np.arange(self.QH) // self.grp]
        lq = np.einsum("lqhd,lnhd->lhqn", self.qs, Kh) * self.scale
        qm = np.broadcast_to(self.quantmask[None, None], lq.shape)
        # keys at positions >= min(P, qpos) stay exact
        err = np.abs(lq - self.raw)[qm]
        lq = np.where(qm, lq, self.raw)
        lq = np.where(self.causal[None, None], lq, -np.inf)
        logq = log_softmax(lq)
        with np.errstate(invalid="ignore"):
            kl = np.where(self.causal[None, None], self.p * (self.logp - logq), 0.0).sum(-1)  # (L,QH,nq)
        return err, kl, softmax(lq)

    def out_err(self, p, Vq):
        Vh = Vq[:, :, np.arange(self.QH) // self.grp]
        o = np.einsum("lhqn,lnhd->lhqd", p, Vh)
        return np.linalg.norm(o - self.out, axis=-1) / np.linalg.norm(self.out, axis=-1)  # (L,QH,nq)


# ----------------------------------------------------------------------------- extras
def _u4_params(G, b, lo, hi):
    """Per-group min/max as 4-bit codes relative to the block's range."""
    lo = lo.astype(np.float64)
    hi = hi.astype(np.float64)
    unit = (hi - lo) / 15
    safe = np.where(unit > 0, unit, 1)
    gmin = G.min(-1, keepdims=True)
    gmax = G.max(-1, keepdims=True)
    mc = np.clip(np.floor((gmin - lo) / safe), 0, 15)
    Mc = np.clip(np.ceil((gmax - lo) / safe), 0, 15)
    mc = np.where(lo + mc * unit > gmin, np.maximum(mc - 1, 0), mc)
    Mc = np.where(lo + Mc * unit < gmax, np.minimum(Mc + 1, 15), Mc)
    return _quant_groups(G, lo + mc * unit, lo + Mc * unit, b)


def k6_channel_u4(X, b):
    """K6: per-channel groups, min/max as 4-bit codes of the block's f32 range."""
    lo = X.min(axis=(-1, -2), keepdims=True)
    hi = X.max(axis=(-1, -2), keepdims=True)
    return ug_channel(_u4_params(g_channel(X), b, lo, hi))


def k6_bytes(b, T=PT, D=64):
    return T * D * b // 8 + D + 8  # two 4-bit codes per channel group, block f32 min/max


def extras(ev, Q, K, P, qpos):
    """Variants that fit a 0.30 page: per-channel K with 4-bit min/max codes; page 0 exact."""
    L, N, KH, D = K.shape
    grp = Q.shape[2] // KH
    print("\n== extras: variants that fit a 0.30 page (per-channel K with 4-bit min/max codes; page 0 exact)")
    # q weight on partner channels of K outlier channels
    ka = np.abs(K[:, :P]).mean(1)
    r = ka / np.median(ka, -1, keepdims=True)
    qa = np.abs(Q[:, qpos]).mean(1).reshape(L, KH, grp, D).mean(2)  # per kv group
    L_, H_, C_ = np.nonzero(r > 8)
    adjp = C_ ^ 1
    halfp = (C_ + D // 2) % D
    med = np.median(qa, -1)
    print("mean|q| at outlier-channel partner / median channel: adjacent partner %.2f, (i+32) partner %.2f, "
          "outlier itself %.2f" % ((qa[L_, H_, adjp] / med[L_, H_]).mean(), (qa[L_, H_, halfp] / med[L_, H_]).mean(),
                                   (qa[L_, H_, C_] / med[L_, H_]).mean()))

    f16_page = 2 * PT * D * 2  # K and V blocks in f16
    fV1 = V_SCHEMES["V1 tok/f16"][0]
    fV2 = V_SCHEMES["V2 tok/u8"][0]

    def kv_bytes(kname, vname, b):
        return (block_bytes(*K_SCHEMES[kname][1:], b) if kname else k6_bytes(b)) + block_bytes(*V_SCHEMES[vname][1:], b)

    def run(name, fk, fv, b, bytes_, exact0=False):
        Kq = fk(ev.Kpg, b)
        Vq = fv(ev.Vpg, b)
        if exact0:
            Kq[:, :, 0] = ev.Kpg[:, :, 0]
            Vq[:, :, 0] = ev.Vpg[:, :, 0]
        Kq = ev.unpage(Kq, ev.K)
        Vq = ev.unpage(Vq, ev.V)
        err, kl, pq = ev.keys_metrics(Kq)
        oe = ev.out_err(pq, Vq)
        klL = kl.mean((1, 2))
        print(f"{name:34s} b={b} page {bytes_:4d} B ({bytes_ / f16_page:.3f})  mean|dl| {err.mean():.2e}  "
              f"KL {kl.mean():.2e}  worst {klL.max():.2e}(L{klL.argmax()})  rel out {oe.mean():.2e}")

    K1, K2, K3, K4 = (K_SCHEMES[k][0] for k in ("K1 ch/f16", "K2 ch/u8", "K3 pair(2i,2i+1)/u8", "K4 pair(i,i+32)/u8"))
    for b in (4, 8):
        run("K6 ch/u4-codes + V2", k6_channel_u4, fV2, b, kv_bytes(None, "V2 tok/u8", b))
        run("K2 ch/u8 + V2, page 0 exact", K2, fV2, b, kv_bytes("K2 ch/u8", "V2 tok/u8", b), True)
        run("K4 pair(i,i+32) + V2", K4, fV2, b, kv_bytes("K4 pair(i,i+32)/u8", "V2 tok/u8", b))
    # an exact page 0 costs (f16 page - quantized page) once; as a share of the f16 cache (b=4, 0.297 page)
    npg = P // PT
    extra = (f16_page - kv_bytes("K4 pair(i,i+32)/u8", "V2 tok/u8", 4)) / f16_page / npg
    print(f"-- page 0 (sink page) exact, cost amortized over {npg} pages is ~{100 * extra:.1f}%:")

    def fid(X, b):
        return X.copy()
    for b in (4, 8):
        run("V2 only (K exact), page 0 exact", fid, fV2, b, 0, True)
        run("V2 only (K exact)", fid, fV2, b, 0, False)
        run("K3 pair(2i,2i+1) + V2, p0 exact", K3, fV2, b, kv_bytes("K3 pair(2i,2i+1)/u8", "V2 tok/u8", b), True)
        run("K4 pair(i,i+32) + V2, p0 exact", K4, fV2, b, kv_bytes("K4 pair(i,i+32)/u8", "V2 tok/u8", b), True)
        run("K6 ch/u4-codes + V2, p0 exact", k6_channel_u4, fV2, b, kv_bytes(None, "V2 tok/u8", b), True)
        run("K1 ch/f16 + V1, p0 exact", K1, fV1, b, kv_bytes("K1 ch/f16", "V1 tok/f16", b), True)


def main():
    ap = argparse.ArgumentParser(description="INT4/INT8 KV-page quantization study on a kvd-llama trace")
    ap.add_argument("trace", help="kvd-llama --record-trace file (docs/trace-format.md)")
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="prompt tokens (default: positions - decode steps found in the record order)")
    ap.add_argument("--last", type=int, default=16, help="queries: the last N positions (the decode steps)")
    ap.add_argument("--extras", action="store_true",
                    help="also the variants that fit a 0.30 page (4-bit min/max codes, page 0 exact)")
    a = ap.parse_args()

    Q, K, V, meta = read_trace(a.trace)
    L, N, QH, D = Q.shape
    KH = K.shape[2]
    prompt = a.prompt_len
    if not prompt:
        # decode records come one per layer per position at the end; count single-position runs
        pos = meta["rec_order_pos"]
        lay = meta["rec_order_layer"]
        # prefill: chunks with many positions per layer. The first decode position is the first
        # position whose layer-0 record is immediately followed by a layer-1 record of the same position.
        first_decode = N
        for i in range(len(pos) - 1):
            if lay[i] == 0 and lay[i + 1] == 1 and pos[i + 1] == pos[i]:
                first_decode = int(pos[i])
                break
        prompt = first_decode
    P = (prompt // PT) * PT
    qpos = np.arange(N - a.last, N)
    print(f"trace: dtype {meta['dtype']}, {L} layers, {QH} q heads, {KH} kv heads, head_dim {D}, "
          f"{meta['records']} records, {N} positions; prompt {prompt} tokens, P={P} ({P // PT} pages); "
          f"queries at positions {qpos[0]}..{qpos[-1]}")

    ev = Evaluator(Q, K, V, P, qpos)
    f16_block = PT * D * 2

    # ------------------------------------------------------------- outlier channels
    print("\n== outlier channels in K (mean |k| over positions 0..P-1 > 4x the median channel's)")
    absmean = np.abs(ev.K[:, :P]).mean(1)                # (L,KH,D)
    med = np.median(absmean, -1, keepdims=True)
    ratio = absmean / med
    any_out = False
    for l in range(L):
        parts = []
        for h in range(KH):
            ch = np.nonzero(ratio[l, h] > 4)[0]
            if ch.size:
                parts.append(f"h{h}: " + ",".join(f"{c}({ratio[l, h, c]:.1f}x)" for c in ch))
        if parts:
            any_out = True
            print(f"  layer {l:2d}: " + "; ".join(parts))
    if not any_out:
        print("  none")
    print(f"  max ratio overall {ratio.max():.1f}x (layer {np.unravel_index(ratio.argmax(), ratio.shape)})")
    # which pairing carries magnitude together? correlation of per-channel |k| means across pairings
    adj = np.abs(absmean[..., 0::2] - absmean[..., 1::2]) / (absmean[..., 0::2] + absmean[..., 1::2])
    half = np.abs(absmean[..., :32] - absmean[..., 32:]) / (absmean[..., :32] + absmean[..., 32:])
    print(f"  mean |a-b|/(a+b) of channel mean|k|: adjacent pairs {adj.mean():.3f}, (i,i+32) pairs {half.mean():.3f}")
    # same for V
    vabs = np.abs(ev.V[:, :P]).mean(1)
    vr = vabs / np.median(vabs, -1, keepdims=True)
    vl = sorted({int(l) for l, h, c in zip(*np.nonzero(vr > 4))})
    print(f"  V channels > 4x median: layers {vl if vl else 'none'} (max {vr.max():.1f}x)")

    # ------------------------------------------------------------- K schemes
    rows = []
    perlayer = {}
    kres = {}
    print("\n== K schemes (V exact)")
    hdr = f"{'scheme':24s} {'b':>2s} {'bytes':>5s} {'x f16':>6s} {'mean|dl|':>9s} {'max|dl|':>8s} {'KL mean':>9s} {'KL worst layer':>16s} {'rel out err':>11s}"
    print(hdr)
    for name, (fn, groups, params) in K_SCHEMES.items():
        for b in (4, 8):
            Kq = ev.unpage(fn(ev.Kpg, b), ev.K)
            err, kl, pq = ev.keys_metrics(Kq)
            oe = ev.out_err(pq, ev.V)
            klL = kl.mean((1, 2))
            wl = int(klL.argmax())
            byt = block_bytes(groups, params, b)
            kres[(name, b)] = (kl.mean(), pq, Kq)
            perlayer[(name, b)] = klL
            print(f"{name:24s} {b:2d} {byt:5d} {byt / f16_block:6.3f} {err.mean():9.2e} {err.max():8.2e} "
                  f"{kl.mean():9.2e} {klL[wl]:9.2e} (L{wl:2d}) {oe.mean():11.2e}")

    print("\n== V schemes (K exact)")
    print(f"{'scheme':24s} {'b':>2s} {'bytes':>5s} {'x f16':>6s} {'rel out err':>11s} {'max':>9s} {'worst layer':>16s}")
    vres = {}
    for name, (fn, groups, params) in V_SCHEMES.items():
        for b in (4, 8):
            Vq = ev.unpage(fn(ev.Vpg, b), ev.V)
            oe = ev.out_err(ev.p, Vq)
            oeL = oe.mean((1, 2))
            wl = int(oeL.argmax())
            byt = block_bytes(groups, params, b)
            vres[(name, b)] = (oe.mean(), Vq)
            print(f"{name:24s} {b:2d} {byt:5d} {byt / f16_block:6.3f} {oe.mean():11.2e} {oe.max():9.2e} {oeL[wl]:9.2e} (L{wl:2d})")

    print("\n== combined (best K at that b with best V at that b), plus budget pairs")
    print(f"{'K':24s} {'V':14s} {'b':>2s} {'page bytes':>10s} {'x f16':>6s} {'KL mean':>9s} {'KL worst L':>14s} {'rel out err':>11s} {'worst L':>14s}")
    combos = []
    for b in (4, 8):
        bk = min((k for k in kres if k[1] == b), key=lambda k: kres[k][0])[0]
        bv = min((k for k in vres if k[1] == b), key=lambda k: vres[k][0])[0]
        combos.append((bk, bv, b))
        for kk in ("K1 ch/f16", "K2 ch/u8", "K3 pair(2i,2i+1)/u8"):
            for vv in ("V1 tok/f16", "V2 tok/u8"):
                if (kk, vv, b) not in combos:
                    combos.append((kk, vv, b))
    for kk, vv, b in combos:
        _, pq, Kq = kres[(kk, b)]
        _, Vq = vres[(vv, b)]
        _, kl, _ = ev.keys_metrics(Kq)
        oe = ev.out_err(pq, Vq)
        klL = kl.mean((1, 2))
        oeL = oe.mean((1, 2))
        byt = block_bytes(K_SCHEMES[kk][1], K_SCHEMES[kk][2], b) + block_bytes(V_SCHEMES[vv][1], V_SCHEMES[vv][2], b)
        print(f"{kk:24s} {vv:14s} {b:2d} {byt:10d} {byt / (2 * f16_block):6.3f} {kl.mean():9.2e} "
              f"{klL.max():9.2e}(L{int(klL.argmax()):2d}) {oe.mean():11.2e} {oeL.max():9.2e}(L{int(oeL.argmax()):2d})")

    print("\n== per-layer KL, b=4")
    k1 = perlayer[("K1 ch/f16", 4)]
    k2 = perlayer[("K2 ch/u8", 4)]
    k3 = perlayer[("K3 pair(2i,2i+1)/u8", 4)]
    worst = set()
    for arr in (k1, k2, k3):
        worst |= set(np.argsort(arr)[-3:].tolist())
    show = [0, 1] + sorted(worst - {0, 1}, key=lambda l: -max(k1[l], k2[l], k3[l]))
    print(f"{'layer':>5s} {'K1':>9s} {'K2':>9s} {'K3':>9s}")
    for l in show:
        print(f"{l:5d} {k1[l]:9.2e} {k2[l]:9.2e} {k3[l]:9.2e}")
    print("  all layers K3/b4:", " ".join(f"{x:.1e}" for x in k3))

    if a.extras:
        extras(ev, Q, K, P, qpos)


if __name__ == "__main__":
    main()
