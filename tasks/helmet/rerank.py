"""Re-rank analogue (HELMET `msmarco_rerank_psg`): rank passages `[ID: n]` for a query about a
fictional person. Grades: 2 = states the asked fact about the person, 1 = about the person
but another fact, 0 = someone else (often sharing the surname). Metric: NDCG@10."""
from __future__ import annotations

import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, finish, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import world
from tasks.metrics import ndcg_at_k, parse_ranking


class RerankAnalogue(Task):
    name = "rerank"
    category = "rerank"
    metric = "ndcg@10"
    max_tokens = 64
    description = "offline analogue of HELMET re-rank: graded passages (2/1/0), output 'ID > ID > ...'"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        pool = world.people(rng, max(64, spec.target_length // 30))
        target, negatives = pool[0], pool[1:]
        attr = rng.choice(world.ATTRIBUTES)
        question = world.QUESTIONS[attr].format(name=target.name)
        ids = rng.sample(range(1000, 10000), len(pool) + 8)
        before = ("You are provided with a list of documents, each indicated by their ID. Rank "
                  "each document based on their relevance to the question in descending order "
                  "from most relevant to least relevant texts. Include all documents in the "
                  "rankings. Write your answer using the unique IDs, with the following format:\n"
                  "Ranking: ID3 > ID1 > ID2\n\n")
        after = f"\n\nQuery: {question}"
        others = tuple(a for a in world.ATTRIBUTES if a != attr)

        def make_docs(n: int, r: random.Random) -> list[tuple[str, int]]:
            docs = [(world.passage(target, (attr, "deed"), r), 2)]
            docs += [(world.passage(target, (o, "deed"), r), 1) for o in others[: max(0, n - 1)]]
            docs += [(world.passage(p, (attr, "deed"), r), 0) for p in negatives[: max(0, n - 4)]]
            r.shuffle(docs)
            return docs[:n] if n >= 1 else docs

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x3E3)
            docs = make_docs(n, r)
            lines = [f"[ID: {ids[i]}] Document: {d}" for i, (d, _) in enumerate(docs)]
            if tail:
                extra = world.passage(negatives[-1], (attr, "deed"), r)
                lines.append(cut_to_tokens(f"[ID: {ids[-1]}] Document: {extra}", tail, spec.tokenizer))
            return PromptParts(before, "\n".join(lines), after, "Ranking:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=4, n_guess=16, tail_max=120)
        docs = make_docs(fit.n, random.Random(seed ^ 0x3E3))
        qrels = {ids[i]: g for i, (_, g) in enumerate(docs)}
        if fit.tail:
            qrels[ids[-1]] = 0
        gold_order = sorted(qrels, key=lambda k: -qrels[k])
        gold_pos = [i for i, (_, g) in enumerate(docs) if g == 2][0]
        return finish(self, index, spec, fit, [" > ".join(map(str, gold_order[:10]))], seed,
                      qrels={str(k): v for k, v in qrels.items() if v > 0},
                      depth=gold_pos / max(1, len(docs) - 1), question=question)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        ranking = parse_ranking(after_prefix(output, "Ranking:")) or parse_ranking(output)
        qrels = {int(k): v for k, v in sample.metadata["qrels"].items()}
        return {"score": ndcg_at_k(ranking, qrels, 10), "metric": self.metric,
                "parsed": " > ".join(map(str, ranking)) or None,
                "extraction_failed": not ranking}
