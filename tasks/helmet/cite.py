"""Citation analogue (HELMET `alce_qampari`): list every person born in a given town, citing
numbered documents. Each answer person has one supporting document; the other documents
are about people born elsewhere (some sharing surnames). Headline score: the mean of answer
recall, rule-based citation recall and citation precision (`tasks.metrics.citation`)."""
from __future__ import annotations

import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import finish, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import world
from tasks.metrics import citation_scores


class CiteAnalogue(Task):
    name = "cite"
    category = "cite"
    metric = "cite_mean"
    max_tokens = 128
    n_answers = 3
    description = ("offline analogue of HELMET cite (ALCE QAMPARI): list people born in a town "
                   "and cite documents by number; rule-based citation precision and recall")

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        pool = world.people(rng, max(64, spec.target_length // 30))
        town = pool[0].town
        answers = [pool[0]] + [
            world.Person(p.first, p.surname, town, p.year, p.occupation, p.employer, p.deed)
            for p in pool[1:self.n_answers]]
        negatives = pool[self.n_answers:]
        question = f"Which people were born in the town of {town}?"
        before = ("Instruction: Write an accurate, engaging, and concise answer for the given "
                  "question using only the provided search results (some of which might be "
                  "irrelevant) and cite them properly. Always cite for any factual claim. When "
                  "citing several search results, use [1][2][3]. Cite at least one document and "
                  f"at most three documents in each sentence.\n\nQuestion: {question}\n\n")

        def make_docs(n: int, r: random.Random) -> list[world.Person]:
            docs = list(answers) + negatives[: max(0, n - len(answers))]
            r.shuffle(docs)
            return docs

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0xC17)
            docs = make_docs(n, r)
            lines = [f"Document [{i + 1}] (Title: {p.name}): "
                     f"{world.passage(p, ('town', 'occupation'), r)}" for i, p in enumerate(docs)]
            if tail:
                p = negatives[-1]
                lines.append(cut_to_tokens(f"Document [{len(docs) + 1}] (Title: {p.name}): "
                                           f"{world.passage(p, ('town', 'occupation'), r)}",
                                           tail, spec.tokenizer))
            return PromptParts(before, "\n\n".join(lines), "", "Answer:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=self.n_answers,
                        n_guess=16, tail_max=120)
        docs = make_docs(fit.n, random.Random(seed ^ 0xC17))
        support = {str(i + 1): p.name for i, p in enumerate(docs) if p.town == town}
        positions = sorted(int(k) - 1 for k in support)
        return finish(self, index, spec, fit, [p.name for p in answers], seed,
                      support=support, question=question,
                      depth=positions[0] / max(1, len(docs) - 1))

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric, answer_recall=0.0, citation_recall=0.0,
                                citation_precision=0.0)
        docs = {int(k): v for k, v in sample.metadata["support"].items()}
        s = citation_scores(output, sample.answers, docs)
        return {"score": sum(s.values()) / 3, "metric": self.metric, "parsed": output.strip(),
                "extraction_failed": False, **s}
