# Query-free (keys-only) rules for choosing the rotary pairs of the mean + rho_pair summary.
# Reuses rotary.py (flat replica) and analyze.py (Hier replica). Output: keyonly.json + table.
import numpy as np, sys, json, math, time, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rotary import f16, page_ranges, pages_for, gqa, topk, ROT, PT, D, G, SCALE, BUDGETS
from analyze import Hier
from load import load, OUT

WS = (0.25, 0.5, 0.75, 1.0)
EXPANDS = (4.0, 8.0)

def hier_ids(h, qs, first, end, k, expand):   # == Hier.select(l1='base') up to the member scoring
    elig = []
    for c, pg in enumerate(h.cl):
        mem = [p for p in pg if first <= p < end]
        if mem: elig.append((c, np.array(mem)))
    cidx = np.array([c for c, _ in elig])
    C = np.array([h.cent[c] for c in cidx]); R = np.array([h.rad[c] for c in cidx])
    qn = np.sqrt((qs * qs).sum(1))
    sc = gqa(qs @ C.T + 0.5 * qn[:, None] * R[None])
    order = np.lexsort((np.arange(len(sc)), -sc))
    target = int(math.ceil(expand * k)); take, mem = [], 0
    for e in order:
        if mem >= target: break
        take.append(e); mem += len(elig[e][1])
    return np.concatenate([elig[e][1] for e in take])

