# Where sparse decoding loses the answers: on every kvd-longbench sample where OracleMass answers
# better than the index, which pages the oracle keeps and the index drops, and where they are.
#
#   kvd-longbench ... --configs dense,hierarchical@0.0625,oracle-mass@0.0625 --json run.json \
#       --record-traces DIR
#   python3 misses.py run.json DIR [INDEX_CONFIG] [ORACLE_CONFIG]
#
# For each such sample it replays dense's reply steps (the trace's positions after the prompt) in
# numpy, per layer and KV head: OracleMass's pages (the budget's top pages by attention mass summed
# over the group) against the index's (Hierarchical's member estimate, scored flat as it scores
# every candidate below 512 pages: q.mean + 0.5 sum over 2 rotary pairs of |q_pair| rho_pair, the
# pairs chosen from the first 32 pages' keys; no focus carry), and for every page the oracle keeps
# and the index drops: layer, depth in the document, distance from the query, how much of the
# page's attention sits on its best token, its mass, and its rank under the index's estimate, under
# Quest's bound and under 4-bit token keys (index::TokenRescore's estimate). Prints tables weighted
# by the dropped pages' attention mass (docs/indices.md, "Where the misses come from").
import json, math, os, struct, sys
import numpy as np

PT, SINK, LOCAL, D, G, SCALE = 8, 4, 64, 64, 3, 1.0 / 8.0
f16 = lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def read_trace(path):
    with open(path, 'rb') as f:
        h = f.read(40)
    assert h[:8] == b'KVDTRACE', path
    ver, dt, L, qh, kvh, d, _, _ = struct.unpack('<8I', h[8:])
    assert dt == 1 and d == D and qh == kvh * G, (dt, d, qh, kvh)
    rec = np.dtype([('pos', '<u8'), ('layer', '<u4'), ('res', '<u4'), ('q', '<f2', (qh, d)), ('k', '<f2', (kvh, d)), ('v', '<f2', (kvh, d))])
    n = (os.path.getsize(path) - 64) // rec.itemsize
    r = np.fromfile(path, dtype=rec, count=n, offset=40)
    P = int(r['pos'].max()) + 1
    Q = np.zeros((L, P, qh, d), np.float16); K = np.zeros((L, P, kvh, d), np.float16)
    Q[r['layer'], r['pos']] = r['q']; K[r['layer'], r['pos']] = r['k']
    return Q, K


