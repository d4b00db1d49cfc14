"""make report's real-model section: kvd-longbench's tasks and teacher-forced fidelity on
SmolLM2-135M-Instruct, as tables and two plots (accuracy against context per index, KL against
budget). report.py calls section(); the JSON files come from kvd-longbench --json (a full run
passed with LONGBENCH_JSON= / FIDELITY_JSON=, or the quick runs report.py makes itself)."""

import math
from collections import defaultdict

import matplotlib.pyplot as plt


def _interval95(scores):
    """kvd-longbench's interval (longbench/stats.hpp): Wilson's for 0/1 scores, else the normal one."""
    n = len(scores)
    if n == 0:
        return 0.0, 0.0, 0.0
    z, mean = 1.959964, sum(scores) / n
    if all(x in (0.0, 1.0) for x in scores):
        z2 = z * z
        centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
        half = z / (1 + z2 / n) * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n))
    else:
        ss = sum((x - mean) ** 2 for x in scores)
        half = z * math.sqrt(ss / (n - 1) / n) if n > 1 else 1.0
        centre = mean
    return mean, max(0.0, centre - half), min(1.0, centre + half)


def _paired95(a, b):
    """kvd-longbench's paired difference (longbench/stats.hpp): mean(a - b) and its normal 95% interval."""
    n = min(len(a), len(b))
    if n == 0:
        return 0.0, 0.0, 0.0
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / n
    half = 1.959964 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 1.0
    return mean, max(-1.0, mean - half), min(1.0, mean + half)


def merge(runs):
    """Several kvd-longbench --json runs as one: runs over other cells (say 1K-2K with more samples
    and 4K-8K with fewer) side by side, and runs of other configurations on the same samples
    (the same task, haystack, context and seed; dense in each) joined. A configuration's cell
    or sample an earlier run already holds is taken from that run, so list the run with more
    samples first. The pooled table, recomputed from the samples, keeps the configurations that
    every pooled sample has."""
    if len(runs) == 1:
        return runs[0]
    out = {"command": " && ".join(r.get("command", "kvd-longbench") for r in runs), "cells": [], "samples": [],
           "failures": sum(r.get("failures", 0) for r in runs)}
    held_cells, by_key = set(), {}
    for r in runs:
        for c in r["cells"]:
            key = (c["config"], c["task"], c["haystack"], c["context"])
            if key not in held_cells:
                held_cells.add(key)
                out["cells"].append(c)
        for s in r["samples"]:
            key = (s["task"], s["haystack"], s["context"], s.get("seed"))
            if key not in by_key:
                by_key[key] = dict(s, configs=dict(s["configs"]))
                out["samples"].append(by_key[key])
            else:
                for cfg, v in s["configs"].items():
                    by_key[key]["configs"].setdefault(cfg, v)
    dense_ok = {(c["task"], c["haystack"], c["context"]) for c in out["cells"] if c["config"] == "dense" and c["accuracy"] > 0.5}
    kept = [s for s in out["samples"] if (s["task"], s["haystack"], s["context"]) in dense_ok]
    order = list(dict.fromkeys(p["config"] for r in runs for p in r["pooled"]))
    configs = [cfg for cfg in order if kept and all(cfg in s["configs"] for s in kept)]
    dense = [s["configs"]["dense"]["score"] for s in kept]
    out["pooled"] = []
    for cfg in configs:
        scores = [s["configs"][cfg]["score"] for s in kept]
        mean, low, high = _interval95(scores)
        d, d_low, d_high = _paired95(scores, dense)
        agree = sum(s["configs"][cfg]["score"] == s["configs"]["dense"]["score"] for s in kept) / max(1, len(kept))
        out["pooled"].append({"config": cfg, "accuracy": mean, "low": low, "high": high, "n": len(kept), "agreement": agree,
                              "minus_dense": d, "minus_dense_low": d_low, "minus_dense_high": d_high})
    return out


