import json, numpy as np, sys
import os
z = json.load(open(os.path.join(os.environ.get('KVD_ANALYSIS_OUT', '.'), 'results.json')))
res, resc = z['res'], z['resc']
def m(name, b, c=False):
    if c: return np.mean(resc[name][b])
    return np.mean([x[3] for x in res[name][b]])
for name in res:
    print('%-34s %.4f %.4f   cand-only %.4f %.4f' % (name, m(name, '0.0625'), m(name, '0.015625'), m(name, '0.0625', 1), m(name, '0.015625', 1)))