def main(layers):
    Q, K, prefix = load()
    P = K.shape[1]; steps = P - prefix; sealed0 = prefix // PT
    res = {}; picks = []
    rec = lambda name, fb, l, g, s, v: res.setdefault(name, {}).setdefault(str(fb), []).append((l, g, s, v))
    t0 = time.time()
    for l in layers:
        for g in range(K.shape[2]):
            Kf = K[l, :, g].astype(np.float32)
            ns = P // PT
            Kp = Kf[:ns * PT].reshape(ns, PT, D)
            mean = f16(Kp.mean(1)); lo = Kp.min(1); hi = Kp.max(1)
            resid = Kp - mean[:, None, :]
            rr = resid[..., ROT[0]] ** 2 + resid[..., ROT[1]] ** 2          # [pages][PT][32]
            rho = f16(np.sqrt(rr.max(1)))                                     # [pages][32]
            rho_m = rho[:sealed0].mean(0)
            mp = mean[:sealed0]
            pn = np.sqrt(mp[:, ROT[0]] ** 2 + mp[:, ROT[1]] ** 2)            # page-mean norm per pair
            kpr = Kf[:prefix]
            mk = kpr.mean(0)
            obsq = Q[l, prefix - 64:prefix, g * G:(g + 1) * G].astype(np.float32).reshape(-1, D)
            score = {
                'q': np.sqrt(obsq[:, ROT[0]] ** 2 + obsq[:, ROT[1]] ** 2).mean(0) * rho_m,  # reference
                'rho': rho_m,                                                              # e_rot
                'a_pmnorm': pn.mean(0) * rho_m,
                'b_avgkey': np.sqrt(mk[ROT[0]] ** 2 + mk[ROT[1]] ** 2) * rho_m,
                'c_pmvar': (mp[:, ROT[0]].var(0) + mp[:, ROT[1]].var(0)) * rho_m,
                'd_highj': np.arange(32, dtype=np.float64),
                'e_rho_j16': np.where(np.arange(32) >= 16, rho_m, -1.0),
                'f_knorm': np.sqrt(kpr[:, ROT[0]] ** 2 + kpr[:, ROT[1]] ** 2).mean(0) * rho_m,
            }
            order = {r: np.argsort(-s, kind='stable') for r, s in score.items()}
            rules = {}
            for r in score:
                for m in (2, 4):
                    rules['%s%d' % (r, m)] = order[r][:m]
            picks.append({'l': l, 'g': g, **{r: [int(x) for x in o[:4]] for r, o in order.items()}})
            # prompt-query calibration of w (reference only, as in compare.py's -cal)
            CALW = (0.0, 0.25, 0.5, 0.75, 1.0)
            acc = {r: np.zeros(len(CALW)) for r in rules}
            for t in range(prefix - 64, prefix, 8):
                n = t + 1; se, lb, pages = page_ranges(n)
                qs = Q[l, t, g * G:(g + 1) * G].astype(np.float32)
                lg = (qs.astype(np.float64) @ Kf[:n].T.astype(np.float64)) * SCALE
                a = np.exp(lg - lg.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
                ap = np.zeros((G, pages * PT)); ap[:, :n] = a; pm = ap.reshape(G, pages, PT).sum(-1)
                cand = np.arange(se, lb); k = pages_for(0.0625, len(cand))
                qrot = np.sqrt(qs[:, ROT[0]] ** 2 + qs[:, ROT[1]] ** 2)
                b0 = qs @ mean[cand].T
                for r, js in rules.items():
                    bb = qrot[:, js] @ rho[cand][:, js].T
                    for i, w in enumerate(CALW): acc[r][i] += pm[:, topk(gqa(b0 + w * bb), cand, k)].sum(1).mean()
            wcal = {r: CALW[int(np.argmax(a_))] for r, a_ in acc.items()}
            hier = Hier(list(mean[:sealed0]))
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
                qrot = np.sqrt(qs[:, ROT[0]] ** 2 + qs[:, ROT[1]] ** 2)
                basefull = qs @ mean.T                                          # [G][pages]
                bonfull = {r: qrot[:, js] @ rho[:, js].T for r, js in rules.items()}
                mr = lambda sel: float((fixed + pm[:, sel].sum(1)).mean())
                for fb in BUDGETS:
                    k = pages_for(fb, nc)
                    # flat
                    rec('oracle', fb, l, g, s, mr(topk(gm[cand], cand, k)))
                    rec('quest', fb, l, g, s, mr(topk(gqa(np.maximum(qs[:, None] * lo[cand][None], qs[:, None] * hi[cand][None]).sum(-1)), cand, k)))
                    rec('meankey', fb, l, g, s, mr(topk(gqa(basefull[:, cand]), cand, k)))
                    for r in rules:
                        b0 = basefull[:, cand]; bb = bonfull[r][:, cand]
                        for w in WS: rec('%s@w%g' % (r, w), fb, l, g, s, mr(topk(gqa(b0 + w * bb), cand, k)))
                        rec('%s@cal' % r, fb, l, g, s, mr(topk(gqa(b0 + wcal[r] * bb), cand, k)))
                    # hierarchical: same level 1, different level 2
                    for ex in EXPANDS:
                        ids = hier_ids(hier, qs, se, lb, k, ex)
                        tag = 'H[x%d]' % ex
                        rec(tag + ' l2=oracle', fb, l, g, s, mr(topk(gm[ids], ids, k)))
                        rec(tag + ' l2=meankey', fb, l, g, s, mr(topk(gqa(basefull[:, ids]), ids, k)))
                        for r in rules:
                            for w in (0.5, 0.75, 1.0):
                                rec('%s l2=%s@w%g' % (tag, r, w), fb, l, g, s, mr(topk(gqa(basefull[:, ids] + w * bonfull[r][:, ids]), ids, k)))
                            rec('%s l2=%s@cal' % (tag, r), fb, l, g, s, mr(topk(gqa(basefull[:, ids] + wcal[r] * bonfull[r][:, ids]), ids, k)))
                if n % PT == 0: hier.join(mean[n // PT - 1])
        print('layer', l, 'done', round(time.time() - t0, 1), 's', file=sys.stderr, flush=True)
    with open(os.path.join(OUT, 'keyonly.json'), 'w') as f: json.dump({'res': res, 'picks': picks}, f)

if __name__ == '__main__':
    lay = range(int(sys.argv[1]), int(sys.argv[2]) + 1) if len(sys.argv) > 2 else range(30)
    main(lay)
