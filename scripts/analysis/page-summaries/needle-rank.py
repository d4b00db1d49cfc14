# Rank of the needle's page under each page estimate, per stream and answer step: MeanKey (q . mean),
# Quest's bound, the page's best token (max q . k, the ideal a summary approximates) and OracleMass;
# 'mass' is the largest share of a head's attention on the page. See README.md.
import numpy as np, os, sys, math
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load
from analyze import page_ranges, pages_for, gqa, f16, PT
Q, K, prefix = load.load()
# The needle's page and the streams that copy it, found with find-needle.py; the answer's positions.
NP = int(os.environ.get('NEEDLE_PAGE', 51))
streams = [tuple(int(x) for x in s.split('.')) for s in os.environ.get('STREAMS', '7.2 14.1 17.1 18.2 23.0 18.0 18.1').split()]
FIRST, LAST = (int(x) for x in os.environ.get('POSITIONS', '3991 3996').split())
for pos in range(FIRST, LAST + 1):
    n = pos + 1
    s0, lb, pages = page_ranges(n)
    ids = np.arange(s0, lb); c = len(ids); k = pages_for(0.0625, c)
    out = []
    for (l, g) in streams:
        kk = K[l, :lb*PT, g].astype(np.float32).reshape(lb, PT, 64)[s0:]
        means = f16(kk.mean(1))
        lo = kk.min(1); hi = kk.max(1)
        q = Q[l, pos, 3*g:3*g+3].astype(np.float32)
        est = q @ means.T  # [3][c]
        mk = gqa(est)
        qu = gqa(np.maximum(q[:, None, :] * lo[None], q[:, None, :] * hi[None]).sum(-1))
        # oracle mass
        kall = K[l, :n, g].astype(np.float32)
        sc = q @ kall.T / 8.0
        a = np.exp(sc - sc.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
        pm = a[:, s0*PT:lb*PT].reshape(3, c, PT).sum(-1)
        om = pm.sum(0)
        # max token score per page (ideal 'max' summary)
        mx = gqa(sc[:, s0*PT:lb*PT].reshape(3, c, PT).max(-1))
        def rank(sc): return int((sc > sc[NP - s0]).sum())
        out.append(f"L{l}g{g}: mean {rank(mk)} quest {rank(qu)} max {rank(mx)} oracle {rank(om)} mass {pm[:, NP-s0].max():.2f}")
    print(pos, 'k=', k, ' | '.join(out))
