"""Which faithful prompt choices let the default model find a single needle with dense attention?

Builds `niah_single` samples (seed 42, the runner's generator) in prompt variants and runs
them through the in-process engine (dense, CPU), one prompt at a time, appending one JSON
line per sample to --out (resumable: finished (variant, length, index) rows are skipped).

Variants:
  plural-omit      the generator before 2026-11-30 12:00: plural wording, chat, no prefix
  singular-omit    RULER's singular rewrite for one value, chat, no prefix (HELMET chat policy)
  singular-user    ... prefix appended to the user turn (RULER's API mode)
  singular-asst    ... prefix opens the assistant turn (the model continues it)
  singular-compl   ... completion mode (no chat template), prefix on the last line
  noise-asst       singular-asst in RULER's noise haystack (niah_single_1)

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/helmet_default/niah_variants.py \
        --variants singular-asst --lengths 4096 8192 --n 10 --out /tmp/niah_variants.jsonl
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tasks.base import BuildSpec, continue_chat_text
from tasks.helmet.recall_niah import NiahSingle
from tasks.metrics import ruler_recall


def plural_wording(self: NiahSingle, key: str) -> tuple[str, str, str]:
    """The old wording: RULER's plural template kept for a single value."""
    return ("Some special magic numbers are hidden within the following text. Make sure to "
            "memorize it. I will quiz you about the numbers afterwards.\n",
            f"\nWhat are all the special magic numbers for {key} mentioned in the provided text?",
            f"The special magic numbers for {key} mentioned in the provided text are")


def make_task(variant: str) -> tuple[NiahSingle, str]:
    """(task, mode) for a variant name."""
    wording, placement = variant.split("-")
    attrs: dict = {}
    mode = "chat"
    if wording == "plural":
        attrs["_wording"] = plural_wording
    if wording == "noise":
        attrs["haystack"] = "noise"
    attrs["chat_prefix"] = {"omit": "omit", "user": "user", "asst": "assistant", "compl": "omit"}[placement]
    if placement == "compl":
        mode = "completion"
    cls = type(f"Niah_{variant}", (NiahSingle,), attrs)
    return cls(), mode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192])
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from engine import LLM, SamplingParams

    llm = LLM("smollm2-135m", attention="dense", device="cpu", progress=False)
    tok = llm.tokenizer
    done = set()
    if args.out.is_file():
        for line in args.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["variant"], r["length"], r["index"]))
    for length in args.lengths:
        for i in range(args.start, args.start + args.n):
            for variant in args.variants:
                if (variant, length, i) in done:
                    continue
                task, mode = make_task(variant)
                s = task.build(i, BuildSpec(length, tok, mode, 42, args.max_tokens))
                text = s.prompt if s.prompt is not None else continue_chat_text(s.messages, tok)
                ids = tok.encode(text, add_special_tokens=s.prompt is not None)
                t0 = time.perf_counter()
                out = llm.generate([ids], SamplingParams(max_tokens=args.max_tokens))[0]
                row = {"variant": variant, "length": length, "index": i, "depth": s.metadata["depth"],
                       "answers": s.answers, "output": out.text, "prompt_tokens": len(ids),
                       "score": ruler_recall(out.text, s.answers), "wall_s": time.perf_counter() - t0}
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(variant, length, i, row["score"], repr(out.text[:70]), f"{row['wall_s']:.1f}s", flush=True)


if __name__ == "__main__":
    main()