def page_ranges(n):  # kvd-eval's rules: sink pages, local boundary, pages
    pages = (n + PT - 1) // PT
    sink_end = min((SINK + PT - 1) // PT, pages)
    lb = min((n - LOCAL if n > LOCAL else 0) // PT, (n - 1) // PT)
    return sink_end, max(lb, sink_end)


def budget_pages(f, c):
    return max(1, min(int(math.ceil(f * c - 1e-9)), c)) if c > 0 else 0


def gqa(est):
    return (est - est.max(axis=1, keepdims=True)).max(axis=0)


def ranks(score):  # 0 = best; ties to the lower page
    order = np.lexsort((np.arange(len(score)), -score))
    r = np.empty(len(score), int); r[order] = np.arange(len(score))
    return r


def int4_keys(kp, first):  # TokenKeys: channel RMS over the first pages, per-token scale, codes -7..7
    s = np.sqrt((first.reshape(-1, D) ** 2).mean(0)); s = np.maximum(s, s.max() / 64)
    x = kp / s
    t = np.abs(x).max(-1, keepdims=True) / 7; t[t == 0] = 1
    return np.clip(np.rint(x / t), -7, 7) * t * s


TOTALS = {'oracle': 0.0, 'dropped': 0.0, 'pairs': 0}


def stream_misses(Q, K, l, g, positions, budget):
    kk = K[l, :, g].astype(np.float32)
    P = kk.shape[0]; ns = P // PT
    kp = kk[:ns * PT].reshape(ns, PT, D)
    mean = f16(kp.mean(1)); lo, hi = kp.min(1), kp.max(1)
    resid = kp - mean[:, None, :]
    rho = f16(np.sqrt(resid[..., 0::2] ** 2 + resid[..., 1::2] ** 2).max(1))  # [pages][32]
    first = min(32, ns)
    pn = np.sqrt(mean[:first, 0::2] ** 2 + mean[:first, 1::2] ** 2).mean(0)
    pairs = np.lexsort((np.arange(32), -(pn * rho[:first].mean(0))))[:2]
    kq = int4_keys(kp, kp[:first])
    out = []
    for pos in positions:
        n = pos + 1
        s0, lb = page_ranges(n)
        c = lb - s0
        if c <= budget_pages(budget, c): continue
        k = budget_pages(budget, c)
        q = Q[l, pos, g * G:(g + 1) * G].astype(np.float32)
        sc = q @ kk[:n].T * SCALE
        a = np.exp(sc - sc.max(1, keepdims=True)); a /= a.sum(1, keepdims=True)
        tok = a[:, s0 * PT:lb * PT].reshape(G, c, PT)
        mass = tok.sum(-1)                                   # [G][c]
        oracle = ranks(mass.sum(0)) < k
        TOTALS['pairs'] += 1
        qp = np.sqrt(q[:, 0::2] ** 2 + q[:, 1::2] ** 2)[:, pairs]  # [G][2]
        est = q @ mean[s0:lb].T + 0.5 * qp @ rho[s0:lb][:, pairs].T
        r_index = ranks(gqa(est))
        r_quest = ranks(gqa(np.maximum(q[:, None, :] * lo[None, s0:lb], q[:, None, :] * hi[None, s0:lb]).sum(-1)))
        ts = np.einsum('hd,ctd->hct', q, kq[s0:lb]) * SCALE
        m = ts.max(-1, keepdims=True)
        r_tok = ranks(gqa((m[..., 0] + np.log(np.exp(ts - m).sum(-1)))))
        TOTALS['oracle'] += float(mass[:, oracle].sum()) / G
        TOTALS['dropped'] += float(mass[:, oracle & (r_index >= k)].sum()) / G
        for i in np.nonzero(oracle & (r_index >= k))[0]:
            h = int(mass[:, i].argmax())
            out.append(dict(layer=l, head=g, depth=i / c, distance=lb - (s0 + i), mass=float(mass[h, i]),
                            top_token=float(tok[h, i].max() / max(mass[h, i], 1e-30)), budget=k, candidates=c,
                            rank_index=int(r_index[i]), rank_quest=int(r_quest[i]), rank_token=int(r_tok[i])))
    return out


def band_table(title, rows, key, bands):
    total = sum(r['mass'] for r in rows) or 1.0
    print(f"\n{title}\n| band | dropped pages | share of dropped mass |\n| --- | --- | --- |")
    for name, test in bands:
        sel = [r for r in rows if test(key(r))]
        print(f"| {name} | {len(sel)} | {sum(r['mass'] for r in sel) / total:.3f} |")


def main():
    run, tdir = sys.argv[1], sys.argv[2]
    ix = sys.argv[3] if len(sys.argv) > 3 else 'hierarchical@0.0625'
    orc = sys.argv[4] if len(sys.argv) > 4 else 'oracle-mass@0.0625'
    budget = float(ix.split('@')[1])
    rows, used = [], 0
    for s in json.load(open(run))['samples']:
        cf = s['configs']
        if cf[orc]['score'] <= cf[ix]['score']: continue
        path = os.path.join(tdir, f"{s['task']}-{s['haystack']}-{s['context']}-{s['seed']}.trace")
        if not os.path.exists(path):
            print('no trace for', path, file=sys.stderr); continue
        Q, K = read_trace(path)
        positions = range(s['prompt_tokens'], Q.shape[1])
        used += 1
        for l in range(K.shape[0]):
            for g in range(K.shape[2]):
                rows.extend(stream_misses(Q, K, l, g, positions, budget))
    print(f"{used} samples where {orc} scores above {ix}; {TOTALS['pairs']} (step, stream) pairs, {len(rows)} pages dropped; "
          f"the oracle's pages hold {TOTALS['oracle'] / max(1, TOTALS['pairs']):.3f} of a head's attention on average, "
          f"the dropped ones {TOTALS['dropped'] / max(1, TOTALS['pairs']):.3f}")
    if not rows: return
    band_table('By layer', rows, lambda r: r['layer'], [('0-2', lambda x: x <= 2), ('3-10', lambda x: 3 <= x <= 10),
                                                        ('11-20', lambda x: 11 <= x <= 20), ('21-29', lambda x: x >= 21)])
    band_table('By depth in the document', rows, lambda r: r['depth'], [('0-33%', lambda x: x < 1 / 3), ('33-67%', lambda x: 1 / 3 <= x < 2 / 3),
                                                                         ('67-100%', lambda x: x >= 2 / 3)])
    band_table('By distance from the query (pages)', rows, lambda r: r['distance'], [('< 16', lambda x: x < 16), ('16-127', lambda x: 16 <= x < 128),
                                                                                      ('>= 128', lambda x: x >= 128)])
    band_table("By the share of the page's attention on its best token", rows, lambda r: r['top_token'],
               [('>= 0.8', lambda x: x >= 0.8), ('0.5-0.8', lambda x: 0.5 <= x < 0.8), ('< 0.5', lambda x: x < 0.5)])
    for what in ('rank_index', 'rank_quest', 'rank_token'):
        band_table(f"By {what} (in budgets B: where the estimate put the page)", rows, lambda r: r[what] / r['budget'],
                   [('< B (kept)', lambda x: x < 1), ('B-2B', lambda x: 1 <= x < 2), ('2B-4B', lambda x: 2 <= x < 4), ('4B-8B', lambda x: 4 <= x < 8), ('>= 8B', lambda x: x >= 8)])


if __name__ == '__main__':
    main()
