# Where a needle is read from: at each answer position, every (layer, query head) that puts more than
# 0.3 of its attention on one token outside sink and local, with that token's position.
import numpy as np, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('KVD_TRACE', '/tmp/needle/n4k.trace')
import load
Q, K, prefix = load.load()
print(Q.shape, K.shape)
L, P, QH, D = Q.shape
FIRST, LAST = (int(x) for x in os.environ.get('POSITIONS', '3990 3996').split())
for pos in range(FIRST, LAST + 1):
    hits = []
    for l in range(L):
        k = K[l, :pos+1].astype(np.float32)  # [n][3][64]
        for h in range(QH):
            q = Q[l, pos, h].astype(np.float32)
            s = k[:, h // 3] @ q / 8.0
            a = np.exp(s - s.max()); a /= a.sum()
            a2 = a.copy(); a2[:4] = 0; a2[pos+1-64:] = 0
            t = int(a2.argmax())
            if a2[t] > 0.3: hits.append((l, h, t, round(float(a2[t]), 2)))
    print(pos, hits)
