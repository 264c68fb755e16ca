"""`--attention msa` (Triton kernels, CUDA-graph decode) against `msa-ref` (torch references) on a GPU:
greedy tokens for the prompts of tests/engine/test_msa.py's exact-token GPU test (fp16, 32 tokens),
per adapter; prints the first differing token index per prompt (-1: identical). Tells whether a
failure of that test comes with an adapter or with the code.

    python benchmarks/msa_quality/msa_vs_ref_tokens.py ADAPTER_DIR [ADAPTER_DIR ...]
"""
from __future__ import annotations

import sys

import torch

PROMPTS = ["Write a long story about a lighthouse keeper who finds a message in a bottle. " * 160,
           [{"role": "user", "content": "Explain, step by step, how a bicycle gear system works. " * 200}],
           "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 240]


def first_differences(a: list[list[int]], b: list[list[int]]) -> list[int]:
    return [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), -1) for s, t in zip(a, b)]


def main() -> None:
    from engine import LLM, SamplingParams

    p = SamplingParams(max_tokens=32, ignore_eos=True)
    for adapter in sys.argv[1:]:
        got = {}
        for kind in ("msa", "msa-ref"):
            llm = LLM(f"smollm2-135m+{adapter}", attention=kind, device="cuda", dtype=torch.float16,
                      kv_cache_tokens=16384, progress=False)
            got[kind] = [o.token_ids for o in llm.generate(PROMPTS, p)]
            del llm
            torch.cuda.empty_cache()
        print(adapter, "first differing token per prompt:", first_differences(got["msa"], got["msa-ref"]), flush=True)


if __name__ == "__main__":
    main()
