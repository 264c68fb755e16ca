"""Summarisation analogue (HELMET Summ: InfiniteBench En.Sum, Multi-LexSum): summarise a long
story whose plot is a handful of key hand-over events buried in descriptive filler. Headline
metric: key-point recall (a key event counts when the summary names its giver, its receiver
and the item's noun); ROUGE-L F1 against the reference summary is reported beside it. The
GPT-4o judge HELMET uses is not part of this offline proxy; `--judge` adds an optional one
outside the headline (msa_eval/judge.py)."""
from __future__ import annotations

import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, finish, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import story
from tasks.metrics import normalize_answer, rouge_l


class SummAnalogue(Task):
    name = "summ"
    category = "summ"
    metric = "keypoint_recall"
    max_tokens = 160
    n_key = 4
    open_ended = True
    description = "offline proxy of HELMET Summ: summarise the key events of a long story"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        people = story.cast(rng, 6)
        evs = story.events(rng, people, story.items(rng, self.n_key))
        fracs = sorted(rng.random() for _ in evs)
        before = ("You are given a story. Summarize the story: list who gave which item to whom, "
                  "in order, in a few sentences.\n\n")
        after = "\n\nNow summarize the story."

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x5A3)
            units = [story.filler(r, people) for _ in range(n)]
            for f, e in sorted(zip(fracs, evs, strict=True), key=lambda x: -x[0]):
                units.insert(round(f * len(units)), e.sentence())
            if tail:
                units.append(cut_to_tokens(story.filler(r, people), tail, spec.tokenizer))
            return PromptParts(before, story.chapters(units), after, "Summary:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=1, n_guess=64, tail_max=30)
        reference = " ".join(e.sentence() for e in evs)
        keypoints = [[e.giver, e.receiver, e.item.split()[-1]] for e in evs]
        return finish(self, index, spec, fit, [reference], seed, keypoints=keypoints,
                      depth=fracs[0])

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric, rougeL_f1=0.0)
        parsed = after_prefix(output, "Summary:")
        norm = normalize_answer(output)
        kps = sample.metadata["keypoints"]
        hit = sum(all(normalize_answer(w) in norm for w in kp) for kp in kps)
        return {"score": hit / len(kps), "metric": self.metric, "parsed": parsed or None,
                "extraction_failed": not parsed, "rougeL_f1": rouge_l(output, sample.answers)}
