"""Long-document QA analogues (HELMET LongQA: InfiniteBench En.QA / En.MC, NarrativeQA):
questions about one hand-over event placed at a recorded depth of a long fictional story.
`longqa` is free-form (ROUGE-L F1 headline, SubEM beside it); `longqa_mc` has four options
(exact match on the letter)."""
from __future__ import annotations

import random
import re
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import story
from tasks.metrics import exact_match, rouge_l, substring_exact_match


class _StoryQA(Task):
    category = "longqa"
    choices = False

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        people = story.cast(rng)
        things = story.items(rng, 64)
        evs = story.events(rng, people, things)
        key = evs[0]
        depth = depth_for(index)
        question = f"Who gave the {key.item} to {key.receiver}?"
        answer = key.giver
        options: list[str] = []
        if self.choices:
            question = f"Where did {key.giver} give the {key.item} to {key.receiver}?"
            wrong = rng.sample([p for p in story.PLACES if p != key.place], 3)
            options = wrong + [key.place]
            rng.shuffle(options)
            answer = "ABCD"[options.index(key.place)]
            question += "\n" + "\n".join(f"{'ABCD'[i]}. the {o}" for i, o in enumerate(options))
        if self.choices:
            before = ("You are given a story and a question with multiple choices. Choose the "
                      "best answer from the options provided. Only one of the following options "
                      "is correct, output the answer using one single letter (A, B, C, or D). "
                      "Don't say anything else.\n\n")
        else:
            before = ("You are given a story and a question. Answer the question as concisely "
                      "as you can, using a single phrase if possible.\n\n")
        after = f"\n\nQuestion: {question}"

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x570)
            units = [story.filler(r, people) for _ in range(n)]
            others = [e.sentence() for e in evs[1:]]
            for s in others[: max(0, n // 6)]:  # distractor events, spread out
                units.insert(r.randrange(len(units) + 1), s)
            units.insert(round(depth * len(units)), key.sentence())
            if tail:
                units.append(cut_to_tokens(story.filler(r, people), tail, spec.tokenizer))
            return PromptParts(before, story.chapters(units), after, "Answer:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=1, n_guess=64, tail_max=30)
        return finish(self, index, spec, fit, [answer], seed, depth=depth, options=options,
                      question=question)


class LongQA(_StoryQA):
    name = "longqa"
    metric = "rougeL_f1"
    max_tokens = 24
    open_ended = True
    description = "offline analogue of HELMET LongQA (En.QA): free-form question on a long story"

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric, subem=0.0)
        parsed = first_line(after_prefix(output, "Answer:"))
        return {"score": max(rouge_l(output, sample.answers), rouge_l(parsed, sample.answers)),
                "metric": self.metric, "parsed": parsed or None, "extraction_failed": not parsed,
                "subem": substring_exact_match(output, sample.answers)}


class LongQAChoice(_StoryQA):
    name = "longqa_mc"
    metric = "exact_match"
    max_tokens = 8
    choices = True
    description = "offline analogue of HELMET LongQA (En.MC): four-option question on a long story"

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        m = re.search(r"\b([ABCD])\b", after_prefix(output, "Answer:"))
        parsed = m.group(1) if m else None
        return {"score": exact_match(parsed, sample.answers) if parsed else 0.0,
                "metric": self.metric, "parsed": parsed, "extraction_failed": parsed is None}
