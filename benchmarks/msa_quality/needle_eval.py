"""Needle-in-a-haystack under several attention settings (run on the GPU; scoring is `score.py`).

Reads the samples of `make_needles.py`, generates greedily (chat template, the task's token
budget) with `engine.LLM` for each setting, and writes one JSONL row per (setting, sample) with the
raw output and the request's attention density. Optionally measures the attention-mass recall of
the selection at 8K on the reference path (`--recall N`: the first N 8K prompts, prefill only).

Settings: `dense`, `msa` (the model's indexer, B128/k16), `msa-b64k8` (same projections,
block 64, top-8: 512 keys per query), or `NAME=ADAPTER_DIR` (`--attention msa` on
`MODEL+ADAPTER_DIR`, the adapter's own B/k; `NAME=ADAPTER_DIR@b64k8` runs it with B 64 / k 8).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SETTINGS = {"dense": ("dense", {}), "msa": ("msa", {}), "msa-b64k8": ("msa", {"block_size": 64, "topk": 8}),
            "msa-ref": ("msa-ref", {})}


def to_prompt(messages: list[dict], tok) -> list[dict] | list[int]:
    """A chat as `generate` takes it; a chat ending with an assistant prefill (the task's answer
    prefix opens the assistant turn) as the token ids of the templated text + the prefill, as the
    task runner sends it to a local backend (`continue_chat_text`)."""
    from tasks.base import continue_chat_text, continues_assistant

    if not continues_assistant(messages):
        return messages
    return tok.encode(continue_chat_text(messages, tok), add_special_tokens=False)


def parse_setting(model: str, spec: str) -> tuple[str, str, str, dict]:
    """`dense` | `msa` | ... | `NAME=DIR[@b64k8]` -> (name, model, attention, msa overrides)."""
    if "=" not in spec:
        attention, over = SETTINGS[spec]
        return spec, model, attention, over
    name, path = spec.split("=", 1)
    over = {}
    if path.endswith("@b64k8"):
        path, over = path[: -len("@b64k8")], {"block_size": 64, "topk": 8}
    return name, f"{model}+{path}", "msa", over


def run_setting(model: str, spec: str, rows: list[dict], max_seqs: int) -> list[dict]:
    from engine import LLM, SamplingParams

    name, model, attention, over = parse_setting(model, spec)
    tokens = max_seqs * 8448
    llm = LLM(model, attention=attention, msa_overrides=over or None, max_num_seqs=max_seqs,
              max_num_batched_tokens=16384, kv_cache_tokens=tokens, progress=False)
    t0 = time.time()
    outs = llm.generate([to_prompt(r["messages"], llm.tokenizer) for r in rows],
                        [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0) for r in rows])
    dt = time.time() - t0
    print(f"{name}: {len(rows)} samples in {dt:.1f} s", flush=True)
    res = [{"id": r["id"], "setting": name, "task": r["task"], "length": r["length"], "depth": r["depth"],
            "answers": r["answers"], "output": o.text, "prompt_tokens": len(o.prompt_token_ids),
            "density": o.metrics.get("attention_density")} for r, o in zip(rows, outs)]
    del llm
    torch.cuda.empty_cache()
    return res


def recall_at(model: str, rows: list[dict], over: dict) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(model, attention="msa-ref", msa_overrides={"track_recall": True, **over}, max_num_seqs=4,
              max_num_batched_tokens=8192, kv_cache_tokens=4 * 8448, progress=False)
    llm.generate([to_prompt(r["messages"], llm.tokenizer) for r in rows], SamplingParams(max_tokens=1))
    by_layer = llm.engine.attention.recall_by_layer()
    return {"prompts": len(rows), "prompt_tokens": [r["prompt_tokens"] for r in rows],
            "by_layer": by_layer, "mean": sum(by_layer.values()) / len(by_layer)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--needles", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--settings", nargs="+", default=["dense", "msa", "msa-b64k8"])
    ap.add_argument("--max-seqs", type=int, default=64)
    ap.add_argument("--recall", type=int, default=4)
    ap.add_argument("--recall-model", help="model (+adapter) for the B128/k16 recall [default: --model]")
    ap.add_argument("--recall-model-b64", help="model (+adapter) for the B64/k8 recall [default: --model]")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = [json.loads(x) for x in Path(a.needles).read_text().splitlines() if x.strip()]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "settings": a.settings, "samples": len(rows)}
    for spec in a.settings:
        res = run_setting(a.model, spec, rows, a.max_seqs)
        with open(out / "outputs.jsonl", "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in res))
    if a.recall:
        long_rows = [r for r in rows if r["length"] == 8192][: a.recall]
        info["recall_b128k16"] = recall_at(a.recall_model or a.model, long_rows, {})
        info["recall_b64k8"] = recall_at(a.recall_model_b64 or a.model, long_rows, {"block_size": 64, "topk": 8})
        print("recall", info["recall_b128k16"]["mean"], info["recall_b64k8"]["mean"], flush=True)
    (out / "info.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
