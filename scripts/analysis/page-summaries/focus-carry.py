# The focus carry (Config::carry) on a recorded trace, against no carry. Pages whose attention mass
# (max over the group's heads, in the previous step's sparse attention) is >= TAU stay selected,
# at most CAP x k of them, the heaviest first; the page-mean estimate (mean + 2 key-chosen rotary
# pair radii at weight 0.5: Hierarchical below score_all_below) fills the rest of the budget.
# Printed: mass recall, and the "focused-page recall": of the (stream, step) pairs where one
# candidate page holds >= 0.3 of some head's attention, the share whose page is selected.
# The last 24 positions are the decode steps (FIRST= changes it); B= the budget.
import numpy as np, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load
from analyze import page_ranges, pages_for, gqa, f16, topk, PT
ROT = (np.arange(0, 64, 2), np.arange(1, 64, 2))
Q, K, prefix = load.load()
L, P, QH, D = Q.shape
FIRST = int(os.environ.get('FIRST', P - 24)); THR = 0.3; B = float(os.environ.get('B', 0.0625))
rules = [('none', 0, 0)] + [(f'tau{t}/cap{c}', t, c) for t in (0.02, 0.05, 0.1) for c in (0.25, 0.5)]
hit = {r[0]: 0 for r in rules}; mr = {r[0]: 0.0 for r in rules}; used = {r[0]: 0 for r in rules}; tot = 0; steps = 0
for l in range(L):
    for g in range(3):
        Kf = K[l, :, g].astype(np.float32); ns = P // PT
        Kp = Kf[:ns * PT].reshape(ns, PT, D); mean = f16(Kp.mean(1))
        resid = Kp - mean[:, None]
        rho = f16(np.sqrt((resid[..., ROT[0]] ** 2 + resid[..., ROT[1]] ** 2).max(1)))
        sealed0 = prefix // PT
        pn = np.sqrt(mean[:sealed0, ROT[0]] ** 2 + mean[:sealed0, ROT[1]] ** 2).mean(0)
        js = np.argsort(-(pn * rho[:sealed0].mean(0)), kind='stable')[:2]
        prev = {r[0]: None for r in rules}
        for pos in range(FIRST, P):
            n = pos + 1; se, lb, pages = page_ranges(n)
            cand = np.arange(se, lb); k = pages_for(B, len(cand))
            qs = Q[l, pos, 3 * g:3 * g + 3].astype(np.float32)
            lg = qs @ Kf[:n].T / 8.0
            a = np.exp(lg - lg.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
            ap = np.zeros((3, pages * PT)); ap[:, :n] = a; pm = ap.reshape(3, pages, PT).sum(-1)
            fixed = pm[:, :se].sum(1) + pm[:, lb:].sum(1)
            qrot = np.sqrt(qs[:, ROT[0]] ** 2 + qs[:, ROT[1]] ** 2)
            sc = gqa(qs @ mean[cand].T + 0.5 * qrot[:, js] @ rho[cand][:, js].T)
            top = pm[:, cand].max(0); best = int(np.argmax(top)); focused = top[best] >= THR
            tot += focused; steps += 1
            for name, tau, cap in rules:
                keep = np.array([], int)
                if prev[name] is not None and cap > 0:
                    pids, pmass = prev[name]
                    o = np.lexsort((pids, -pmass)); o = [i for i in o if pmass[i] >= tau and se <= pids[i] < lb]
                    keep = pids[o[:int(cap * k)]]
                rest = cand[~np.isin(cand, keep)]
                s2 = np.union1d(keep, topk(sc[rest - se], rest, k - len(keep)))
                used[name] += len(s2) / k
                mr[name] += float((fixed + pm[:, s2].sum(1)).mean())
                if focused and cand[best] in s2: hit[name] += 1
                att = lg.copy(); mask = np.ones(n, bool)
                for p in s2: mask[p * PT:(p + 1) * PT] = False
                mask[:se * PT] = False; mask[lb * PT:] = False
                att[:, mask] = -np.inf
                w = np.exp(att - att.max(1, keepdims=True)); w /= w.sum(1, keepdims=True)
                wp = np.zeros((3, pages * PT)); wp[:, :n] = w
                prev[name] = (s2, wp.reshape(3, pages, PT).sum(-1)[:, s2].max(0))
print('budget', B, 'focused instances', tot, 'stream-steps', steps)
for name, _, _ in rules: print(f'{name:16s} focused-page recall {hit[name] / max(tot, 1):.3f}  mass recall {mr[name] / steps:.4f}  pages used/k {used[name] / steps:.3f}')