def budget_families(lb):
    """index -> budget -> pooled row, for the indices the run measured at three budgets or more."""
    fam = defaultdict(dict)
    for p in lb["pooled"]:
        name, budget, tiered = _index_of(p["config"])
        if name != "dense" and not tiered:
            fam[name][budget] = p
    return {name: by for name, by in fam.items() if len(by) >= 3}


def budget_table(add, lb):
    """Accuracy against budget: pooled accuracy and paired difference from dense per index and
    budget, and the smallest budget at which each index is within 2 points of dense."""
    fam = budget_families(lb)
    if not fam:
        return
    budgets = sorted({b for by in fam.values() for b in by})
    dense = next((p for p in lb["pooled"] if p["config"] == "dense"), None)
    said = f"{dense['n']} samples; dense {dense['accuracy']:.3f}" if dense else "no dense run"
    add(f"Accuracy against budget (pooled where dense answers, {said}): accuracy, and in brackets the paired difference "
        "from dense.")
    add("")
    add("| index | " + " | ".join(f"{100 * b:g}%" for b in budgets) + " | within 2 points of dense from |")
    add("| --- | " + " | ".join("---" for _ in budgets) + " | --- |")
    for name, by in fam.items():
        cells = [f"{by[b]['accuracy']:.2f} ({by[b]['minus_dense']:+.3f})" if b in by else "" for b in budgets]
        first = next((f"{100 * b:g}%" for b in budgets if b in by and by[b]["minus_dense"] >= -0.02), "none measured")
        add(f"| {name} | " + " | ".join(cells) + f" | {first} |")
    add("")


