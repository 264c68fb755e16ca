"""Markdown tables from the JSON rows of bench_decode.py / bench_msa.py.

    python benchmarks/engine_gpu/tables.py decode.json msa.json
"""
from __future__ import annotations

import json
import sys


def decode_tables(rows: list[dict]) -> list[str]:
    out = []
    bw = next((r["bytes_per_s"] for r in rows if r["bench"] == "copy_bandwidth"), None)
    if bw:
        out.append(f"Measured device-to-device copy bandwidth (read + write bytes, median of 20 copies of 2 GiB): "
                   f"**{bw / 1e12:.2f} TB/s**.\n")
    roof = [r for r in rows if r["bench"] == "roofline"]
    if roof:
        out += ["| shape | batch | context | CUDA graphs | step ms | tokens/s | bytes/token (GB) | roofline tokens/s "
                "| fraction of roofline |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| {r['shape']} | {r['batch']} | {r['ctx']} | {'on' if r['graphs'] else 'off'} | {r['step_ms']:.2f} | "
                f"{r['tok_s']:.1f} | {r['bytes_per_token'] / 1e9:.2f} | {r['roofline_tok_s']:.1f} | "
                f"**{r['frac_roofline']:.1%}** |" for r in roof]
        out.append("")
    hf = [r for r in rows if r["bench"] == "vs_hf"]
    if hf:
        out += ["| model | batch | prompt | new tokens | ours decode tok/s | HF decode tok/s | speed-up |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['new']} | {r['ours_tok_s']:.1f} | "
                f"{r['hf_tok_s']:.1f} | **{r['speedup']:.2f}x** |" for r in hf]
        out.append("")
    return out


def msa_tables(rows: list[dict]) -> list[str]:
    out = []
    pre = [r for r in rows if r["bench"] == "prefill"]
    if pre:
        by = {(r["attention"], r["ctx"]): r for r in pre}
        out += ["| context | layers | chunk | MSA TTFT s | dense TTFT s | dense / MSA | MSA peak GiB | dense peak GiB |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ctx in sorted({r["ctx"] for r in pre}):
            m, d = by.get(("msa", ctx)), by.get(("dense", ctx))
            ratio = f"**{d['ttft_s'] / m['ttft_s']:.1f}x**" if m and d else "-"
            out.append(f"| {ctx} | {(m or d)['layers']} | {(m or d)['chunk']} | {m['ttft_s']:.3f} | "
                       f"{d['ttft_s']:.3f} | {ratio} | {m['peak_gib']:.1f} | {d['peak_gib']:.1f} |" if m and d else
                       f"| {ctx} | {(m or d)['layers']} | {(m or d)['chunk']} | "
                       f"{m['ttft_s'] if m else '-'} | {d['ttft_s'] if d else 'not run'} | - | "
                       f"{m['peak_gib'] if m else '-'} | - |")
        out.append("")
    dec = [r for r in rows if r["bench"] == "decode"]
    if dec:
        by = {(r["attention"], r["ctx"], r["batch"]): r for r in dec}
        out += ["| context | batch | MSA tok/s | dense tok/s | MSA / dense | MSA step ms | dense step ms | "
                "MSA peak GiB | dense peak GiB |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ctx, b in sorted({(r["ctx"], r["batch"]) for r in dec}):
            m, d = by.get(("msa", ctx, b)), by.get(("dense", ctx, b))
            if m and d:
                out.append(f"| {ctx} | {b} | {m['tok_s']:.0f} | {d['tok_s']:.0f} | **{m['tok_s'] / d['tok_s']:.1f}x** | "
                           f"{m['step_ms']:.2f} | {d['step_ms']:.2f} | {m['peak_gib']:.1f} | {d['peak_gib']:.1f} |")
        out.append("")
    return out


def main() -> None:
    lines = []
    for path in sys.argv[1:]:
        rows = json.load(open(path))
        lines += decode_tables(rows) + msa_tables(rows)
        lines += [f"error: {r}" for r in rows if r["bench"] == "error"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
