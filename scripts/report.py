#!/usr/bin/env python3
"""make report: runs kvdrive's benchmarks and kvd-eval with JSON output, then writes
docs/results.md and the PNG plots beside it (docs/results/), each with the command that made it
and the machine it ran on. Measurements are made in this run; the published KVDrive figures
(../shared/reference/PEERS.md) are put beside them where both exist.

    python3 scripts/report.py [--build build] [--out docs] [--gpu-json FILE] [--cold-codec-json FILE] [--quick]

--quick shrinks every run (for trying the script, not for the results). With --gpu-json (or a
build-gpu/gpu-check.json from scripts/gpu-check.sh, else docs/results/gpu/gpu-check.json, the last GPU
run kept), the GPU figures get their own section.
Needs matplotlib (Debian python3-matplotlib: `bash scripts/bootstrap --report`).
"""
import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report_real_model as real_model  # noqa: E402
import report_cold_codec as cold_codec  # noqa: E402


# ---- running ----------------------------------------------------------------------------------

class Runner:
    """Runs commands, keeps each one's command line and wall time for the report."""

    def __init__(self, build: Path, work: Path):
        self.build, self.work = build, work
        self.log = []

    def run(self, args, label):
        shown = " ".join(shlex.quote(str(a)) for a in args).replace(str(self.build) + "/", "build/").replace(str(self.work) + "/", "")
        print(f"report: {label}: {shown}", flush=True)
        t0 = time.time()
        done = subprocess.run([str(a) for a in args], cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        secs = time.time() - t0
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:])
            raise SystemExit(f"report: {label} failed with exit status {done.returncode}")
        self.log.append({"label": label, "command": shown, "seconds": secs})
        return shown

    def json(self, args, out, label):
        cmd = self.run(list(args) + ["--json", out], label)
        return json.loads((self.work / out).read_text()), cmd


# ---- the machine ------------------------------------------------------------------------------

def machine(build: Path):
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 2**20
    except OSError:
        pass
    disk = "unknown disk"
    try:
        out = subprocess.run(["df", "-hT", str(build)], stdout=subprocess.PIPE, text=True).stdout.splitlines()[-1].split()
        disk = f"{out[0]} ({out[1]}, {out[2]})"
    except (OSError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1), "disk": disk, "kernel": platform.release()}


def machine_line(m):
    return (f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; disk {m['disk']}; "
            f"memcpy {m['memcpy_gb_s']:.1f} GB/s (one thread), disk {m['disk_random_mb_s']:.0f} MB/s random 4 KiB "
            f"(queue depth 64), {m['disk_seq_mb_s']:.0f} MB/s sequential (O_DIRECT 1 MiB), measured in this run")


# ---- figures ----------------------------------------------------------------------------------

