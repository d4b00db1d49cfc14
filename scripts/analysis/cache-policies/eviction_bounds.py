# How much any eviction ranking can gain over LRU on a real trace: the fast-tier cache of every
# stream replayed over OracleMass's selections (the pages of largest attention mass summed over
# the GQA group), at capacity W x budget pages, with warm-up placement, for
#   lru                 most recently selected first (eviction::Lru)
#   lookahead           kvdrive's rule (eviction::Lookahead): the last W steps' pages first, then
#                       the decayed accumulated mass (decay 0.25), then recency
#   current-mass        the last W steps first, then the true attention mass of every cached page
#                       at the current step: more than any index knows (an index estimates it)
#   current-mass-nowin  the same without the window rule
#   next-step           pages the next step selects first, then recency (one step of the future)
#   belady              the page used farthest in the future goes first (the optimum)
#   no-compulsory-miss  1 - the pages never selected or placed before: the ceiling of every policy
# Warm-up places the top capacity pages by the summed attention mass of the last 32 prompt
# queries (ImportanceGuided's rule, approximately). Usage, with a trace of kvd-llama
# --record-trace (f16, STEPS decode steps at its end):
#   KVD_TRACE=eval.trace python3 eviction_bounds.py [budget 0.0625] [window 3] [steps 64]
import math, os, struct, sys
import numpy as np

PATH = os.environ.get('KVD_TRACE', 'eval.trace')
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0625
W = int(sys.argv[2]) if len(sys.argv) > 2 else 3
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
PT, SINK, LOCAL, OBS, DECAY = 8, 4, 64, 32, 0.25


def load():
    with open(PATH, 'rb') as f:
        h = f.read(40)
    assert h[:8] == b'KVDTRACE', 'not a kvdrive trace'
    _, dt, layers, qh, kvh, d, _, _ = struct.unpack('<8I', h[8:])
    assert dt == 1, 'an f16 trace is expected'
    rec = np.dtype([('pos', '<u8'), ('layer', '<u4'), ('res', '<u4'), ('q', '<f2', (qh, d)),
                    ('k', '<f2', (kvh, d)), ('v', '<f2', (kvh, d))])
    n = (os.path.getsize(PATH) - 64) // rec.itemsize
    r = np.fromfile(PATH, dtype=rec, count=n, offset=40)
    P = int(r['pos'].max()) + 1
    Q = np.zeros((layers, P, qh, d), np.float16)
    K = np.zeros((layers, P, kvh, d), np.float16)
    Q[r['layer'], r['pos']] = r['q']  # a later record of a position replaces an earlier one
    K[r['layer'], r['pos']] = r['k']
    return Q, K


def ranges(n):  # Decision 3: sink pages, candidates [sink_end, local_begin), local pages
    pages = (n + PT - 1) // PT
    se = min((SINK + PT - 1) // PT, pages)
    lb = min((n - LOCAL if n > LOCAL else 0) // PT, (n - 1) // PT)
    return se, max(lb, se)


def pages_for(f, c):
    return 0 if c <= 0 else max(1, min(int(math.ceil(f * c - 1e-9)), c))


def page_mass(q, k, n, scale):  # attention mass per page of the first n tokens, summed over heads
    s = (q @ k[:n].T) * scale
    s -= s.max(1, keepdims=True)
    e = np.exp(s)
    e /= e.sum(1, keepdims=True)
    m = np.zeros((n + PT - 1) // PT)
    np.add.at(m, np.arange(n) // PT, e.sum(0))
    return m


def top(score, ids, k):  # the k best, ties to the lower page
    return set(ids[np.lexsort((ids, -score))[:k]].tolist())


def main():
    Q, K = load()
    layers, P, qh, d = Q.shape
    kvh = K.shape[2]
    g, scale, prefix = qh // kvh, 1 / math.sqrt(d), P - STEPS
    hits = {}

    def add(name, h, n):
        a = hits.setdefault(name, [0, 0])
        a[0] += h
        a[1] += n

    for l in range(layers):
        for h in range(kvh):
            k = K[l, :, h].astype(np.float32)
            qs = Q[l, :, h * g:(h + 1) * g].astype(np.float32)
            imp = np.zeros((prefix + PT - 1) // PT)
            for t in range(prefix - OBS, prefix):
                m = page_mass(qs[t], k, t + 1, scale)
                imp[:len(m)] += m
            mass, sels = [], []
            for s in range(STEPS):
                n = prefix + s + 1
                se, lb = ranges(n)
                m = page_mass(qs[prefix + s], k, n, scale)
                b = pages_for(BUDGET, lb - se)
                mass.append(m)
                sels.append((top(m[se:lb], np.arange(se, lb), b), b))
            se, lb = ranges(prefix + 1)
            ids = np.arange(se, min(lb, len(imp)))
            warm = top(imp[ids], ids, W * sels[0][1])

            def run(name, key):
                cache = {p: [0, imp[p]] for p in warm}  # page -> [last step, decayed mass]
                for s, (sel, b) in enumerate(sels):
                    step = s + 1
                    add(name, sum(p in cache for p in sel), len(sel))
                    for p in sel:
                        e = cache.get(p)
                        if e is None:
                            cache[p] = [step, mass[s][p]]
                        else:
                            e[1] = e[1] * DECAY ** (step - e[0]) + mass[s][p]
                            e[0] = step
                    if len(cache) > W * b:
                        for p in sorted(cache, key=lambda p: key(p, cache[p], step, s), reverse=True)[W * b:]:
                            del cache[p]

            def next_use(p, s):
                return next((j for j in range(s + 1, STEPS) if p in sels[j][0]), 1 << 30)

            win = lambda e, step: e[0] + W > step
            now = lambda p, s: mass[s][p] if p < len(mass[s]) else 0.0
            run('lru', lambda p, e, step, s: (e[0], -p))
            run('lookahead', lambda p, e, step, s: (win(e, step), e[1] * DECAY ** (step - e[0]), e[0], -p))
            run('current-mass', lambda p, e, step, s: (win(e, step), now(p, s), e[0], -p))
            run('current-mass-nowin', lambda p, e, step, s: (now(p, s), e[0], -p))
            run('next-step', lambda p, e, step, s: (s + 1 < STEPS and p in sels[s + 1][0], e[0], -p))
            run('belady', lambda p, e, step, s: (-next_use(p, s), -p))
            seen, first, total = set(warm), 0, 0
            for sel, _ in sels:
                first += len(sel - seen)
                total += len(sel)
                seen |= sel
            add('no-compulsory-miss', total - first, total)
        print(f'layers 0-{l}: ' + ', '.join(f'{n} {a[0] / a[1]:.4f}' for n, a in hits.items()), flush=True)


if __name__ == '__main__':
    main()
