"""Markdown tables from the engine GPU rows (the layout of RESULTS.md)."""
from __future__ import annotations


def _cell(row: dict | None, key: str, fmt: str) -> str:
    return format(row[key], fmt) if row else "-"


def decode_tables(rows: list[dict]) -> list[str]:
    out = []
    bw = next((r["bytes_per_s"] for r in rows if r["bench"] == "copy_bandwidth"), None)
    if bw:
        out.append(f"Measured device-to-device copy bandwidth (read + write bytes, median of 20 copies of 2 GiB): "
                   f"**{bw / 1e12:.2f} TB/s**.\n")
    roof = [r for r in rows if r["bench"] == "roofline"]
    if roof:
        out += [("| shape | batch | context | CUDA graphs | step ms | tokens/s | bytes/token (GB) | roofline tokens/s "
                "| fraction of roofline |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| {r['shape']} | {r['batch']} | {r['ctx']} | {'on' if r['graphs'] else 'off'} | {r['step_ms']:.2f} | "
                f"{r['tok_s']:.1f} | {r['bytes_per_token'] / 1e9:.2f} | {r['roofline_tok_s']:.1f} | "
                f"**{r['frac_roofline']:.1%}** |" for r in roof]
        out.append("")
    hf = [r for r in rows if r["bench"] == "vs_hf"]
    if hf:
        out += [("| model | batch | prompt | new tokens | ours decode tok/s | HF default tok/s | ours / HF default | "
                "HF compiled tok/s | ours / HF compiled | HF compile s |"),
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in hf:
            eager = f"{r['hf_tok_s']:.1f} | **{r['speedup']:.2f}x**" if "hf_tok_s" in r else "- | -"
            comp = (f"{r['hf_compiled_tok_s']:.1f} | **{r['speedup_compiled']:.2f}x** | {r['hf_compile_s']:.1f}"
                    if "hf_compiled_tok_s" in r else f"{r.get('hf_compiled_error', 'not run')} | - | -")
            runs = f" ({min(r['ours_runs']):.1f}-{max(r['ours_runs']):.1f})" if len(r["ours_runs"]) > 1 else ""
            out.append(f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['new']} | {r['ours_tok_s']:.1f}{runs} | "
                       f"{eager} | {comp} |")
        out.append("")
    return out


def msa_tables(rows: list[dict]) -> list[str]:
    out = []
    pre = [r for r in rows if r["bench"] == "prefill"]
    if pre:
        by = {(r["attention"], r["ctx"]): r for r in pre}
        out += [("| context | layers | MSA chunk | dense chunk | MSA TTFT s | dense TTFT s | dense / MSA "
                 "| MSA peak GiB | dense peak GiB |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ctx in sorted({r["ctx"] for r in pre}):
            m, d = by.get(("msa", ctx)), by.get(("dense", ctx))
            ratio = f"**{d['ttft_s'] / m['ttft_s']:.1f}x**" if m and d else "-"
            out.append(f"| {ctx} | {(m or d)['layers']} | {_cell(m, 'chunk', 'd')} | {_cell(d, 'chunk', 'd')} | "
                       f"{_cell(m, 'ttft_s', '.3f')} | {_cell(d, 'ttft_s', '.3f')} | {ratio} | "
                       f"{_cell(m, 'peak_gib', '.1f')} | {_cell(d, 'peak_gib', '.1f')} |")
        out.append("")
    dec = [r for r in rows if r["bench"] == "decode"]
    if dec:
        by = {(r["attention"], r["ctx"], r["batch"]): r for r in dec}
        out += [("| context | batch | MSA tok/s | dense tok/s | MSA / dense | MSA step ms | dense step ms | "
                "MSA peak GiB | dense peak GiB |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ctx, b in sorted({(r["ctx"], r["batch"]) for r in dec}):
            m, d = by.get(("msa", ctx, b)), by.get(("dense", ctx, b))
            if m and d:
                out.append(f"| {ctx} | {b} | {m['tok_s']:.0f} | {d['tok_s']:.0f} | "
                           f"**{m['tok_s'] / d['tok_s']:.1f}x** | {m['step_ms']:.2f} | {d['step_ms']:.2f} | "
                           f"{m['peak_gib']:.1f} | {d['peak_gib']:.1f} |")
        out.append("")
    return out


def msa_graph_tables(rows: list[dict]) -> list[str]:
    """Decode tokens/s per mode, MSA graphs against the eager MSA path and dense."""
    g = [r for r in rows if r["bench"] == "msa_graphs"]
    if not g:
        return []
    by = {(r["model"], r["ctx"], r["batch"], r["mode"]): r for r in g}
    out = [("| model | context | batch | msa-eager tok/s | msa-plan tok/s (graphs off) | "
           "msa-graphs tok/s | graphs / eager | dense-graphs tok/s | msa-graphs / dense |"),
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, ctx, b in sorted({(r["model"], r["ctx"], r["batch"]) for r in g}):
        t = {m: by[(model, ctx, b, m)]["tok_s"] for m in ("msa-eager", "msa-plan", "msa-graphs", "dense-graphs")
             if (model, ctx, b, m) in by}
        cells = [f"{t[m]:.0f}" if m in t else "-" for m in ("msa-eager", "msa-plan", "msa-graphs", "dense-graphs")]
        ratios = [f"**{t['msa-graphs'] / t[c]:.2f}x**" if "msa-graphs" in t and c in t else "-"
                  for c in ("msa-eager", "dense-graphs")]
        out.append(f"| {model} | {ctx} | {b} | {cells[0]} | {cells[1]} | {cells[2]} | {ratios[0]} | {cells[3]} | "
                   f"{ratios[1]} |")
    return out + [""]


def step_tables(rows: list[dict]) -> list[str]:
    """Decode step wall time, GPU replay time, device ops and the host functions' share."""
    st = [r for r in rows if r["bench"] == "step"]
    if not st:
        return []
    out = [("| engine | mode | batch | step ms | decode tok/s | GPU replay ms | device ops/step "
           "| host ms/step by function |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in st:
        host = ", ".join(f"{k.split('.')[-1]} {v:.3f}" for k, v in r["host_ms"].items() if v >= 0.005)
        out.append(f"| {r.get('label', '')} | {r['mode']} | {r['batch']} | {r['step_ms']:.3f} | {r['tok_s']:.0f} | "
                   f"{r['gpu_replay_ms']:.3f} | {r['device_ops']} | {host} |")
    return out + [""]


def markdown(rows: list[dict]) -> str:
    lines = decode_tables(rows) + msa_tables(rows) + msa_graph_tables(rows) + step_tables(rows)
    return "\n".join(lines + [f"error: {r}" for r in rows if r["bench"] == "error"])
