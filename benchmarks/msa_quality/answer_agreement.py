"""End-to-end proxy for needle accuracy without generating (CPU): teacher-force the DENSE model's
own correct answer after each needle prompt and ask whether another attention setting would have
produced it greedily. MSA loses needles mostly in the answer's first words (it drifts into a
different sentence, then never states the number), not only at the value itself, so every
answer token counts.

Per setting over the probed samples (dense answered right; answer = dense output cut after the
gold value): `all` = share of samples whose every answer token is the setting's argmax (a greedy
run would reproduce the answer), `tok` = share of answer tokens that are the argmax, `nll` = mean
negative log-likelihood per answer token, `val` = mean NLL of the value's tokens.

    python benchmarks/msa_quality/answer_agreement.py --needles needles.jsonl \
      --outputs benchmarks/msa_quality/raw/outputs.jsonl --length 4096 --n 12 \
      --settings dense engine/adapters/smollm2-135m /tmp/other_adapter [--block-size 64 --topk 8]

A setting is `dense` or an adapter folder (run as `smollm2-135m+DIR --attention msa`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from needle_probe import probe_inputs  # noqa: E402


def score(llm, ids: list[int], n_answer: int, n_value: int) -> dict:
    lp = llm.prompt_logprobs(ids, top_n=1)[-n_answer:]
    agree = [ids[len(ids) - n_answer + j] in top for j, (_, top) in enumerate(lp)]
    nll = [-x for x, _ in lp]
    return {"all": all(agree), "tok": sum(agree) / n_answer, "nll": sum(nll) / n_answer,
            "val": sum(nll[-n_value:]) / n_value, "first_miss": agree.index(False) if not all(agree) else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--needles", required=True)
    ap.add_argument("--outputs", required=True)
    ap.add_argument("--task", default="niah_single")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--settings", nargs="+", default=["dense", str(ROOT / "engine/adapters/smollm2-135m")])
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    from engine import LLM

    rows = [json.loads(x) for x in Path(a.needles).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["task"] == a.task and r["length"] == a.length]
    outs = {o["id"]: o["output"] for o in map(json.loads, Path(a.outputs).read_text().splitlines())
            if o["setting"] == "dense"}
    over = {k: v for k, v in (("block_size", a.block_size), ("topk", a.topk)) if v}
    res: dict[str, list[dict]] = {}
    items = None
    for st in a.settings:
        t0 = time.time()
        model = "smollm2-135m" if st == "dense" else f"smollm2-135m+{st}"
        llm = LLM(model, attention="dense" if st == "dense" else "msa", device="cpu",
                  msa_overrides=(over or None) if st != "dense" else None, max_model_len=a.length + 256,
                  kv_cache_tokens=a.length + 512, max_num_seqs=1, max_num_batched_tokens=2048, progress=False)
        if items is None:
            items = probe_inputs(llm.tokenizer, rows, outs, a.n)
        res[st] = []
        for it in items:
            n_answer = len(it["ids"]) - it["n_prompt"]
            res[st].append(score(llm, it["ids"], n_answer, len(it["pos"])) | {"id": it["id"]})
        del llm
        print(f"{st}: {len(items)} samples in {time.time() - t0:.0f} s", flush=True)
    print(f"\n{len(items)} samples ({a.task} {a.length}) {over or ''}")
    print("| setting | all | tok | nll | val |\n| --- | --- | --- | --- | --- |")
    for st, rs in res.items():
        n = len(rs)
        print(f"| {Path(st).name or st} | {sum(r['all'] for r in rs) / n:.2f} | {sum(r['tok'] for r in rs) / n:.3f} "
              f"| {sum(r['nll'] for r in rs) / n:.3f} | {sum(r['val'] for r in rs) / n:.3f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"over": over, "results": res}, indent=1))


if __name__ == "__main__":
    main()
