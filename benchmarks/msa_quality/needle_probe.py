"""Needle-block diagnostic (CPU, no generation): per MSA layer and KV group, is the needle's block
selected at the answer positions, and which heads read the needle (dense attention mass on its
blocks)? Compares indexers (adapter folders, `init` = the untrained mean-of-heads start, `oracle` =
the top blocks by the group's dense mass: the bound for any indexer) on
the same cached activations.

Each probed sample is a needle prompt (`make_needles.py`) followed by the DENSE model's own answer
(`needle_eval.py` outputs) cut right after the gold value; only samples where dense answered right
are probed. Without `--outputs`, the gold value itself follows the prompt (prompts that end with
the answer prefix). Answer positions = the positions that predict the value's tokens.

    python benchmarks/msa_quality/needle_probe.py --needles needles.jsonl \
      --outputs benchmarks/msa_quality/raw/outputs.jsonl --length 4096 --n 12 \
      --indexers init engine/adapters/smollm2-135m [--block-size 64 --topk 8] [--per-layer] [--json out.json]

A layer an adapter keeps dense counts as selecting everything. Summary per indexer: `hit` =
fraction of (sample, answer position, layer, group) where the needle's blocks are selected; `w-hit` = the same weighted by the group's largest head mass on the
needle (retrieval heads count most); `kept` = share of the heads' total needle mass whose group
selected the needle; `recall` = mean dense mass inside the selection (all heads).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def probe_inputs(tok, rows: list[dict], outputs: dict[str, str], n: int) -> list[dict]:
    """Token ids, needle span and answer positions of up to `n` samples dense got right."""
    items = []
    for r in rows:
        out, value = outputs.get(r["id"]), r["answers"][0]
        if outputs and (out is None or value not in out):
            continue
        if not outputs:  # no dense outputs: teacher-force the gold value after the task's answer prefix
            out = " " + value
        from tasks.base import continue_chat_text

        text = continue_chat_text(r["messages"], tok)  # with the assistant prefill, if the task has one
        at = text.find(f"is: {value}.")
        if at < 0:
            continue
        start = len(tok.encode(text[:at + len("is:")], add_special_tokens=False))
        n_val = len(tok.encode(value, add_special_tokens=False))
        prompt = tok.encode(text, add_special_tokens=False)
        answer = tok.encode(out[:out.find(value) + len(value)], add_special_tokens=False)
        ids = prompt + answer
        pos = list(range(len(ids) - n_val - 1, len(ids) - 1))  # these positions predict the value
        items.append({"id": r["id"], "ids": ids, "span": (start, start + n_val + 1), "pos": pos,
                      "n_prompt": len(prompt)})
        if len(items) >= n:
            break
    return items


def load_indexers(names: list[str], llm, over: dict):
    from engine.msa import IndexProjections, MSAConfig, load_adapter
    from engine.msa.config import default_dense_layers
    from engine.sparsify.trainer import _qk_weights

    w = _qk_weights(llm.model)
    out = {}
    for name in names:
        if name == "oracle":
            msa = MSAConfig(dense_layers=default_dense_layers(llm.config.num_layers), d_idx=llm.config.head_dim)
            proj = None
        elif name == "init":
            msa = MSAConfig(dense_layers=default_dense_layers(llm.config.num_layers), d_idx=llm.config.head_dim)
            proj = IndexProjections(llm.config, msa)
            proj.init_from_attention(w, llm.config)
        else:
            ad = load_adapter(name, llm.config, None)
            msa, proj = ad.msa, ad.projections
        out[name] = (msa.replace(**over), proj)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--needles", required=True)
    ap.add_argument("--outputs", help="needle_eval.py outputs.jsonl with the dense answers [default: the gold value "
                    "right after the prompt, for tasks whose prompt ends with the answer prefix]")
    ap.add_argument("--task", default="niah_single")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--indexers", nargs="+", default=["oracle", "init", str(ROOT / "engine/adapters/smollm2-135m")])
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--per-layer", action="store_true")
    ap.add_argument("--layers", type=int, nargs="+", help="probe only these layers [default: every MSA layer]")
    ap.add_argument("--ids", nargs="+", help="probe only these sample ids")
    ap.add_argument("--json")
    a = ap.parse_args()
    from engine import LLM
    from engine.msa import IndexRope
    from engine.sparsify.activations import collect_hidden, main_qk
    from engine.sparsify.probe import probe

    rows = [json.loads(x) for x in Path(a.needles).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["task"] == a.task and r["length"] == a.length and (not a.ids or r["id"] in a.ids)]
    outs = {}
    for x in (Path(a.outputs).read_text().splitlines() if a.outputs else []):
        o = json.loads(x)
        if o["setting"] == "dense":
            outs[o["id"]] = o["output"]
    llm = LLM("smollm2-135m", attention="dense", device="cpu", dtype=torch.float32, max_model_len=a.length + 256,
              kv_cache_tokens=a.length + 512, max_num_seqs=1, max_num_batched_tokens=2048, progress=False)
    over = {k: v for k, v in (("block_size", a.block_size), ("topk", a.topk)) if v}
    indexers = load_indexers(a.indexers, llm, over)
    items = probe_inputs(llm.tokenizer, rows, outs, a.n)
    layers = a.layers or list(next(iter(indexers.values()))[0].msa_layers(llm.config.num_layers))
    # acc[name][layer] = [hit_sum, n, weighted_hit, weight, kept_mass, needle_mass, recall_sum, n_heads]
    acc = {nm: defaultdict(lambda: [0.0] * 8) for nm in indexers}
    head_mass = defaultdict(float)  # (layer, head) -> summed needle mass
    for it in items:
        ids, pos = it["ids"], torch.tensor(it["pos"])
        hidden = collect_hidden(llm, [ids], tuple(layers))
        for layer in layers:
            h = hidden.pop(layer)[0].float()
            q, k = main_qk(llm.model, layer, h)
            cos, sin = llm.model.rope(torch.arange(len(ids)))
            for nm, (msa, proj) in indexers.items():
                qi = ki = None
                dense = proj is not None and str(layer) not in proj.layers  # a dense layer reads everything
                if proj is not None and not dense:
                    rope = IndexRope(llm.config, msa.d_idx, torch.device("cpu"))
                    ix = proj[layer]
                    with torch.no_grad():
                        ki = ix.index_k(h, rope, cos, sin, torch.arange(len(ids)))
                        qi = ix.index_q(h[pos], rope, cos[pos], sin[pos], pos)
                res = probe(q[pos], k, qi, ki, pos, it["span"], msa.block_size, msa.topk)
                if dense:
                    res.hit = torch.ones_like(res.hit)
                    res.selected_mass = torch.ones_like(res.selected_mass)
                wmax = res.needle_mass.amax(-1)  # [Q, Hkv]
                hit = res.hit.float()
                s = acc[nm][layer]
                s[0] += float(hit.sum()); s[1] += hit.numel()
                s[2] += float((hit * wmax).sum()); s[3] += float(wmax.sum())
                s[4] += float((res.needle_mass * hit[..., None]).sum()); s[5] += float(res.needle_mass.sum())
                s[6] += float(res.selected_mass.sum()); s[7] += res.selected_mass.numel()
                if nm == a.indexers[0]:
                    for hh, m in enumerate(res.needle_mass.flatten(1, 2).sum(0).tolist()):
                        head_mass[(layer, hh)] += m / len(pos) / len(items)
        print(f"{it['id']}: probed", flush=True)
    summary = {}
    for nm, per in acc.items():
        tot = [sum(per[L][i] for L in layers) for i in range(8)]
        summary[nm] = {"hit": tot[0] / tot[1], "w-hit": tot[2] / max(tot[3], 1e-9), "kept": tot[4] / max(tot[5], 1e-9),
                       "recall": tot[6] / tot[7],
                       "per_layer": {L: {"hit": per[L][0] / per[L][1], "kept": per[L][4] / max(per[L][5], 1e-9),
                                         "needle_mass": per[L][5] / per[L][7]} for L in layers}}
    print(f"\n{len(items)} samples ({a.task} {a.length}), {len(items[0]['pos']) if items else 0} answer positions each, "
          f"{over or 'adapter B/k'}")
    print("| indexer | hit | w-hit | kept | recall |\n| --- | --- | --- | --- | --- |")
    for nm, v in summary.items():
        print(f"| {Path(nm).name or nm} | {v['hit']:.3f} | {v['w-hit']:.3f} | {v['kept']:.3f} | {v['recall']:.3f} |")
    if a.per_layer:
        names = list(summary)
        print("\n| layer | mean needle mass/head | top head (mass) | " + " | ".join(f"{Path(n).name} hit / kept" for n in names)
              + " |\n|" + " --- |" * (3 + len(names)))
        for L in layers:
            top = max(((hh, m) for (l2, hh), m in head_mass.items() if l2 == L), key=lambda x: x[1])
            cells = " | ".join(f"{summary[n]['per_layer'][L]['hit']:.2f} / {summary[n]['per_layer'][L]['kept']:.2f}"
                               for n in names)
            print(f"| {L} | {summary[names[0]]['per_layer'][L]['needle_mass']:.3f} | h{top[0]} ({top[1]:.2f}) | {cells} |")
    if a.json:
        tmp = Path(a.json).with_suffix(".tmp")
        tmp.write_text(json.dumps({"samples": [i["id"] for i in items], "over": over, "summary": summary,
                                   "head_mass": {f"{L}:{h}": m for (L, h), m in head_mass.items()}}, indent=1))
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
