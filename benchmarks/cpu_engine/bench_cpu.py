"""CPU speed of our engine against HF transformers, same machine, same run (issue 2).

Measures on the default model (float32): prefill tokens/s at 512 and 4096 prompt tokens,
decode tokens/s at batch 1 and aggregate at batch 8 (64 new tokens, greedy, EOS ignored).
Each figure is the median of `--repeats` timed runs after one warm-up. HF runs its
`generate` with the static cache off (its default dynamic cache), greedy, on the same GGUF.

    python benchmarks/cpu_engine/bench_cpu.py --out benchmarks/cpu_engine/RESULTS.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def prompt_ids(tok, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (n,), generator=g).tolist()


def ours(llm, args) -> dict[str, float]:
    from engine import SamplingParams

    r: dict[str, float] = {}
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    for n in (512, 4096):
        ids = prompt_ids(llm.tokenizer, n, n)
        r[f"prefill_{n}"] = n / median_time(lambda: llm.generate([ids], one), args.repeats)
    dec = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    for b in (1, 8):
        batch = [prompt_ids(llm.tokenizer, args.context, 100 + i) for i in range(b)]
        total = median_time(lambda: llm.generate(batch, dec), args.repeats)
        pre = median_time(lambda: llm.generate(batch, one), args.repeats)
        r[f"decode_b{b}"] = b * (args.new_tokens - 1) / max(total - pre, 1e-9)
    return r


def hf(model, args) -> dict[str, float]:
    r: dict[str, float] = {}
    for n in (512, 4096):
        x = torch.tensor([prompt_ids(None, n, n)])
        with torch.inference_mode():
            r[f"prefill_{n}"] = n / median_time(lambda: model(x, use_cache=False), args.repeats)
    for b in (1, 8):
        x = torch.tensor([prompt_ids(None, args.context, 100 + i) for i in range(b)])
        kw = dict(do_sample=False, pad_token_id=0)
        with torch.inference_mode():
            total = median_time(lambda: model.generate(x, max_new_tokens=args.new_tokens,
                                                       min_new_tokens=args.new_tokens, **kw), args.repeats)
            pre = median_time(lambda: model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw), args.repeats)
        r[f"decode_b{b}"] = b * (args.new_tokens - 1) / max(total - pre, 1e-9)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=128, help="prompt tokens before decoding")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both engines")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    import transformers

    from engine import LLM

    llm = LLM("smollm2-135m", device="cpu", progress=False)
    p = llm.model_path
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    a, b = ours(llm, args), hf(model, args)
    rows = [(k, a[k], b[k], a[k] / b[k]) for k in a]
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# CPU engine speed: msa-eval engine vs HF transformers (same run)", "",
        f"- hardware: {cpu or platform.processor()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        f"- versions: torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}",
        f"- model: smollm2-135m (Q4_1 GGUF dequantized to float32), decode after a {args.context}-token prompt, "
        f"{args.new_tokens} new tokens, greedy; median of {args.repeats} after warm-up",
        f"- command: `python benchmarks/cpu_engine/bench_cpu.py --repeats {args.repeats} --new-tokens {args.new_tokens}"
        f"{' --threads ' + str(args.threads) if args.threads else ''}`", "",
        "| metric (tokens/s) | ours | HF transformers | ratio |", "| --- | ---: | ---: | ---: |",
        *[f"| {k} | {x:.1f} | {y:.1f} | {z:.2f}x |" for k, x, y, z in rows]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
