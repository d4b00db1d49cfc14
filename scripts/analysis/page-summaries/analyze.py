# Replicates kvd-eval's mass recall for Quest / MeanKey / Hierarchical on the SmolLM2 trace and
# evaluates cheap page summaries. See REPORT.md.
import numpy as np, sys, json, math, time
import os
from load import load, OUT
f16 = lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
PT, SINK, LOCAL, D, G = 8, 4, 64, 64, 3
SCALE = 1.0 / 8.0
BUDGETS = [0.0625, 0.015625]

def page_ranges(n):
    pages = (n + PT - 1) // PT
    sink_end = min((SINK + PT - 1) // PT, pages)
    lb = (n - LOCAL if n > LOCAL else 0) // PT
    lb = min(lb, (n - 1) // PT)
    return sink_end, max(lb, sink_end), pages

def pages_for(f, c):
    if c <= 0: return 0
    w = int(math.ceil(f * c - 1e-9)); return max(1, min(w, c))

def gqa(est):  # est [G][n] -> [n]  (Decision 4: max_h est_h - max est_h)
    return (est - est.max(axis=1, keepdims=True)).max(axis=0)

def topk(score, ids, k):  # k best, ties to lower page id
    o = np.lexsort((ids, -score))
    return np.sort(ids[o[:k]])

# ---------------- Hierarchical replica (include/kvdrive/index/hierarchical.hpp) -------------
def l2sq(a, b): d = a - b; return (d * d).sum(-1)

def local_lloyd(pts, k, assign, iters, rng):
    def means(assign):
        c = np.zeros((k, pts.shape[1]), np.float32); cnt = np.bincount(assign, minlength=k)
        np.add.at(c, assign, pts); nz = cnt > 0; c[nz] /= cnt[nz, None]; return c, cnt
    cent, cnt = means(assign)
    for _ in range(iters):
        moved = False
        for i in range(len(pts)):
            fr = assign[i]
            if cnt[fr] <= 1: continue
            lo, hi = rng(i)
            cs = np.arange(lo, hi + 1); dist = l2sq(pts[i][None], cent[cs])
            best, bd = fr, l2sq(pts[i], cent[fr])
            for c, dd in zip(cs, dist):
                if c != fr and dd < bd: best, bd = c, dd
            if best != fr: cnt[fr] -= 1; cnt[best] += 1; assign[i] = best; moved = True
        cent, cnt = means(assign)
        if not moved: break
    return assign

class Hier:
    def __init__(self, means, cpc=16, nb=2, iters=4, split=2):
        self.cpc, self.nb, self.iters, self.split = cpc, nb, iters, split
        self.means = list(means)  # f16-rounded page means in page order
        n = len(means); k = (n + cpc - 1) // cpc
        assign = np.arange(n) // cpc
        assign = local_lloyd(np.array(means), k, assign, iters,
                             lambda p: (max(0, p // cpc - nb), min(k - 1, p // cpc + nb)))
        self.cl = [[p for p in range(n) if assign[p] == c] for c in range(k)]
        self.cent = [None] * k; self.rad = [0.0] * k
        for c in range(k): self.refresh(c)
        c = 0
        while c < len(self.cl):
            while len(self.cl[c]) > split * cpc: self.do_split(c)
            c += 1
    def refresh(self, c):
        m = np.array([self.means[p] for p in self.cl[c]])
        st = f16(m.mean(0)); self.cent[c] = st
        self.rad[c] = float(np.sqrt(l2sq(m, st[None]).max()) * (1 + 1e-6))
    def do_split(self, c):
        old = self.cl[c]; n = len(old); m = np.array([self.means[p] for p in old])
        a = (np.arange(n) >= n // 2).astype(int)
        a = local_lloyd(m, 2, a, self.iters, lambda i: (0, 1))
        self.cl[c] = [p for p, x in zip(old, a) if x == 0]
        self.cl.append([p for p, x in zip(old, a) if x == 1]); self.cent.append(None); self.rad.append(0.0)
        self.refresh(c); self.refresh(len(self.cl) - 1)
    def join(self, mean):
        p = len(self.means); self.means.append(mean)
        d = [l2sq(mean, c) for c in self.cent]; best = int(np.argmin(d))
        self.cl[best].append(p); self.refresh(best)
        if len(self.cl[best]) > self.split * self.cpc: self.do_split(best)

    def select(self, qs, first, end, k, member_est, l1='base', expand=4.0, l1data=None, members_oracle=None):
        elig = []
        for c, pg in enumerate(self.cl):
            mem = [p for p in pg if first <= p < end]
            if mem: elig.append((c, np.array(mem)))
        cidx = np.array([c for c, _ in elig])
        C = np.array([self.cent[c] for c in cidx]); R = np.array([self.rad[c] for c in cidx])
        qn = np.sqrt((qs * qs).sum(1))
        if l1 == 'base':
            est = qs @ C.T + 0.5 * qn[:, None] * R[None]
        elif l1.startswith('r'):  # centroid + w |q| r
            est = qs @ C.T + float(l1[1:]) * qn[:, None] * R[None]
        elif l1 == 'box':  # Quest bound of the cluster's key box (member keys' min/max)
            lo, hi = l1data['lo'][cidx], l1data['hi'][cidx]
            est = np.maximum(qs[:, None, :] * lo[None], qs[:, None, :] * hi[None]).sum(-1)
        elif l1 == 'tokr':  # centroid + 0.5 |q| * token-level radius
            est = qs @ C.T + 0.5 * qn[:, None] * l1data['tokr'][cidx][None]
        elif l1.startswith('out'):  # max(base, q . cluster outlier keys), m keys per cluster
            mm = int(l1[3:]); O = l1data['out'][cidx][:, :mm]          # [ne][m][d]
            est = np.maximum(qs @ C.T + 0.5 * qn[:, None] * R[None], np.einsum('hd,cmd->hcm', qs, O).max(-1))
        elif l1 == 'pca8':  # centroid + sum_j |q.u_j| HR_j over member tokens (residual to centroid)
            U = l1data['U'][:8]; est = qs @ C.T + np.abs(qs @ U.T) @ l1data['HR'][cidx][:, :8].T
        elif l1.startswith('cpair'):  # centroid + w sum_pairs |q_pair| rho_pair (member tokens vs centroid)
            w = float(l1[5:]); est = qs @ C.T + w * np.sqrt(qs[:, :32] ** 2 + qs[:, 32:] ** 2) @ l1data['CR'][cidx].T
        elif l1 == 'oracle':
            est = np.array([[l1data['gm'][m_].max() for _, m_ in elig]])
        sc = gqa(est)
        order = np.lexsort((np.arange(len(sc)), -sc))
        target = int(math.ceil(expand * k)); take, mem = [], 0
        for e in order:
            if mem >= target: break
            take.append(e); mem += len(elig[e][1])
        ids = np.concatenate([elig[e][1] for e in take])
        if members_oracle is not None: s = members_oracle(ids)
        else: s = gqa(member_est(ids))
        return topk(s, ids, k)

# ------------------------------------------------------------------------------------------------
def main(limit_layers=None):
    Q, K, prefix = load()
    L, P = K.shape[0], K.shape[1]
    steps = P - prefix
    sealed0 = prefix // PT
    res = {}          # method -> budget -> list of per-(layer,kvh,step) recall (kvd metric)
    resc = {}         # same, candidate-only fraction
    diag = []         # per stream diagnostics
    layers = range(L) if limit_layers is None else range(limit_layers)
    t0 = time.time()
    for l in layers:
        for g in range(K.shape[2]):
            Kf = K[l, :, g].astype(np.float32)              # f16 already
            npages = P // PT + (1 if P % PT else 0)
            nsealed_all = P // PT                            # pages sealed by the end
            Kp = Kf[:nsealed_all * PT].reshape(nsealed_all, PT, D)
            mean = f16(Kp.mean(1)); lo = Kp.min(1); hi = Kp.max(1)
            mid = f16((lo + hi) / 2); hr = f16((hi - lo) / 2)
            resid = Kp - mean[:, None, :]
            rpage = f16(np.sqrt((resid ** 2).sum(-1)).max(1))
            knorm = np.sqrt((Kp ** 2).sum(-1))
            maxnorm = Kp[np.arange(nsealed_all), knorm.argmax(1)]
            outl = Kp[np.arange(nsealed_all), np.sqrt((resid ** 2).sum(-1)).argmax(1)]
            outres = outl - mean
            var = f16((resid ** 2).mean(1))
            mu = Kf[:prefix].mean(0)
            # stream-level bases, from the prompt's sealed pages only
            R0 = resid[:sealed0].reshape(-1, D)
            ev, U = np.linalg.eigh(R0.T @ R0); U = U[:, ::-1].T   # rows: top residual directions
            proj = resid @ U.T                                     # [pages][8][64] in U basis
            hrU = f16(np.abs(proj).max(1))                         # per-direction residual half-range
            chan_k = np.argsort(-hr[:sealed0].mean(0))            # channels by mean half-range
            obsq = Q[l, prefix - 64:prefix, g * G:(g + 1) * G].astype(np.float32).reshape(-1, D)
            chan_q = np.argsort(-(np.abs(obsq).mean(0) * hr[:sealed0].mean(0)))
            Uq_w = np.abs(obsq @ U.T).mean(0) * hrU[:sealed0].mean(0)
            dir_q = np.argsort(-Uq_w)
            pairn = np.sqrt(resid[..., :32] ** 2 + resid[..., 32:] ** 2)  # RoPE pairs (i, i+32)
            rho = f16(pairn.max(1))                                   # [pages][32]
            pair_k = np.argsort(-rho[:sealed0].mean(0))
            # 2-means within page (init: token of max residual vs the rest)
            def two_means(X):
                a = np.zeros(PT, int); a[np.sqrt(((X - X.mean(0)) ** 2).sum(1)).argmax()] = 1
                for _ in range(5):
                    c = np.array([X[a == j].mean(0) if (a == j).any() else X.mean(0) for j in (0, 1)])
                    a2 = np.argmin(((X[:, None] - c[None]) ** 2).sum(-1), 1)
                    if (a2 == a).all(): break
                    a = a2
                return c
            km2 = f16(np.array([two_means(Kp[p]) for p in range(nsealed_all)]))
            # cluster-level data for level-1 variants
            hier = Hier(list(mean[:sealed0]))
            def cl_data(h):
                lo_c = np.array([lo[c].min(0) for c in h.cl]); hi_c = np.array([hi[c].max(0) for c in h.cl])
                tokr = np.array([np.sqrt(l2sq(Kp[c].reshape(-1, D), h.cent[i][None]).max()) for i, c in enumerate(h.cl)])
                outk, HR, CR = [], [], []
                for i, c in enumerate(h.cl):
                    T = Kp[c].reshape(-1, D); dd = l2sq(T, h.cent[i][None]); o = np.argsort(-dd)[:4]
                    outk.append(T[o] if len(o) == 4 else np.concatenate([T[o], np.repeat(T[o[-1:]], 4 - len(o), 0)]))
                    HR.append(f16(np.abs((T - h.cent[i]) @ U.T).max(0)))
                    rr = T - h.cent[i]; CR.append(f16(np.sqrt(rr[:, :32] ** 2 + rr[:, 32:] ** 2).max(0)))
                return {'lo': lo_c, 'hi': hi_c, 'tokr': tokr, 'out': np.array(outk), 'U': U, 'HR': np.array(HR), 'CR': np.array(CR)}
            l1d = cl_data(hier)
            hier8 = Hier(list(mean[:sealed0]), cpc=8); l1d8 = cl_data(hier8)
            for s in range(steps):
                n = prefix + s + 1
                se, lb, pages = page_ranges(n)
                qs = Q[l, prefix + s, g * G:(g + 1) * G].astype(np.float32)
                logit = (qs.astype(np.float64) @ Kf[:n].T.astype(np.float64)) * SCALE
                m = logit.max(1, keepdims=True); a = np.exp(logit - m)
                Z = a.sum(1, keepdims=True); a = a / Z                     # [G][n] true attention
                ap = np.zeros((G, pages * PT)); ap[:, :n] = a
                pm = ap.reshape(G, pages, PT).sum(-1)                     # [G][pages]
                cand = np.arange(se, lb); nc = len(cand)
                fixed = pm[:, :se].sum(1) + pm[:, lb:].sum(1)             # sink + local mass per head
                candmass = pm[:, se:lb].sum(1)
                gm = pm.sum(0)                                            # group mass per page
                dot = lambda X: qs @ X.T
                qa = np.abs(qs)
                qpair = np.sqrt(qs[:, :32] ** 2 + qs[:, 32:] ** 2)
                qU = qs @ U.T
                def est_of(name, ids):
                    if name == 'quest': return np.maximum(qs[:, None] * lo[ids][None], qs[:, None] * hi[ids][None]).sum(-1)
                    if name == 'meankey': return dot(mean[ids])
                    if name.startswith('a_'): return dot(mean[ids]) + float(name[2:]) * np.sqrt((qs ** 2).sum(1))[:, None] * rpage[ids][None]
                    if name.startswith('b_mid'): return dot(mid[ids]) + qa @ hr[ids].T
                    if name.startswith('b_'): return dot(mean[ids]) + float(name[2:]) * (qa @ hr[ids].T)
                    if name == 'c_maxnorm': return dot(maxnorm[ids])
                    if name == 'c_mid': return dot(mid[ids])
                    if name == 'c_mean|maxnorm': return np.maximum(dot(mean[ids]), dot(maxnorm[ids]))
                    if name == 'c_mean|outlier': return np.maximum(dot(mean[ids]), dot(outl[ids]))
                    if name == 'e_outlr8':   # mean + max(0, (qU8).(outlier residual)U8): mean + 8 floats
                        return dot(mean[ids]) + np.maximum(0, qU[:, :8] @ f16(outres[ids] @ U[:8].T).T)
                    if name == 'e_outlr16':
                        return dot(mean[ids]) + np.maximum(0, qU[:, :16] @ f16(outres[ids] @ U[:16].T).T)
                    if name == 'd_center': return dot(mean[ids] - mu)
                    if name == 'e_var': return dot(mean[ids]) + 0.5 * SCALE * ((qs ** 2) @ var[ids].T)
                    if name.startswith('e_pcahr'):   # e_pcahr{r}[q]: mean + sum_j |q.u_j| hr_j over r dirs
                        r = int(name[7:].rstrip('q')); js = dir_q[:r] if name.endswith('q') else np.arange(r)
                        return dot(mean[ids]) + np.abs(qU[:, js]) @ hrU[ids][:, js].T
                    if name.startswith('e_chan'):    # e_chan{m}[q]: mean + half-range on m fixed channels
                        mm = int(name[6:].rstrip('q')); cs = (chan_q if name.endswith('q') else chan_k)[:mm]
                        return dot(mean[ids]) + qa[:, cs] @ hr[ids][:, cs].T
                    if name.startswith('e_pair'):    # mean + per RoPE pair residual radius (m pairs)
                        mm = int(name[6:]); ps = pair_k[:mm]
                        return dot(mean[ids]) + qpair[:, ps] @ rho[ids][:, ps].T
                    if name.startswith('e_lrmax'):   # mean + max_t (qU_r).(res_t U_r)
                        r = int(name[7:])
                        return dot(mean[ids]) + np.einsum('hr,ptr->hpt', qU[:, :r], f16(proj[ids][..., :r])).max(-1)
                    if name == 'e_km2': return np.einsum('hd,pjd->hpj', qs, km2[ids]).max(-1)
                    raise KeyError(name)
                flat = ['quest', 'meankey', 'a_0.25', 'a_0.5', 'a_1', 'b_0.25', 'b_0.5', 'b_1', 'b_mid',
                        'c_maxnorm', 'c_mid', 'c_mean|maxnorm', 'c_mean|outlier', 'd_center', 'e_var',
                        'e_pcahr4', 'e_pcahr8', 'e_pcahr12', 'e_pcahr8q', 'e_chan8', 'e_chan12', 'e_chan16', 'e_chan8q', 'e_chan12q',
                        'e_pair8', 'e_pair16', 'e_pair32', 'e_lrmax2', 'e_lrmax4', 'e_km2', 'e_pair4', 'e_pair12', 'e_outlr8', 'e_outlr16']
                def record(name, fb, sel):
                    mr = (fixed + pm[:, sel].sum(1)).mean()
                    mc = (pm[:, sel].sum(1) / candmass).mean()
                    res.setdefault(name, {}).setdefault(fb, []).append((l, g, s, mr)); resc.setdefault(name, {}).setdefault(fb, []).append(mc)
                sels = {}
                for fb in BUDGETS:
                    k = pages_for(fb, nc)
                    record('oracle', fb, topk(gm[cand], cand, k))
                    for name in flat:
                        sel = topk(gqa(est_of(name, cand)), cand, k); record(name, fb, sel); sels[(name, fb)] = sel
                    for tau in (0.5, 1.0, 2.0):   # d: sum over heads of softmax(q.mean * scale / tau)
                        e = dot(mean[cand]) * SCALE / tau
                        p_ = np.exp(e - e.max(1, keepdims=True)); p_ /= p_.sum(1, keepdims=True)
                        record('d_softsum_t%g' % tau, fb, topk(p_.sum(0), cand, k))
                    # Hierarchical
                    hsel = lambda member, l1='base', **kw: hier.select(qs, se, lb, k, lambda ids: est_of(member, ids), l1=l1, l1data=l1d, **kw)
                    record('H', fb, hsel('meankey'))
                    record('H[l2=oracle]', fb, hier.select(qs, se, lb, k, None, l1data=l1d, members_oracle=lambda ids: gm[ids]))
                    record('H[l2=quest]', fb, hsel('quest'))
                    for mname in ['b_0.5', 'b_1', 'a_0.5', 'e_pcahr8', 'e_chan8q', 'e_chan12q', 'e_pair16']:
                        record('H[l2=%s]' % mname, fb, hsel(mname))
                    for l1 in ['r0', 'r1', 'box', 'tokr']:
                        record('H[l1=%s]' % l1, fb, hsel('meankey', l1=l1))
                        record('H[l1=%s,l2=oracle]' % l1, fb, hier.select(qs, se, lb, k, None, l1=l1, l1data=l1d, members_oracle=lambda ids: gm[ids]))
                        for mname in ['b_0.5', 'e_pcahr8', 'e_chan8q', 'e_chan12q', 'quest']:
                            record('H[l1=%s,l2=%s]' % (l1, mname), fb, hsel(mname, l1=l1))
                    l1d['gm'] = gm
                    for l1 in ['oracle', 'out1', 'out2', 'out4', 'pca8']:
                        record('H[l1=%s,l2=oracle]' % l1, fb, hier.select(qs, se, lb, k, None, l1=l1, l1data=l1d, members_oracle=lambda ids: gm[ids]))
                        for mname in ['meankey', 'quest', 'e_pair8', 'e_pcahr8', 'c_mean|outlier', 'e_outlr8', 'e_pair4']:
                            record('H[l1=%s,l2=%s]' % (l1, mname), fb, hsel(mname, l1=l1))
                    record('H[x8]', fb, hsel('meankey', expand=8.0))
                    record('H[x8,l2=oracle]', fb, hier.select(qs, se, lb, k, None, l1data=l1d, members_oracle=lambda ids: gm[ids], expand=8.0))
                    for mname in ['meankey', 'e_pair8', 'e_pair4']:
                        record('H[cpc8,l2=%s]' % mname, fb, hier8.select(qs, se, lb, k, lambda ids: est_of(mname, ids)))
                        record('H[cpc8,l1=out2,l2=%s]' % mname, fb, hier8.select(qs, se, lb, k, lambda ids: est_of(mname, ids), l1='out2', l1data=l1d8))
                    record('H[cpc8,l2=oracle]', fb, hier8.select(qs, se, lb, k, None, members_oracle=lambda ids: gm[ids]))
                    for l1 in ['cpair0.5', 'cpair1']:
                        record('H[l1=%s,l2=oracle]' % l1, fb, hier.select(qs, se, lb, k, None, l1=l1, l1data=l1d, members_oracle=lambda ids: gm[ids]))
                        for mname in ['meankey', 'e_pair4', 'e_pair8']:
                            record('H[l1=%s,l2=%s]' % (l1, mname), fb, hsel(mname, l1=l1))
                    for l1 in ['base', 'pca8', 'out2', 'box', 'cpair0.5', 'cpair1']:
                        for mname in ['e_pair4', 'e_pair8']:
                            record('H[x8,l1=%s,l2=%s]' % (l1, mname), fb, hsel(mname, l1=l1, expand=8.0))
                    for ex in (8.0,):
                        for mname in ['e_pcahr8', 'e_chan12q']:
                            record('H[l1=box,l2=%s,x8]' % mname, fb, hsel(mname, l1='box', expand=ex))
                # ---- diagnostics at 6.25%
                ca = ap[:, :pages * PT].reshape(G, pages, PT)[:, se:lb]          # [G][nc][8]
                cg = ca.sum(0)                                                 # group, per token
                share = cg.max(1) / np.maximum(cg.sum(1), 1e-30)               # top-token share per page
                w = gm[cand] / gm[cand].sum()
                kq = sels[('quest', 0.0625)]; km = sels[('meankey', 0.0625)]
                qo = np.setdiff1d(kq, km); mo = np.setdiff1d(km, kq); both = np.intersect1d(kq, km)
                lm = np.log(np.maximum(pm[:, se:lb], 1e-300))
                def corr(x, y):
                    x = x - x.mean(); y = y - y.mean(); return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
                def rank(x): return np.argsort(np.argsort(x)).astype(float)
                eq = est_of('quest', cand); em = est_of('meankey', cand); eb = est_of('e_pcahr8', cand)
                ec = est_of('e_chan12q', cand)
                d_ = dict(l=l, g=g, s=s,
                          share_w=float((share * w).sum()), share_top=float(share[np.isin(cand, topk(gm[cand], cand, pages_for(0.0625, nc)))].mean()),
                          share_qo=float(share[np.isin(cand, qo)].mean()) if len(qo) else np.nan,
                          share_mo=float(share[np.isin(cand, mo)].mean()) if len(mo) else np.nan,
                          share_both=float(share[np.isin(cand, both)].mean()) if len(both) else np.nan,
                          mass_qo=float(gm[qo].sum() / G), mass_mo=float(gm[mo].sum() / G), nqo=len(qo),
                          cand_frac=float(candmass.mean()), sink=float(pm[:, :se].sum(1).mean()), local=float(pm[:, lb:].sum(1).mean()),
                          pear_q=np.mean([corr(eq[h] * SCALE, lm[h]) for h in range(G)]),
                          pear_m=np.mean([corr(em[h] * SCALE, lm[h]) for h in range(G)]),
                          pear_b=np.mean([corr(eb[h] * SCALE, lm[h]) for h in range(G)]),
                          pear_c=np.mean([corr(ec[h] * SCALE, lm[h]) for h in range(G)]),
                          spear_q=np.mean([corr(rank(eq[h]), rank(lm[h])) for h in range(G)]),
                          spear_m=np.mean([corr(rank(em[h]), rank(lm[h])) for h in range(G)]))
                if s == 0:
                    # key statistics over the prompt's keys
                    e2 = (Kf[:prefix] ** 2).mean(0)
                    d_['top2ch_energy'] = float(np.sort(e2)[-2:].sum() / e2.sum())
                    d_['top_ch'] = [int(c) for c in np.argsort(-e2)[:4]]
                    pe = e2[:32] + e2[32:]
                    d_['pair_energy'] = (pe / pe.sum()).tolist()
                    mp = np.sqrt(mean[:sealed0, :32] ** 2 + mean[:sealed0, 32:] ** 2).mean(0)
                    kp = np.sqrt(Kp[:sealed0, :, :32] ** 2 + Kp[:sealed0, :, 32:] ** 2).mean((0, 1))
                    d_['pair_shrink'] = (mp / np.maximum(kp, 1e-9)).tolist()   # |mean| / mean |k| per RoPE pair
                    # share of the variance of q.k over tokens carried by each RoPE pair (one query head)
                    qq = qs[0]; contrib = Kf[:prefix, :32] * qq[:32] + Kf[:prefix, 32:] * qq[32:]
                    d_['pair_qk_var'] = (contrib.var(0) / contrib.var(0).sum()).tolist()
                    d_['resid_energy_top8'] = float(ev[::-1][:8].sum() / ev.sum())
                    d_['resid_energy_top4'] = float(ev[::-1][:4].sum() / ev.sum())
                tp = topk(gm[cand], cand, pages_for(0.0625, nc))
                cof = {p: i for i, c in enumerate(hier.cl) for p in c}
                d_['ncl_top'] = len({cof[p] for p in tp})
                diag.append(d_)
                if s == 4:  # page 258 (positions 2064..2071) is sealed after the step with n = 2072
                    pass
                if n % PT == 0:
                    hier.join(mean[n // PT - 1]); l1d = cl_data(hier)
                    hier8.join(mean[n // PT - 1]); l1d8 = cl_data(hier8)
        print('layer', l, 'done', round(time.time() - t0, 1), 's', file=sys.stderr, flush=True)
    out = {'res': {m: {str(b): v for b, v in d.items()} for m, d in res.items()},
           'resc': {m: {str(b): v for b, v in d.items()} for m, d in resc.items()}, 'diag': diag}
    with open(os.path.join(OUT, 'results.json'), 'w') as f: json.dump(out, f, default=float)

if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
