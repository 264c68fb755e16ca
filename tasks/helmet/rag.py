"""RAG analogue (HELMET `kilt_*`): answer a factoid question about a fictional person from
numbered passages: one gold passage among hard negatives (people sharing the surname, and
passages about the same person that do not state the asked fact). Metric: SubEM."""
from __future__ import annotations

import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import world
from tasks.metrics import substring_exact_match


class RagAnalogue(Task):
    name = "rag"
    category = "rag"
    metric = "subem"
    max_tokens = 24
    description = "offline analogue of HELMET RAG: one gold passage among look-alike negatives"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        pool = world.people(rng, max(64, spec.target_length // 30))
        target = pool[0]
        attr = rng.choice(world.ATTRIBUTES)
        question = world.QUESTIONS[attr].format(name=target.name)
        depth = depth_for(index)
        others = list(pool[1:])
        same_sur = [p for p in others if p.surname == target.surname]
        negatives = same_sur + [p for p in others if p.surname != target.surname]
        before = ("Use the given documents to write a concise and short answer to the question. "
                  "Write your answer in the following format:\nAnswer: [answer]\n\n")
        after = f"\n\nQuestion: {question}"

        def doc(p: world.Person, attrs: tuple[str, ...], r: random.Random) -> str:
            return f"Document (Title: {p.name}): {world.passage(p, attrs, r)}"

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x2A6)
            other_attrs = tuple(a for a in world.ATTRIBUTES if a != attr)
            docs = [doc(target, ("deed", r.choice(other_attrs)), r)]  # same person, no answer
            docs += [doc(p, (attr, "deed"), r) for p in negatives[: max(0, n - 2)]]
            r.shuffle(docs)
            docs.insert(round(depth * (len(docs))), doc(target, (attr, "deed"), r))
            if tail:
                docs.append(cut_to_tokens(doc(negatives[-1], (attr, "deed"), r), tail, spec.tokenizer))
            return PromptParts(before, "\n\n".join(docs), after, "Answer:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=2, n_guess=16, tail_max=120)
        return finish(self, index, spec, fit, [target.get(attr)], seed, depth=depth,
                      attribute=attr, question=question)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, "Answer:"))
        s = max(substring_exact_match(output, sample.answers),
                substring_exact_match(parsed, sample.answers))
        return {"score": s, "metric": self.metric, "parsed": parsed or None,
                "extraction_failed": not parsed}
