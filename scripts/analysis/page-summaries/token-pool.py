# Which pool the token-level second look needs: on SmolLM2 traces, the share of OracleMass's
# attention mass (summed over the group) that the budget's pages keep at 6.25% when the pages are
# ranked by their residual-coded token estimates (index::TokenKeys) within a pool of a quarter or
# half the candidates, the pool taken by Hierarchical's member estimate (mean + rotary-pair
# radii, as misses.py scores it), by the 4-bit coded page-mean row alone (TokenKeys before the
# first look), or by TokenKeys' first look (the page mean at 7 bits + the same radii: 'first');
# and with every candidate rescored ("all"). docs/indices.md, "What it costs".
#
#   python3 token-pool.py 'DIR/*-4096-*.trace' [FILES]
import sys, glob, numpy as np
sys.path.insert(0, __file__.rsplit('/', 1)[0])
import misses as M
tc = __import__('token-coding')
PT, D, G, SCALE = M.PT, M.D, M.G, M.SCALE
res = {}
for path in sorted(glob.glob(sys.argv[1]))[:int(sys.argv[2])]:
    Q, K = M.read_trace(path)
    for l in range(K.shape[0]):
        for g in range(K.shape[2]):
            kk = K[l, :, g].astype(np.float32); ns = kk.shape[0] // PT
            kp = kk[:ns * PT].reshape(ns, PT, D); first = kp[:32]
            s_res = tc.channel_scale(first - first.mean(1, keepdims=True))
            mean_c = tc.code(kp.mean(1, keepdims=True), s_res, 7)
            mean_7 = tc.code(kp.mean(1, keepdims=True), s_res, 63)
            kq = mean_7 + tc.code(kp - mean_7, s_res, 7)
            mean = M.f16(kp.mean(1)); resid = kp - mean[:, None, :]
            rho = M.f16(np.sqrt(resid[..., 0::2] ** 2 + resid[..., 1::2] ** 2).max(1))
            pn = np.sqrt(mean[:32, 0::2] ** 2 + mean[:32, 1::2] ** 2).mean(0)
            pairs = np.lexsort((np.arange(32), -(pn * rho[:32].mean(0))))[:2]
            for pos in range(Q.shape[1] - 16, Q.shape[1]):
                s0, lb = M.page_ranges(pos + 1); c = lb - s0; k = M.budget_pages(0.0625, c)
                if c <= k: continue
                q = Q[l, pos, g * G:(g + 1) * G].astype(np.float32)
                sc = q @ kk[:pos + 1].T * SCALE
                a = np.exp(sc - sc.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
                mass = a[:, s0 * PT:lb * PT].reshape(G, c, PT).sum(-1)
                best = np.sort(mass.sum(0))[::-1][:k].sum()
                tok = M.gqa(tc.lse(np.einsum('hd,ctd->hct', q, kq[s0:lb]) * SCALE))
                qp = np.sqrt(q[:, 0::2] ** 2 + q[:, 1::2] ** 2)[:, pairs]
                hier = M.gqa(q @ mean[s0:lb].T + 0.5 * qp @ rho[s0:lb][:, pairs].T)
                mrow = M.gqa(q @ mean_c[s0:lb, 0].T)
                first = M.gqa(q @ mean_7[s0:lb, 0].T + 0.5 * qp @ rho[s0:lb][:, pairs].T)
                for share in (0.25, 0.5):
                    npool = int(np.ceil(share * c))
                    for name, est in (('hier', hier), ('meanrow', mrow), ('first', first)):
                        pool = M.ranks(est) < npool
                        sc2 = np.where(pool, tok, -np.inf)
                        sel = M.ranks(sc2) < k
                        res.setdefault(f'{name}-{share}', []).append(mass[:, sel].sum() / best)
                res.setdefault('all', []).append(mass[:, M.ranks(tok) < k].sum() / best)
for k_, v in sorted(res.items()): print(f'{k_:14s} {np.mean(v):.4f} {np.min(v):.3f} {len(v)}')
