"""docs/results.md's cold-codec section: scripts/bench-cold-codec.py's JSON (SmolLM2 at 8K,
cold pages in the KV dtype, INT8 and INT4) as three tables and one plot: SSD bytes per token as
stored and from the device, DRAM + SSD against DRAM only, and the longest context a DRAM budget
holds. report.py calls section() and fig() when given --cold-codec-json; run on its own it
writes the plot and prints the section:

    python3 scripts/report_cold_codec.py FILE.json [--png docs/results/cold_codec.png]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CODECS = ("none", "int8", "int4")


def _ssd(j):
    r = j.get("tier_reads", {}).get("ssd", {})
    return r.get("kib_per_token", 0.0), r.get("device_kib_per_token", 0.0)


def _ios(j):
    return j.get("tier_reads", {}).get("ssd", {}).get("device_reads_per_token", 0.0)


def fig(res, save, m, path):
    """Three panels: SSD KiB/token (stored, device), decode tokens/s, longest context in DRAM."""
    f, ax = plt.subplots(1, 3, figsize=(14, 4.2))
    b = res["bytes"]
    names = [n for n in ("none-unpacked", "none", "int8", "int4") if n in b]
    x = range(len(names))
    ax[0].bar([i - 0.2 for i in x], [_ssd(b[n])[0] for n in names], 0.4, label="as stored (logical)")
    ax[0].bar([i + 0.2 for i in x], [_ssd(b[n])[1] for n in names], 0.4, label="read from the device")
    ax[0].set_xticks(list(x), [n.replace("none", "KV dtype") for n in names], fontsize=8)
    ax[0].set_ylabel("SSD KiB per decoded token")
    ax[0].set_title(f"Misses served by the SSD ({res['tokens']} tokens)", fontsize=9)
    ax[0].legend(fontsize=7)
    s = res["speed"]
    x = range(len(CODECS))
    ax[1].bar([i - 0.2 for i in x], [s[c]["dram"]["decode_tokens_per_s"] for c in CODECS], 0.4, label="DRAM only")
    ax[1].bar([i + 0.2 for i in x], [s[c]["tiered"]["decode_tokens_per_s"] for c in CODECS], 0.4, label="DRAM cache + SSD")
    ax[1].set_xticks(list(x), ["KV dtype" if c == "none" else c for c in CODECS], fontsize=8)
    ax[1].set_ylabel("decode tokens/s")
    ax[1].set_title("Decoding: DRAM only against DRAM cache + SSD", fontsize=9)
    ax[1].legend(fontsize=7, loc="lower center")
    c = res["capacity"]
    if c:
        ax[2].bar(list(x), [c["longest_context"][k] for k in CODECS])
        ax[2].set_xticks(list(x), ["KV dtype" if k == "none" else k for k in CODECS], fontsize=8)
        ax[2].set_ylabel("tokens")
        ax[2].set_title(f"Context whose pages a {c['host_bytes'] >> 20} MiB DRAM tier holds", fontsize=9)
    f.suptitle("Cold pages coded: SmolLM2-135M, sparse Hierarchical", fontsize=10)
    save(f, path, m)


def section(add, cmds, res, cmd_line):
    add("## Cold pages coded (INT8, INT4) on the real model")
    add("")
    add("SmolLM2-135M reading make demo's needle document, sparse Hierarchical at "
        f"{100 * res['budget']:.2f}%, {res['steps']} decoded tokens, {res['threads']} threads; cold pages in the KV dtype "
        "(f16), INT8 or INT4 ([codecs.md](codecs.md)). Every run has the same index (`--tune off`), so by Decision 2 the tiered "
        "runs decode DRAM-only's tokens: the script checks it.")
    add("")
    add("![cold codecs](results/cold_codec.png)")
    add("")
    b = res["bytes"]
    if b:
        nl, nd = _ssd(b["none"])
        add(f"SSD reads with a small DRAM cache (no room for a lookahead window: most selected pages are misses), {res['tokens']} tokens:")
        add("")
        add("| cold pages | SSD KiB/token as stored | of the KV dtype | SSD KiB/token from the device | of the KV dtype | device bytes per stored byte | SSD reads/token | of the KV dtype | ids as DRAM only |")
        add("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in ("none-unpacked", "none", "int8", "int4"):
            if name not in b:
                continue
            j = b[name]
            lo, de = _ssd(j)
            codec = name.split("-")[0]
            same = j["ids"] != "" and j["ids"] == res["speed"][codec]["dram"]["ids"]
            label = "KV dtype, one page per 4 KiB block (before packing)" if name == "none-unpacked" else (
                "KV dtype (f16), packed" if name == "none" else f"{name}, packed")
            add(f"| {label} | {lo:.1f} | {lo / nl:.3f}x | {de:.1f} | {de / nd:.3f}x | {de / lo:.2f} | {_ios(j):.0f} | "
                f"{_ios(j) / _ios(b['none']):.3f}x | {'yes' if same else 'NO'} |")
        add("")
    s = res["speed"]
    if s and all("tiered" in v for v in s.values()):
        add("DRAM only against a DRAM cache with a lookahead window + SSD, decode tokens/s side by side:")
        add("")
        add("| cold pages | DRAM only | DRAM cache + SSD | DRAM + SSD / DRAM only (time) | hit rate | SSD KiB/token from the device | ids as DRAM only |")
        add("| --- | --- | --- | --- | --- | --- | --- |")
        for codec in CODECS:
            d, t = s[codec]["dram"], s[codec]["tiered"]
            same = t["ids"] != "" and t["ids"] == d["ids"]
            add(f"| {codec} | {d['decode_tokens_per_s']:.1f} | {t['decode_tokens_per_s']:.1f} | "
                f"{d['decode_tokens_per_s'] / t['decode_tokens_per_s']:.2f}x | {t['attention']['hit_rate']:.3f} | {_ssd(t)[1]:.1f} | "
                f"{'yes' if same else 'NO'} |")
        add("")
    c = res["capacity"]
    if c:
        add(f"A fixed DRAM budget for pages: a {c['host_bytes'] >> 20} MiB DRAM tier (coded pages in 64-byte slots) below a "
            f"{c['fast_bytes'] >> 20} MiB cache, at {c['context']} tokens, where no codec fits every page in it. The pages the tier "
            "holds (its own count) as tokens of context: the longest context whose pages that DRAM holds.")
        add("")
        add(f"| cold pages | DRAM bytes per token | pages held | longest context | of the KV dtype | SSD KiB/token from the device | decode tokens/s |")
        add("| --- | --- | --- | --- | --- | --- | --- |")
        for codec in CODECS:
            j = c["runs"][codec]
            add(f"| {codec} | {c['host_bytes_per_token'][codec]:.0f} | {j.get('host_pages', 0)} | {c['longest_context'][codec]} | "
                f"{c['longest_context'][codec] / c['longest_context']['none']:.2f}x | {_ssd(j)[1]:.1f} | {j['decode_tokens_per_s']:.1f} |")
        add("")
    cmds([cmd_line])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--png", default="")
    ap.add_argument("--command", default="scripts/bench-cold-codec.py --json cold_codec.json")
    a = ap.parse_args()
    with open(a.json) as f:
        res = json.load(f)
    lines = []

    def cmds(lst):
        lines.extend(["Command:", "", "```sh", *lst, "```", ""])

    section(lines.append, cmds, res, a.command)
    if a.png:
        def save(f, path, m):
            f.tight_layout()
            f.savefig(path, dpi=110)
            plt.close(f)
        fig(res, save, None, a.png)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
