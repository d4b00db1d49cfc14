# How much of the oracle's attention mass the budget's pages keep when pages are ranked from
# coded keys: the coding choices behind index::TokenKeys (docs/indices.md, "TokenRescore").
#
#   kvd-longbench ... --record-traces DIR
#   python3 token-coding.py 'DIR/*-4096-*.trace' [FILES] [--first-pages N]
#
# For each trace (the real model's queries and keys at every position), the last 16 decode steps,
# every layer and KV head: OracleMass's pages at 6.25% (the top pages by attention mass summed
# over the group), against the pages ranked by each page's log-sum-exp of its tokens' estimated
# scores under several key codings, by Decision 4's group rule (max over heads of log-normalised
# estimates: "-max") or by summed estimated masses ("-sum"). Prints the mean share of the
# oracle's mass (summed over the group) that each ranking keeps. Channel statistics come from the
# first N pages (32 = kvd-llama's 256-token prefill chunk, what the index sees first) or all.
#   exact          the f16 keys
#   int8           8-bit codes, per-channel RMS scale, per-token scale (TokenKeys' scheme at 8 bits)
#   int4           the same at 4 bits (TokenKeys before 2026-12-06)
#   int4-centred   4 bits after subtracting the first keys' channel means
#   int4-residual  the page mean coded as a 4-bit token, each token's residual from it at 4 bits
#                  (TokenKeys since 2026-12-06)
import glob, sys
import numpy as np

sys.path.insert(0, __file__.rsplit('/', 1)[0])
import misses as M  # noqa: E402  (trace reader, page ranges, ranking rules)

PT, D, G, SCALE = M.PT, M.D, M.G, M.SCALE


def channel_scale(f):
    s = np.sqrt((f.reshape(-1, D) ** 2).mean(0))
    return np.maximum(s, s.max() / 64)


def code(x, s, levels):  # per-token scale: the largest normalised channel / levels
    y = x / s
    t = np.abs(y).max(-1, keepdims=True) / levels
    t[t == 0] = 1
    return np.clip(np.rint(y / t), -levels, levels) * t * s


def codings(kp, first):
    mu = first.reshape(-1, D).mean(0)
    pm_first = first - first.mean(1, keepdims=True)
    s_res = channel_scale(pm_first)
    mean = code(kp.mean(1, keepdims=True), s_res, 7)
    return {'exact': kp, 'int8': code(kp, channel_scale(first), 127), 'int4': code(kp, channel_scale(first), 7),
            'int4-centred': code(kp - mu, channel_scale(first - mu), 7) + mu,
            'int4-residual': mean + code(kp - mean, s_res, 7)}


def lse(ts):
    m = ts.max(-1, keepdims=True)
    return m[..., 0] + np.log(np.exp(ts - m).sum(-1))


def main():
    pattern = sys.argv[1]
    n_files = int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith('--') else 3
    first_pages = int(sys.argv[sys.argv.index('--first-pages') + 1]) if '--first-pages' in sys.argv else 32
    kept = {}
    for path in sorted(glob.glob(pattern))[:n_files]:
        Q, K = M.read_trace(path)
        for l in range(K.shape[0]):
            for g in range(K.shape[2]):
                kk = K[l, :, g].astype(np.float32)
                ns = kk.shape[0] // PT
                kp = kk[:ns * PT].reshape(ns, PT, D)
                coded = codings(kp, kp[:first_pages] if first_pages > 0 else kp)
                for pos in range(Q.shape[1] - 16, Q.shape[1]):
                    s0, lb = M.page_ranges(pos + 1)
                    c = lb - s0
                    k = M.budget_pages(0.0625, c)
                    if c <= k:
                        continue
                    q = Q[l, pos, g * G:(g + 1) * G].astype(np.float32)
                    sc = q @ kk[:pos + 1].T * SCALE
                    a = np.exp(sc - sc.max(1, keepdims=True))
                    a /= a.sum(1, keepdims=True)
                    mass = a[:, s0 * PT:lb * PT].reshape(G, c, PT).sum(-1)
                    best = np.sort(mass.sum(0))[::-1][:k].sum()
                    for name, kq in coded.items():
                        e = lse(np.einsum('hd,ctd->hct', q, kq[s0:lb]) * SCALE)
                        z = e.max(1, keepdims=True)
                        z = z + np.log(np.exp(e - z).sum(1, keepdims=True))
                        for rule, score in (('max', M.gqa(e)), ('sum', np.exp(e - z).sum(0))):
                            kept.setdefault(f'{name}-{rule}', []).append(mass[:, M.ranks(score) < k].sum() / best)
    print(f"first {first_pages or 'all'} pages' statistics; share of the oracle's mass kept at 6.25% (mean, min, n):")
    for name, v in kept.items():
        print(f"  {name:20s} {np.mean(v):.4f}  {np.min(v):.3f}  {len(v)}")


if __name__ == '__main__':
    main()
