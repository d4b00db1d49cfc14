import numpy as np, struct, os
# The trace (kvd-llama --record-trace, f16) and where the parsed arrays and results go.
PATH = os.environ.get('KVD_TRACE', 'smol2k.trace')
OUT = os.environ.get('KVD_ANALYSIS_OUT', '.')
CACHE = os.path.join(OUT, 'trace_qk.npz')

def load():
    if os.path.exists(CACHE):
        z = np.load(CACHE)
        return z['Q'], z['K'], int(z['prefix'])
    with open(PATH, 'rb') as f:
        h = f.read(40)
    assert h[:8] == b'KVDTRACE'
    ver, dt, L, qh, kvh, d, _, _ = struct.unpack('<8I', h[8:])
    assert dt == 1, dt  # f16
    rec = np.dtype([('pos', '<u8'), ('layer', '<u4'), ('res', '<u4'), ('q', '<f2', (qh, d)),
                    ('k', '<f2', (kvh, d)), ('v', '<f2', (kvh, d))])
    size = os.path.getsize(PATH)
    n = (size - 40 - 24) // rec.itemsize
    assert 40 + 24 + n * rec.itemsize == size
    r = np.fromfile(PATH, dtype=rec, count=n, offset=40)
    P = int(r['pos'].max()) + 1
    Q = np.zeros((L, P, qh, d), np.float16); K = np.zeros((L, P, kvh, d), np.float16)
    seen = np.zeros((L, P), bool)
    # later records replace earlier: fancy assignment keeps the last write per index in numpy
    Q[r['layer'], r['pos']] = r['q']; K[r['layer'], r['pos']] = r['k']; seen[r['layer'], r['pos']] = True
    assert seen.all()
    prefix = P - 8
    np.savez(CACHE, Q=Q, K=K, prefix=prefix)
    return Q, K, prefix

if __name__ == '__main__':
    Q, K, prefix = load()
    print(Q.shape, K.shape, prefix)