def save(fig, path: Path, m):
    fig.text(0.01, 0.005, machine_line(m), fontsize=6, color="0.35", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_index(idx, m, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    markers = {0.015625: "o", 0.0625: "s"}
    for budget, rows in idx.items():
        for r in rows:
            if r["index"] in ("dense",):
                continue
            for ax, x in ((axes[0], r["index_bytes_per_token"]), (axes[1], r["select_us"])):
                ax.scatter(x, r["mass_recall"], marker=markers[budget], s=36,
                           color=plt.cm.tab10(sorted({q["index"] for q in rows}).index(r["index"]) % 10))
                ax.annotate(r["index"], (x, r["mass_recall"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for ax, label in ((axes[0], "index bytes per token (log)"), (axes[1], "selection time per stream and step, us (log)")):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("attention-mass recall (mean over query heads)")
        ax.grid(alpha=0.3)
    for b, mk in markers.items():
        axes[0].scatter([], [], marker=mk, color="0.4", label=f"budget {100 * b:.2f}%")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Index quality against cost (synthetic `default` trace)")
    save(fig, path, m)


def fig_cache(sweep, knap, m, path, title="Fast-tier cache: hierarchical index's selections replayed per eviction policy"):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    policies = ["lookahead", "lru", "lfu"]
    ws = sorted(sweep)
    for p in policies:
        axes[0].plot(ws, [sweep[w][p]["hit_rate"] for w in ws], marker="o", label=p)
        axes[1].plot(ws, [sweep[w][p]["fetched_bytes_per_step"] / 2**20 for w in ws], marker="o", label=p)
    axes[0].plot(ws, [sweep[w]["lookahead"]["belady_hit_rate"] for w in ws], "k--", label="Belady (clairvoyant), same capacity")
    for key, style in (("last-step", "v"), ("none", "x")):
        row = sweep[ws[0]].get(key)
        if row:
            axes[0].scatter([int(row["window"])], [row["hit_rate"]], marker=style, color="0.3", label=f"{key} (W={row['window']})")
    if knap:
        axes[0].scatter([3], [knap["hit_rate"]], marker="*", s=160, color="crimson", zorder=5,
                        label=f"knapsack windows at W=3's bytes ({100 * knap['hit_rate']:.1f}%)")
    axes[0].axhline(0.80, color="0.6", lw=0.8, ls=":")
    axes[0].text(ws[-1], 0.805, "KVDrive paper: ~80% hits", fontsize=7, ha="right", color="0.4")
    axes[0].set_ylabel("hit rate of selected pages")
    axes[1].set_ylabel("MiB fetched per decode step (all evaluated streams)")
    for ax in axes:
        ax.set_xlabel("window W (steps of critical pages kept)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    save(fig, path, m)


def fig_tiers(tier, m, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    r = tier["random_4k_mb_per_s"]
    names = ["SsdTier", "SsdTier\n(registered)", "SsdTier\nqueue depth 1"]
    vals = [r["ssd"] / r["raw"], r["ssd_registered"] / r["raw"], r["ssd_qd1"] / r["raw"]]
    seq = tier["sequential_mb_per_s"]
    names.append("mmap strawman\n(whole layers)")
    vals.append(seq["mmap_layers"] / seq["raw_1mib"])
    bars = axes[0].bar(names, vals, color=["tab:blue", "tab:blue", "tab:gray", "tab:orange"])
    axes[0].bar_label(bars, fmt="%.2f", fontsize=8)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_ylabel("throughput / raw device (same pattern)")
    axes[0].set_title("Reads as a fraction of the raw device", fontsize=9)
    wl = tier["decode_workload"]
    labels = [f"{w['misses_per_layer']} pages/layer\n({'no cache' if w['miss_rate'] == 1.0 else 'Lookahead W=3 misses'})" for w in wl]
    x = range(len(wl))
    axes[1].bar([i - 0.2 for i in x], [w["ssd_ms_per_step"] for w in wl], 0.4, label="SsdTier (sparse page reads)")
    axes[1].bar([i + 0.2 for i in x], [w["mmap_ms_per_step"] for w in wl], 0.4, label="mmap strawman (whole layers, cold)")
    axes[1].set_xticks(list(x), labels, fontsize=8)
    axes[1].set_ylabel("ms per decode step (8 layers)")
    axes[1].set_title("A decode step's misses", fontsize=9)
    axes[1].legend(fontsize=8)
    fig.suptitle("Storage tiers")
    save(fig, path, m)


def fig_pipeline(pipe, m, path):
    rows = pipe["rows"]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    labels = [f"{r['context'] // 1024}K, batch {r['batch']}" for r in rows]
    x = range(len(rows))
    for off, key, name in ((-0.3, "serial_ms", "Serial"), (-0.1, "elastic_ms", "Elastic"), (0.1, "ideal_ms", "ideal (from Serial's stages)"),
                           (0.3, "dram_ms", "DRAM only")):
        ax.bar([i + off for i in x], [r[key] for r in rows], 0.2, label=name)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("ms per layer step (median)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Pipelines on DRAM cache + SSD (one layer, hierarchical 6.25%, Lookahead W=3)", fontsize=10)
    save(fig, path, m)


def fig_decode(dec, m, path):
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for mode in ("dense", "sparse", "tiered"):
        pts = sorted((c, v) for (md, c), v in dec.items() if md == mode)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (prompt tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("kvd-llama on synthetic:small (4 layers): dense, sparse (6.25%) and tiered (DRAM cache + SSD)", fontsize=9)
    save(fig, path, m)


def fig_gpu(gpu, m, path):
    b = gpu.get("bench") or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    att = b.get("attention", {}).get("vs_copy")
    gat = b.get("gather", {}).get("best_vs_contiguous")
    names, vals = [], []
    if att is not None:
        names.append("sparse attention\n/ copy kernel")
        vals.append(att)
    if gat is not None:
        names.append("page gather\n/ contiguous H2D")
        vals.append(gat)
    bars = axes[0].bar(names, vals)
    axes[0].bar_label(bars, fmt="%.2f")
    axes[0].set_title("Bandwidth ratios (goals 0.7 and 0.8)", fontsize=9)
    dec = b.get("decode", [])
    for key in ("dense_ms", "dense_split_ms", "sparse_ms", "tiered_ms"):
        if dec and all(key in d for d in dec):
            axes[1].plot([d["context"] for d in dec], [d[key] for d in dec], marker="o", label=key[:-3])
    axes[1].set_yscale("log")
    axes[1].set_xlabel("context")
    axes[1].set_ylabel("ms per layer step")
    axes[1].legend()
    fig.suptitle(f"GPU: {gpu.get('gpu', '').strip()}")
    save(fig, path, m)


# ---- main -------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--gpu-json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--longbench-json", default="", help="kvd-longbench --json files, comma-separated (default: run kvd-longbench --quick)")
    ap.add_argument("--fidelity-json", default="", help="a kvd-longbench --fidelity --json file (default: a short fidelity run)")
    ap.add_argument("--cold-codec-json", default="", help="a scripts/bench-cold-codec.py --json file: the cold-codec section")
    ap.add_argument("--real-trace", default="", help="a kvd-llama --record-trace file of a real model (docs/real-traces.md): index "
                    "quality and hit rate against W on real attention")
    a = ap.parse_args()
    build = (ROOT / a.build).resolve()
    out = (ROOT / a.out).resolve()
    figs = out / "results"
    figs.mkdir(parents=True, exist_ok=True)
    work = build / "report"
    work.mkdir(parents=True, exist_ok=True)
    r = Runner(build, work)
    q = a.quick
    t_start = time.time()
    bench, llama = build / "bench", build / "examples" / "llama3" / "kvd-llama"
    ctx = "8192" if q else "32768"
    steps = "8" if q else "32"
    streams = "4" if q else "16"
    m = machine(build)

    # Index quality at two budgets.
    idx, idx_cmds = {}, []
    for budget in (0.015625, 0.0625):
        j, cmd = r.json([bench / "kvd-eval", "--trace", "synthetic:default", "--context", ctx, "--steps", steps, "--streams", streams,
                         "--budget", str(budget)], f"kvd_eval_{budget}.json", f"indices at {100 * budget:.2f}%")
        idx[budget] = j["rows"]
        idx_cmds.append(cmd)
        m["memcpy_gb_s"] = j["memcpy_bytes_per_second"] / 1e9

    # Cache: eviction policies over W, and the knapsack plan.
    sweep, cache_cmds = {}, []
    for w in ([1, 3, 6] if q else [1, 2, 3, 4, 6, 8]):
        j, cmd = r.json([bench / "kvd-eval", "--trace", "synthetic:default", "--context", ctx, "--steps", steps, "--streams", streams,
                         "--index", "hierarchical", "--eviction", "all", "--window", str(w)], f"cache_w{w}.json", f"cache at W={w}")
        sweep[w] = {row["eviction"]: row for row in j["cache"]["rows"]}
        cache_cmds.append(cmd)
    j, knap_cmd = r.json([bench / "kvd-eval", "--trace", "synthetic:default", "--context", ctx, "--steps", steps, "--streams", streams,
                          "--index", "hierarchical", "--eviction", "lookahead", "--window", "knapsack"], "cache_knapsack.json", "knapsack")
    knap_rows = [row for row in j["cache"]["rows"] if row["window"] == "knapsack"]
    knap = knap_rows[0] if knap_rows else None
    knap_uniform = [row for row in j["cache"]["rows"] if row["window"] != "knapsack"]

    # Tiers.
    tier, tier_cmd = r.json([bench / "bench_tier", "--dir", str(work), "--pages", "16384" if q else "65536", "--rounds", "2" if q else "3",
                             "--pack-context", "4096" if q else "16384"], "bench_tier.json", "tiers")
    m["disk_random_mb_s"] = tier["random_4k_mb_per_s"]["raw"]
    m["disk_seq_mb_s"] = tier["sequential_mb_per_s"]["raw_1mib"]

    # Pipelines.
    pipe, pipe_cmd = r.json([bench / "bench_pipeline", "--dir", str(work), "--contexts", "8192" if q else "32768,131072",
                             "--batches", "1,4", "--steps", "8" if q else "16"], "bench_pipeline.json", "pipelines")

    # Decoding: kvd-llama on synthetic:small at growing contexts.
    dec, dec_cmds = {}, []
    contexts = [1024, 4096] if q else [2048, 8192, 16384]
    for c in contexts:
        for mode in ("dense", "sparse", "tiered"):
            args = [llama, "--model", "synthetic:small", "--prompt-len", str(c), "--steps", "8" if q else "16", "--mode", mode,
                    "--stats-json", f"llama_{mode}_{c}.json"]
            if mode == "tiered":
                args += ["--fast-bytes", "18000000", "--ssd-path", str(work / "kvd-report.store")]
            dec_cmds.append(r.run(args, f"decode {mode} {c}"))
            dec[(mode, c)] = json.loads((work / f"llama_{mode}_{c}.json").read_text())["decode_tokens_per_s"]

    # The real model: kvd-longbench's tasks and fidelity (given, or short runs made here).
    lb, lb_cmd, fid, fid_cmd = None, "", None, ""
    if a.longbench_json:
        lb = real_model.merge([json.loads(Path(f).read_text()) for f in a.longbench_json.split(",")])
        lb_cmd = lb.get("command", "kvd-longbench")
    elif (Path.home() / ".cache/kvdrive/models/SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        lb, lb_cmd = r.json([bench / "kvd-longbench", "--quick"], "longbench.json", "long-context tasks (quick)")
    if a.fidelity_json:
        fid = json.loads(Path(a.fidelity_json).read_text())
        fid_cmd = fid.get("command", "kvd-longbench --fidelity")
    elif lb is not None:
        fid, fid_cmd = r.json([bench / "kvd-longbench", "--fidelity", "--positions", "2048,4096", "--forced", "16"], "fidelity.json",
                              "teacher-forced fidelity (short)")

    # Real attention: index quality and the cache over W on a recorded trace of the real model.
    real = None
    if a.real_trace:
        trace = str(Path(a.real_trace).resolve())
        real = {"idx": {}, "sweep": {}, "cmds": []}
        for budget in (0.015625, 0.0625):
            j, cmd = r.json([bench / "kvd-eval", "--trace", trace, "--steps", "64", "--index", "quest,mean-key,hierarchical,oracle-mass",
                             "--budget", str(budget)], f"real_eval_{budget}.json", f"real trace: indices at {100 * budget:.2f}%")
            real["idx"][budget] = {row["index"]: row for row in j["rows"]}
            real["cmds"].append(cmd)
        for w in [1, 2, 3, 4, 6, 8]:
            j, cmd = r.json([bench / "kvd-eval", "--trace", trace, "--steps", "64", "--index", "quest,hierarchical", "--eviction", "all",
                             "--window", str(w)], f"real_cache_w{w}.json", f"real trace: cache at W={w}")
            for row in j["cache"]["rows"]:  # real["sweep"][index][W][eviction]
                real["sweep"].setdefault(row["index"], {}).setdefault(w, {})[row["eviction"]] = row
            real["cmds"].append(cmd)
        # W = 3 variations: the knapsack profiled on the trace's own prompt (its last 64 tokens, as
        # a decoder could), warm-up placement off, and Lookahead's decay.
        real["variants"] = {}
        variants = [("knapsack", ["--eviction", "lookahead,lru", "--window", "knapsack", "--calibration", "prompt:64"]),
                    ("warm-up off", ["--eviction", "lookahead,lru", "--window", "3", "--warm-up", "off"])]
        variants += [(f"decay {d}", ["--eviction", "lookahead", "--window", "3", "--decay", d]) for d in ("0", "0.5", "0.75", "1")]
        for name, extra in variants:
            j, cmd = r.json([bench / "kvd-eval", "--trace", trace, "--steps", "64", "--index", "quest,hierarchical"] + extra,
                            f"real_{name.replace(' ', '_')}.json", f"real trace: {name}")
            real["variants"][name] = {(row["index"], row["eviction"], row["window"]): row for row in j["cache"]["rows"]}
            real["cmds"].append(cmd)

    # The GPU figures: --gpu-json, else a check run from this machine's build-gpu, else the last
    # GPU run kept in the docs (a GPU machine is not always at hand).
    gpu_path = Path(a.gpu_json) if a.gpu_json else next(
        (p for p in (ROOT / "build-gpu" / "gpu-check.json", ROOT / "docs" / "results" / "gpu" / "gpu-check.json") if p.is_file()), Path())
    gpu = json.loads(gpu_path.read_text()) if gpu_path.is_file() else None

    fig_index(idx, m, figs / "index_quality.png")
    fig_cache(sweep, knap, m, figs / "cache.png")
    if real:
        fig_cache(real["sweep"]["hierarchical"], None, m, figs / "cache_real.png",
                  "Fast-tier cache on real attention (SmolLM2 trace): hierarchical index's selections per eviction policy")
    fig_tiers(tier, m, figs / "tiers.png")
    fig_pipeline(pipe, m, figs / "pipeline.png")
    fig_decode(dec, m, figs / "decoding.png")
    if gpu:
        fig_gpu(gpu, m, figs / "gpu.png")
    if lb:
        real_model.fig_longbench(lb, save, m, figs / "longbench.png")
        real_model.fig_budget(lb, save, m, figs / "longbench_budget.png")
    if fid:
        real_model.fig_fidelity(fid, save, m, figs / "fidelity.png")
    cc = json.loads(Path(a.cold_codec_json).read_text()) if a.cold_codec_json else None
    if cc:
        cold_codec.fig(cc, save, m, figs / "cold_codec.png")

    # ---- results.md ----
    L = []
    add = L.append
    add("# Results")
    add("")
    add(f"Generated by `make report` ({time.strftime('%Y-%m-%d')}, {time.time() - t_start:.0f} s{', --quick' if q else ''}); every figure "
        "below was measured in that run, on this machine:")
    add("")
    add(f"> {machine_line(m)}.")
    add("")
    add("Published KVDrive figures (`../shared/reference/PEERS.md`, beside the repository) are set beside the measured ones where both exist. "
        "They come from GPUs (L20, RTX 4090) and real models; these come from a CPU and the synthetic `default` trace "
        "([synthetic-traces.md](synthetic-traces.md)), so compare their shape, not their scale.")
    add("")

    def cmds(lst):
        add("")
        add("Commands (run in `build/report`, where their JSON lands):")
        add("")
        add("```sh")
        L.extend(lst)
        add("```")
        add("")

    add("## Index quality against cost")
    add("")
    add("![index quality](results/index_quality.png)")
    add("")
    add("| index | mass recall 1.56% | mass recall 6.25% | bytes/token | select us (6.25%) |")
    add("| --- | --- | --- | --- | --- |")
    by = {b: {row["index"]: row for row in rows} for b, rows in idx.items()}
    for name in by[0.0625]:
        r1, r6 = by[0.015625].get(name), by[0.0625][name]
        add(f"| {name} | {r1['mass_recall']:.3f} | {r6['mass_recall']:.3f} | {r6['index_bytes_per_token']:.1f} | {r6['select_us']:.0f} |" if r1 else
            f"| {name} | - | {r6['mass_recall']:.3f} | {r6['index_bytes_per_token']:.1f} | {r6['select_us']:.0f} |")
    h, qu = by[0.0625].get("hierarchical"), by[0.0625].get("quest")
    if h and qu:
        add("")
        add(f"Hierarchical against Quest at 6.25%: mass recall {h['mass_recall'] - qu['mass_recall']:+.4f}, index bytes "
            f"{h['index_bytes_per_token'] / qu['index_bytes_per_token']:.2f}x, selection time {h['select_us'] / qu['select_us']:.2f}x. "
            "Published: the same precision as Quest with 0.5x the index and 2x faster lookup (0.5x the time).")
    cmds(idx_cmds)

    if lb:
        real_model.section(add, cmds, lb, fid, lb_cmd, fid_cmd)
    if cc:
        cold_codec.section(add, cmds, cc, f"scripts/bench-cold-codec.py --tokens {cc['tokens']} --steps {cc['steps']} --json cold_codec.json")

    add("## Fast-tier cache")
    add("")
    add("![cache](results/cache.png)")
    add("")
    add("| W | lookahead | lru | lfu | Belady | MiB fetched per step (lookahead) |")
    add("| --- | --- | --- | --- | --- | --- |")
    for w in sorted(sweep):
        s = sweep[w]
        add(f"| {w} | {100 * s['lookahead']['hit_rate']:.1f}% | {100 * s['lru']['hit_rate']:.1f}% | {100 * s['lfu']['hit_rate']:.1f}% | "
            f"{100 * s['lookahead']['belady_hit_rate']:.1f}% | {s['lookahead']['fetched_bytes_per_step'] / 2**20:.2f} |")
    w3 = sweep.get(3)
    if w3:
        add("")
        add(f"At W = 3: Lookahead hits {100 * w3['lookahead']['hit_rate']:.1f}% of the selected pages, "
            f"{100 * (w3['lookahead']['hit_rate'] - w3['lru']['hit_rate']):+.1f} points over LRU. Published: ~80% hits, "
            "0.9-3.9 points over LRU.")
    if knap and knap_uniform:
        u = knap_uniform[0]
        add(f"The knapsack plan (one W per stream, within the bytes of W = 3): {100 * knap['hit_rate']:.1f}% hits and "
            f"{knap['fetched_bytes_per_step'] / 2**20:.2f} MiB per step, against {100 * u['hit_rate']:.1f}% and "
            f"{u['fetched_bytes_per_step'] / 2**20:.2f} MiB uniform.")
    cmds(cache_cmds + [knap_cmd])

    if real:
        add("## On real attention (a SmolLM2-135M trace)")
        add("")
        add("The same measures on a trace the real model recorded (`kvd-llama --record-trace`; [real-traces.md](real-traces.md) says how, "
            "and gives every table at more length).")
        add("")
        add("| index | mass recall 1.56% | mass recall 6.25% | output error 6.25% | bytes/token | select us (6.25%) |")
        add("| --- | --- | --- | --- | --- | --- |")
        for name, r6 in real["idx"][0.0625].items():
            r1 = real["idx"][0.015625].get(name)
            low = f"{r1['mass_recall']:.4f}" if r1 else "-"
            add(f"| {name} | {low} | {r6['mass_recall']:.4f} | {r6['out_err']:.3f} | {r6['index_bytes_per_token']:.2f} | "
                f"{r6['select_us']:.1f} |")
        for b in (0.015625, 0.0625):
            h, qu = real["idx"][b].get("hierarchical"), real["idx"][b].get("quest")
            if h and qu:
                add("")
                add(f"Hierarchical against Quest at {100 * b:.2f}%: mass recall {h['mass_recall'] - qu['mass_recall']:+.4f}, index bytes "
                    f"{h['index_bytes_per_token'] / qu['index_bytes_per_token']:.2f}x, selection time {h['select_us'] / qu['select_us']:.2f}x "
                    "(goal: at least Quest's recall, at most 0.6x its bytes and 0.5x its time).")
        add("")
        add("![cache on real attention](results/cache_real.png)")
        add("")
        add("| index | W | lookahead | lru | lfu | Belady | lookahead / Belady | lookahead − lru (points) |")
        add("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for ix in ("quest", "hierarchical"):
            for w, row in sorted(real["sweep"].get(ix, {}).items()):
                la = row["lookahead"]
                add(f"| {ix} | {w} | {100 * la['hit_rate']:.2f}% | {100 * row['lru']['hit_rate']:.2f}% | {100 * row['lfu']['hit_rate']:.2f}% | "
                    f"{100 * la['belady_hit_rate']:.2f}% | {la['hit_rate'] / la['belady_hit_rate']:.3f} | "
                    f"{100 * (la['hit_rate'] - row['lru']['hit_rate']):+.2f} |")
        add("")
        add("Goals at W = 3: at least 80% of the selected pages, at least LRU + 1 point, at least 0.9 of Belady at equal bytes.")
        v = real["variants"]
        add("")
        add("At W = 3: the knapsack (one W per stream in the bytes of W = 3, profiled on the trace's own prompt, its last 64 "
            "tokens), warm-up placement off, and Lookahead's decay (0.25 is the default; LRU ignores it):")
        add("")
        add("| index | knapsack / uniform bytes, lookahead (lru) | warm-up off: lookahead, lru | decay 0 | 0.25 | 0.5 | 0.75 | 1 |")
        add("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for ix in ("quest", "hierarchical"):
            ks = v["knapsack"]
            ratio = {e: ks[(ix, e, "knapsack")]["fetched_bytes_per_step"] / ks[(ix, e, "3")]["fetched_bytes_per_step"] for e in ("lookahead", "lru")}
            off = v["warm-up off"]
            decays = [v[f"decay {d}"][(ix, "lookahead", "3")]["hit_rate"] for d in ("0",)]
            decays.append(real["sweep"][ix][3]["lookahead"]["hit_rate"])
            decays += [v[f"decay {d}"][(ix, "lookahead", "3")]["hit_rate"] for d in ("0.5", "0.75", "1")]
            add(f"| {ix} | {ratio['lookahead']:.3f}x ({ratio['lru']:.3f}x) | {100 * off[(ix, 'lookahead', '3')]['hit_rate']:.2f}%, "
                f"{100 * off[(ix, 'lru', '3')]['hit_rate']:.2f}% | " + " | ".join(f"{100 * h:.2f}%" for h in decays) + " |")
        add("")
        add("Goal: the knapsack fetches fewer bytes than uniform W = 3. [real-traces.md](real-traces.md) also profiles it on a "
            "second, held-out trace.")
        cmds(real["cmds"])

    add("## Storage tiers")
    add("")
    add("![tiers](results/tiers.png)")
    add("")
    rr = tier["random_4k_mb_per_s"]
    add(f"Random 4 KiB reads ({tier['io']}, {'O_DIRECT' if tier['direct_io'] else 'buffered'}): raw device {rr['raw']:.0f} MB/s, "
        f"SsdTier {rr['ssd']:.0f} MB/s = {rr['ssd'] / rr['raw']:.2f} of the device. ")
    wl = tier["decode_workload"]
    add("A decode step's misses: " + "; ".join(
        f"{w['misses_per_layer']} pages per layer, SsdTier {w['ssd_ms_per_step']:.1f} ms, mmap strawman {w['mmap_ms_per_step']:.1f} ms "
        f"({w['mmap_ms_per_step'] / w['ssd_ms_per_step']:.1f}x slower)" for w in wl) + ". Published: the strawman nearly stalls.")
    rem = tier.get("remote")
    if rem:
        add("")
        line = (f"Remote tier (RedisTier on a private redis-server over loopback, {rem['value_bytes']}-byte values, "
                f"{rem['in_flight']} commands in flight, one connection): reads {rem['read_pages_per_s']:.0f} pages/s "
                f"({rem['read_pages_per_s'] * 4096 / 1e6:.0f} MB/s of pages), writes {rem['write_pages_per_s']:.0f} pages/s")
        if rem.get("redis_benchmark_get_per_s"):
            line += (f"; redis-benchmark in the same run: GET {rem['redis_benchmark_get_per_s']:.0f}/s, SET "
                     f"{rem['redis_benchmark_set_per_s']:.0f}/s, so RedisTier reads at "
                     f"{rem['read_pages_per_s'] / rem['redis_benchmark_get_per_s']:.2f} of GET and writes at "
                     f"{rem['write_pages_per_s'] / rem['redis_benchmark_set_per_s']:.2f} of SET")
        add(line + " ([remote.md](remote.md)).")
    cmds([tier_cmd])

    add("## Pipelines")
    add("")
    add("![pipeline](results/pipeline.png)")
    add("")
    add("| context | batch | Serial ms | Elastic ms | ideal ms | DRAM only ms | Serial / Elastic | Elastic / DRAM |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in pipe["rows"]:
        add(f"| {row['context']} | {row['batch']} | {row['serial_ms']:.2f} | {row['elastic_ms']:.2f} | {row['ideal_ms']:.2f} | "
            f"{row['dram_ms']:.2f} | {row['serial_ms'] / row['elastic_ms']:.2f}x | {row['elastic_ms'] / row['dram_ms']:.2f} |")
    add("")
    add("Published: DRAM + SSD about 40% below DRAM-only throughput (Elastic / DRAM about 1.67 in step time); "
        "selection + fetching about 50% of a step in the baselines. On this machine selection and compute share the CPU cores.")
    cmds([pipe_cmd])

    add("## Decoding")
    add("")
    add("![decoding](results/decoding.png)")
    add("")
    add("| context | " + " | ".join(f"{md} tokens/s" for md in ("dense", "sparse", "tiered")) + " |")
    add("| --- | --- | --- | --- |")
    for c in contexts:
        add(f"| {c} | " + " | ".join(f"{dec[(md, c)]:.1f}" for md in ("dense", "sparse", "tiered")) + " |")
    cmds(dec_cmds)

    add("## GPU")
    add("")
    if gpu:
        add("![gpu](results/gpu.png)")
        add("")
        add(f"From `{gpu_path.relative_to(ROOT) if gpu_path.is_relative_to(ROOT) else gpu_path}` (scripts/gpu-check.sh), "
            f"tests passed: {gpu.get('passed')}.")
        b = gpu.get("bench") or {}
        add("")
        add("| measure | compared with | measured | goal |")
        add("| --- | --- | --- | --- |")
        if "attention" in b:
            add(f"| sparse attention bandwidth | copy kernel | {b['attention']['vs_copy']:.2f} | 0.7 |")
        if "gather" in b:
            add(f"| page gather H2D | contiguous cudaMemcpyAsync | {b['gather']['best_vs_contiguous']:.2f} | 0.8 |")
        for row in b.get("pipeline") or []:
            add(f"| KvManager step, {row['context'] // 1024}K, batch {row['batch']} | Elastic against Serial | "
                f"{row['serial_over_elastic']:.2f}x | report |")
    else:
        add("No GPU results: run `scripts/gpu-build.sh`, then `gpu-check.sh` on a GPU machine, and pass its JSON with "
            "`make report GPU_JSON=path` (or leave it at `build-gpu/gpu-check.json`). No GPU has been available so far "
            "([cuda.md](cuda.md)).")
    add("")
    add("## Run times")
    add("")
    add("| run | seconds |")
    add("| --- | --- |")
    for e in r.log:
        add(f"| {e['label']} | {e['seconds']:.1f} |")
    (out / "results.md").write_text("\n".join(L) + "\n")
    print(f"report: wrote {out / 'results.md'} and {len(list(figs.glob('*.png')))} plots in {figs} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
