# Flat mass recall of cheap page summaries with the true rotary pairs of an interleaved-RoPE model
# (GGUF Llama files: pairs (2j, 2j+1)), pairs chosen by key radius or by the prompt's queries, and a
# per-stream weight calibrated on prompt queries; docs/indices.md ("On real attention") gives the table.
# Replication core copied from scripts/analysis/page-summaries/analyze.py (kvd-eval rules).
import numpy as np, sys, json, math, time, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import load, OUT
from analyze import f16, PT, SINK, LOCAL, D, G, SCALE, BUDGETS, page_ranges, pages_for, gqa, topk  # kvd-eval's rules

OLD = (np.arange(32), np.arange(32) + 32)          # (i, i+32): NOT rotary pairs here
ROT = (np.arange(32) * 2, np.arange(32) * 2 + 1)    # interleaved RoPE pairs (2j, 2j+1)

# method -> extra f16 values per page beyond the 64-value mean (quest: 128 values, no mean)
EXTRA = {}
WB = []

def main(layers):
    Q, K, prefix = load()
    L, P = K.shape[0], K.shape[1]
    steps = P - prefix
    sealed0 = prefix // PT
    res = {}
    t0 = time.time()
    for l in layers:
        for g in range(K.shape[2]):
            Kf = K[l, :, g].astype(np.float32)
            ns = P // PT
            Kp = Kf[:ns * PT].reshape(ns, PT, D)
            mean = f16(Kp.mean(1)); lo = Kp.min(1); hi = Kp.max(1)
            hr = f16((hi - lo) / 2)
            resid = Kp - mean[:, None, :]                     # against the stored (f16) mean
            ra = f16(np.abs(resid).max(1))                    # per-channel max |resid|  [pages][64]
            obsq = Q[l, prefix - 64:prefix, g * G:(g + 1) * G].astype(np.float32).reshape(-1, D)
            S = {}   # name -> (A [pages][m][w] channel-groups, rho [pages][m]) ; score = mean + sum_j |q_grp_j| rho_j
            def grp(pairs):   # pairs: list of channel tuples
                rho = np.stack([np.sqrt((resid[..., list(c)] ** 2).sum(-1)).max(1) for c in pairs], 1)
                return f16(rho)
            def pairlist(P2): return [(int(a), int(b)) for a, b in zip(*P2)]
            old = pairlist(OLD); rot = pairlist(ROT)
            rho_old = grp(old); rho_rot = grp(rot)
            ko = np.argsort(-rho_old[:sealed0].mean(0), kind='stable')
            kr = np.argsort(-rho_rot[:sealed0].mean(0), kind='stable')
            qrot_obs = np.sqrt(obsq[:, ROT[0]] ** 2 + obsq[:, ROT[1]] ** 2).mean(0)
            krq = np.argsort(-(qrot_obs * rho_rot[:sealed0].mean(0)), kind='stable')
            groups = {}
            groups['e_pair4(i,i+32)'] = ([old[j] for j in ko[:4]], rho_old[:, ko[:4]])
            groups['e_pair8(i,i+32)'] = ([old[j] for j in ko[:8]], rho_old[:, ko[:8]])
            for m in (2, 4, 6, 8):
                groups['e_rot%d' % m] = ([rot[j] for j in kr[:m]], rho_rot[:, kr[:m]])
            for m in (2, 3, 4, 6, 8):
                groups['e_rot%dq' % m] = ([rot[j] for j in krq[:m]], rho_rot[:, krq[:m]])
            # channels by mean half-range, value = max_t |resid_c|
            ch = np.argsort(-hr[:sealed0].mean(0), kind='stable')
            groups['e_chan8'] = ([(int(c),) for c in ch[:8]], ra[:, ch[:8]])
            groups['e_chan4'] = ([(int(c),) for c in ch[:4]], ra[:, ch[:4]])
            chq = np.argsort(-(np.abs(obsq).mean(0) * hr[:sealed0].mean(0)), kind='stable')
            for m in (4, 6, 8):
                groups['e_chan%dq' % m] = ([(int(c),) for c in chq[:m]], ra[:, chq[:m]])
            # sort channels by mean max|resid|, pair ranks (1,2),(3,4),...
            cs = np.argsort(-ra[:sealed0].mean(0), kind='stable')
            sp = [(int(cs[2 * j]), int(cs[2 * j + 1])) for j in range(4)]
            groups['e_sortpair4'] = (sp, grp(sp))
            # rotary top-m + one "rest" radius over all other channels (a full Cauchy-Schwarz bound)
            for m in (3, 7):
                ps = [rot[j] for j in kr[:m]]; used = set(c for p in ps for c in p)
                rest = tuple(c for c in range(D) if c not in used)
                groups['e_rot%d+rest' % m] = (ps + [rest], np.concatenate([rho_rot[:, kr[:m]], grp([rest])], 1))
            # all 32 rotary pairs (a complete bound, 32 extra values; reference only)
            groups['e_rot32(ref)'] = (rot, rho_rot)
            # per-page adaptive: each page keeps its own 4 largest rotary rho (+ 5-bit index each)
            pp_idx = np.argsort(-rho_rot, 1, kind='stable')[:, :4]
            pp_rho = np.take_along_axis(rho_rot, pp_idx, 1)
            WS = (0.0, 0.25, 0.5, 0.75, 1.0)
            def bonus(name, qs, ids):
                chs, rho = groups[name]
                qn = np.stack([np.sqrt((qs[:, list(c)] ** 2).sum(-1)) for c in chs], 1)
                return qn @ rho[ids].T
            CAL = ('e_rot4q', 'e_chan8q', 'e_rot8q', 'e_rot6q')
            wbest = {}
            for name in CAL:
                acc = np.zeros(len(WS))
                for t in range(prefix - 64, prefix, 8):
                    n = t + 1; se, lb, pages = page_ranges(n)
                    qs = Q[l, t, g * G:(g + 1) * G].astype(np.float32)
                    lg = (qs.astype(np.float64) @ Kf[:n].T.astype(np.float64)) * SCALE
                    a = np.exp(lg - lg.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
                    ap = np.zeros((G, pages * PT)); ap[:, :n] = a; pm = ap.reshape(G, pages, PT).sum(-1)
                    cand = np.arange(se, lb); k = pages_for(0.0625, len(cand))
                    # candidate pages must be sealed and summarised: all are (lb <= n // PT)
                    b0 = qs @ mean[cand].T; bb = bonus(name, qs, cand)
                    for i, w in enumerate(WS):
                        acc[i] += pm[:, topk(gqa(b0 + w * bb), cand, k)].sum(1).mean()
                wbest[name] = WS[int(np.argmax(acc))]
            WB.append((l, g, dict(wbest)))
            EXTRA.update({k: len(v[0]) for k, v in groups.items()})
            EXTRA.update({n_ + '-cal': len(groups[n_][0]) for n_ in CAL})
            EXTRA.update({'e_rot4qx0.5': 4, 'e_chan8qx0.5': 8})
            EXTRA.update({'quest': 64, 'meankey': 0, 'e_rot4pp': 4 + 1, 'oracle': 0,
                          'e_rot4x0.5': 4, 'e_rot8x0.5': 8, 'e_chan8hr': 8})
            for s in range(steps):
                n = prefix + s + 1
                se, lb, pages = page_ranges(n)
                qs = Q[l, prefix + s, g * G:(g + 1) * G].astype(np.float32)
                logit = (qs.astype(np.float64) @ Kf[:n].T.astype(np.float64)) * SCALE
                a = np.exp(logit - logit.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
                ap = np.zeros((G, pages * PT)); ap[:, :n] = a
                pm = ap.reshape(G, pages, PT).sum(-1)
                cand = np.arange(se, lb); nc = len(cand)
                fixed = pm[:, :se].sum(1) + pm[:, lb:].sum(1)
                gm = pm.sum(0)
                base = qs @ mean[cand].T
                qa = np.abs(qs)
                qrot = np.sqrt(qs[:, ROT[0]] ** 2 + qs[:, ROT[1]] ** 2)   # [G][32]
                ests = {'quest': np.maximum(qs[:, None] * lo[cand][None], qs[:, None] * hi[cand][None]).sum(-1),
                        'meankey': base,
                        'e_chan8hr': base + qa[:, ch[:8]] @ hr[cand][:, ch[:8]].T}
                for name, (chs, rho) in groups.items():
                    qn = np.stack([np.sqrt((qs[:, list(c)] ** 2).sum(-1)) for c in chs], 1)   # [G][m]
                    ests[name] = base + qn @ rho[cand].T
                ests['e_rot4x0.5'] = base + 0.5 * (ests['e_rot4'] - base)
                ests['e_rot8x0.5'] = base + 0.5 * (ests['e_rot8'] - base)
                for n_ in CAL: ests[n_ + '-cal'] = base + wbest[n_] * (ests[n_] - base)
                ests['e_rot4qx0.5'] = base + 0.5 * (ests['e_rot4q'] - base)
                ests['e_chan8qx0.5'] = base + 0.5 * (ests['e_chan8q'] - base)
                ests['e_rot4pp'] = base + np.einsum('hpj,pj->hp', qrot[:, pp_idx[cand]], pp_rho[cand])
                for fb in BUDGETS:
                    k = pages_for(fb, nc)
                    sels = {'oracle': topk(gm[cand], cand, k)}
                    for name, e in ests.items(): sels[name] = topk(gqa(e), cand, k)
                    for name, sel in sels.items():
                        mr = float((fixed + pm[:, sel].sum(1)).mean())
                        res.setdefault(name, {}).setdefault(str(fb), []).append((l, g, s, mr))
        print('layer', l, 'done', round(time.time() - t0, 1), 's', file=sys.stderr, flush=True)
    with open(os.path.join(OUT, 'compare.json'), 'w') as f: json.dump({'res': res, 'extra': EXTRA, 'wbest': WB}, f)
    report(res)

def report(res):
    bands = [(0, 2), (3, 10), (11, 29)]
    qb = 256
    print('%-18s %6s %6s  %7s %7s   %7s %7s %7s' % ('method', 'B/page', 'xQuest', '6.25%', '1.56%', 'L0-2', 'L3-10', 'L11-29'))
    for name in res:
        B = 256 if name == 'quest' else 128 + 2 * EXTRA[name] if name != 'oracle' else 0
        if name == 'e_rot4pp': B = 128 + 8 + 3     # 4 f16 + 4 five-bit indices (20 bits)
        r6 = res[name]['0.0625']; r1 = res[name]['0.015625']
        bm = []
        for lo_, hi_ in bands:
            v = [x[3] for x in r6 if lo_ <= x[0] <= hi_]
            bm.append('%7.4f' % np.mean(v) if v else '    n/a')
        print('%-18s %6d %6.3f  %7.4f %7.4f   %s' % (name, B, B / qb, np.mean([x[3] for x in r6]), np.mean([x[3] for x in r1]), ' '.join(bm)))

if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == 'report':
        z = json.load(open(os.path.join(OUT, 'compare.json'))); EXTRA.update(z['extra']); report(z['res'])
    else:
        lay = range(int(sys.argv[1]), int(sys.argv[2]) + 1) if len(sys.argv) > 2 else range(30)
        main(lay)
