import json, numpy as np
from load import load
import os
z = json.load(open(os.path.join(os.environ.get('KVD_ANALYSIS_OUT', '.'), 'results.json'))); res, diag = z['res'], z['diag']
def per_layer(name, b='0.0625'):
    a = np.array(res[name][b]); out = np.zeros(30)
    for l in range(30): out[l] = a[a[:, 0] == l, 3].mean()
    return out
names = ['oracle', 'quest', 'meankey', 'e_pair4', 'c_mean|outlier', 'H', 'H[x8,l1=pca8,l2=e_pair4]']
T = {n: per_layer(n) for n in names}
D = {k: np.array([[d[k] for d in diag if d['l'] == l] for l in range(30)], dtype=float) for k in
     ['share_w', 'share_top', 'share_qo', 'share_mo', 'share_both', 'mass_qo', 'mass_mo', 'cand_frac', 'sink', 'local', 'pear_q', 'pear_m', 'pear_b', 'spear_q', 'spear_m', 'ncl_top']}
print('layer | ' + ' | '.join(names) + ' | Q-M gap | cand mass | sink | top-tok share (top pages) | pearson Q / M')
for l in range(30):
    print('%2d | ' % l + ' | '.join('%.3f' % T[n][l] for n in names) + ' | %+.3f | %.3f | %.3f | %.2f | %.2f / %.2f' % (
        T['quest'][l] - T['meankey'][l], np.nanmean(D['cand_frac'][l]), np.nanmean(D['sink'][l]), np.nanmean(D['share_top'][l]),
        np.nanmean(D['pear_q'][l]), np.nanmean(D['pear_m'][l])))
gap = T['quest'] - T['meankey']
o = np.argsort(-gap)
print('gap total %.4f; top5 layers %s carry %.0f%% of the summed gap' % (gap.mean(), o[:5].tolist(), 100 * gap[o[:5]].sum() / gap.sum()))
print('layers where meankey beats quest:', np.where(gap < 0)[0].tolist())
for k, v in D.items(): print('%-11s mean %.4f' % (k, np.nanmean(v)))
# corr of gap with candidate mass and top-token share
cf = np.nanmean(D['cand_frac'], 1); sh = np.nanmean(D['share_top'], 1)
print('corr(gap, cand_frac) %.2f  corr(gap, share_top) %.2f' % (np.corrcoef(gap, cf)[0, 1], np.corrcoef(gap, sh)[0, 1]))
d0 = [d for d in diag if 'pair_energy' in d]
pe = np.array([d['pair_energy'] for d in d0]); ps = np.array([d['pair_shrink'] for d in d0]); pv = np.array([d['pair_qk_var'] for d in d0])
print('top2 channel energy share: mean %.3f max %.3f' % (np.mean([d['top2ch_energy'] for d in d0]), np.max([d['top2ch_energy'] for d in d0])))
print('resid energy in top 4/8 PCA dirs: %.3f %.3f' % (np.mean([d['resid_energy_top4'] for d in d0]), np.mean([d['resid_energy_top8'] for d in d0])))
print('pair j: energy share | |mean|/mean|k| | share of var(q.k) over tokens')
for j in [0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 30, 31]:
    print('  %2d  %.3f  %.3f  %.3f' % (j, pe[:, j].mean(), ps[:, j].mean(), pv[:, j].mean()))
print('energy share of pairs 24-31 (lowest freq): %.3f; var(q.k) share of pairs 0-7: %.3f, 24-31: %.3f' % (
    pe[:, 24:].sum(1).mean(), pv[:, :8].sum(1).mean(), pv[:, 24:].sum(1).mean()))
# which pairs e_pair4 uses
Q, K, prefix = load(); cnt = np.zeros(32)
for l in range(30):
    for g in range(3):
        Kp = K[l, :2064, g].astype(np.float32).reshape(258, 8, 64); r = Kp - Kp.mean(1, keepdims=True)
        rho = np.sqrt(r[..., :32] ** 2 + r[..., 32:] ** 2).max(1).mean(0); cnt[np.argsort(-rho)[:4]] += 1
print('pairs chosen by e_pair4 (count over 90 streams):', {j: int(c) for j, c in enumerate(cnt) if c})
