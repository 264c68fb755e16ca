"""Many-shot ICL analogue (HELMET ICL: TREC, Banking77, CLINC150, NLU): classify a short text
into synthetic topic classes from many label-balanced demonstrations, with labels remapped
to shuffled integers per sample (HELMET's trick, so the model must learn the mapping from
the demos). The number of demos sets the length. Metric: exact match of the label."""
from __future__ import annotations

import random
import re
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, finish, rng_for
from tasks.fitting import fit_parts
from tasks.metrics import exact_match

TOPICS = {
    "weather": "rain snow storm forecast thunder humidity drizzle frost breeze sunshine",
    "cooking": "recipe oven simmer garlic dough saucepan roast flavour spice dessert",
    "sports": "match goal referee stadium league tournament coach striker score season",
    "music": "melody guitar concert chorus drummer album rhythm orchestra lyrics tempo",
    "banking": "account deposit loan interest transfer balance mortgage card withdrawal cheque",
    "travel": "flight passport luggage hotel itinerary airport ticket visa cruise journey",
    "health": "doctor symptom fever clinic vaccine prescription nurse allergy therapy pulse",
    "gardening": "soil seedling compost prune tulip greenhouse fertilizer weeds hedge watering",
}
TEMPLATES = (
    "can you tell me more about the {a} and the {b}",
    "i have a question regarding {a} before the {b}",
    "what should i know about {a} when there is {b}",
    "my friend keeps talking about {a} and {b} today",
    "is it normal to worry about the {a} after the {b}",
    "please explain how {a} relates to {b}",
)


def _example(rng: random.Random, topic: str) -> str:
    a, b = rng.sample(TOPICS[topic].split(), 2)
    return rng.choice(TEMPLATES).format(a=a, b=b)


class ManyShotICL(Task):
    name = "icl"
    category = "icl"
    metric = "exact_match"
    max_tokens = 10
    description = "offline analogue of HELMET many-shot ICL: 8 topic classes, integer-remapped labels"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        topics = list(TOPICS)
        labels = rng.sample(range(len(topics)), len(topics))  # topic i -> integer label
        test_topic = topics[index % len(topics)]  # label-balanced test items
        test = _example(rng, test_topic)
        before = ("Use the provided mapping from the text to label to assign a label to the "
                  'text. Only output "label: {label}" and nothing else.\n\n')
        after = f"\n\ntext: {test}"

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x1C1)
            order = [topics[i % len(topics)] for i in range(n)]  # balanced demos
            r.shuffle(order)
            demos = [f"text: {_example(r, t)}\nlabel: {labels[topics.index(t)]}" for t in order]
            return PromptParts(before, "\n\n".join(demos), after, "label:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=len(topics), n_guess=64)
        gold = str(labels[topics.index(test_topic)])
        return finish(self, index, spec, fit, [gold], seed, topic=test_topic, shots=fit.n)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        m = re.search(r"-?\d+", after_prefix(output, "label:"))
        parsed = m.group(0) if m else None
        return {"score": exact_match(parsed, sample.answers) if parsed else 0.0,
                "metric": self.metric, "parsed": parsed, "extraction_failed": parsed is None}