def fig_budget(lb, save, m, path):
    fam = budget_families(lb)
    if not fam:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    dense = next((p["accuracy"] for p in lb["pooled"] if p["config"] == "dense"), None)
    for i, (name, by) in enumerate(fam.items()):
        xs = sorted(by)
        ax.plot([100 * x for x in xs], [by[x]["accuracy"] for x in xs], marker="o", color=plt.cm.tab10(i % 10), label=name)
    if dense is not None:
        ax.axhline(dense, color="black", label="dense")
        ax.axhline(dense - 0.02, color="0.5", ls=":", label="dense - 2 points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget (% of candidate pages)")
    ax.set_ylabel("accuracy where dense answers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("kvd-longbench on SmolLM2-135M: accuracy against budget")
    save(fig, path, m)
    return True


def _index_of(config):
    """(index, budget, tiered) of a configuration name: dense, INDEX@B, tiered:INDEX@B."""
    if config == "dense":
        return "dense", 1.0, False
    tiered = config.startswith("tiered:")
    name, budget = config.removeprefix("tiered:").split("@")
    return name, float(budget), tiered


def _pooled_by_context(lb):
    """config -> context -> mean accuracy over every cell (task) of that context (prose)."""
    acc = defaultdict(lambda: defaultdict(list))
    for c in lb["cells"]:
        if c["haystack"] == "prose":
            acc[c["config"]][c["context"]].append(c["accuracy"])
    return {cfg: {ctx: sum(v) / len(v) for ctx, v in by.items()} for cfg, by in acc.items()}


def fig_longbench(lb, save, m, path):
    pooled = _pooled_by_context(lb)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    names = sorted({_index_of(c)[0] for c in pooled if not _index_of(c)[2]})
    for cfg, by in sorted(pooled.items()):
        name, budget, tiered = _index_of(cfg)
        if tiered:
            continue
        xs = sorted(by)
        style = "-" if budget >= 0.05 else "--"
        color = "black" if name == "dense" else plt.cm.tab10(names.index(name) % 10)
        ax.plot(xs, [by[x] for x in xs], style, marker="o", ms=3, color=color, label=cfg)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("accuracy, mean over the tasks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle("kvd-longbench on SmolLM2-135M: accuracy against context (solid 6.25%, dashed 1.56%)")
    save(fig, path, m)


def fig_fidelity(fid, save, m, path):
    kl = defaultdict(lambda: defaultdict(list))
    last = max(c["position"] for c in fid["fidelity"])
    for c in fid["fidelity"]:
        name, budget, tiered = _index_of(c["config"])
        if c["position"] == last and name != "dense" and not tiered:
            kl[name][budget].append(c["kl"])
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for i, (name, by) in enumerate(sorted(kl.items())):
        xs = sorted(by)
        ax.plot([100 * x for x in xs], [max(1e-6, sum(by[x]) / len(by[x])) for x in xs], marker="o", color=plt.cm.tab10(i % 10), label=name)
    ax.axhline(0.02, color="0.5", ls=":", label="goal 0.02 nats")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("budget (% of candidate pages)")
    ax.set_ylabel(f"mean KL(dense || sparse), nats, at position {last}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Teacher-forced fidelity on SmolLM2-135M (documents pooled)")
    save(fig, path, m)


def section(add, cmds, lb, fid, lb_cmd, fid_cmd):
    """The results.md section: the pooled table, per-context accuracy, and fidelity."""
    add("## The real model: long-context tasks and fidelity (SmolLM2-135M)")
    add("")
    add("`kvd-longbench` ([longbench.md](longbench.md)): RULER-style tasks on real prose, each sample prefilled once and its K/V "
        "given to every configuration; and teacher-forced KL against dense on long documents. Every index and cache table "
        "on real SmolLM2 traces (mass recall, bytes, selection time, hit rates over W, knapsack, warm-up, decay) is in "
        "[real-traces.md](real-traces.md).")
    add("")
    add("![accuracy against context](results/longbench.png)")
    add("")
    pooled = {p["config"]: p for p in lb["pooled"]}
    n = next(iter(pooled.values()))["n"] if pooled else 0
    add(f"Pooled over the cells (task, context) where dense scores above 0.5 ({n} samples):")
    add("")
    add("| configuration | accuracy [95% interval] | minus dense, paired [95% interval] | agreement with dense |")
    add("| --- | --- | --- | --- |")
    for cfg, p in pooled.items():
        paired = f" [{p['minus_dense_low']:+.3f}, {p['minus_dense_high']:+.3f}]" if "minus_dense_low" in p else ""
        add(f"| {cfg} | {p['accuracy']:.3f} [{p['low']:.3f}, {p['high']:.3f}] | {p['minus_dense']:+.3f}{paired} | {p['agreement']:.3f} |")
    add("")
    by_ctx = _pooled_by_context(lb)
    ctxs = sorted({c for by in by_ctx.values() for c in by})
    n_by_ctx = defaultdict(set)
    for c in lb["cells"]:
        n_by_ctx[c["context"]].add(c["n"])
    if budget_families(lb):
        add("![accuracy against budget](results/longbench_budget.png)")
        add("")
        budget_table(add, lb)
    add("Accuracy per context, mean over the tasks (N per task and context: "
        + ", ".join(f"{ctx}: {'/'.join(str(n) for n in sorted(ns))}" for ctx, ns in sorted(n_by_ctx.items())) + "):")
    add("")
    add("| configuration | " + " | ".join(f"{c}" for c in ctxs) + " |")
    add("| --- | " + " | ".join("---" for _ in ctxs) + " |")
    for cfg in pooled:
        add(f"| {cfg} | " + " | ".join(f"{by_ctx[cfg].get(c, float('nan')):.3f}" for c in ctxs) + " |")
    add("")
    add("Checks on every sample (the tool fails otherwise): tiered Hierarchical decodes sparse Hierarchical's tokens; "
        f"failures in this run: {lb.get('failures', 0)}.")
    cmds([lb_cmd])
    if fid:
        add("![KL against budget](results/fidelity.png)")
        add("")
        add("| document | position | configuration | KL (nats) | top-1 | perplexity | dense perplexity |")
        add("| --- | --- | --- | --- | --- | --- | --- |")
        for c in fid["fidelity"]:
            if c["config"] != "dense":
                add(f"| {c['document']} | {c['position']} | {c['config']} | {c['kl']:.4f} | {c['top1']:.3f} | {c['ppl']:.3f} | "
                    f"{c['dense_ppl']:.3f} |")
        cmds([fid_cmd])
