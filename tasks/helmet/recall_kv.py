"""HELMET JSON-KV (faithful): retrieve the value of one UUID key from a JSON object of
UUID -> UUID pairs; the number of pairs sets the length. Scored by substring exact match."""
from __future__ import annotations

import json
import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.helmet import text
from tasks.metrics import substring_exact_match


class JsonKV(Task):
    name = "json_kv"
    category = "recall"
    fidelity = "faithful"
    metric = "subem"
    max_tokens = 64
    description = "HELMET json_kv: UUID key -> UUID value lookup in a JSON object"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        key, value = text.uuid_str(rng), text.uuid_str(rng)
        depth = depth_for(index)
        # HELMET's template (from lost-in-the-middle): the JSON first, then the instruction
        before = "JSON data:\n"
        after = ("\n\nExtract the value corresponding to the specified key in the JSON object "
                 f'below.\n\nKey: "{key}"')
        prefix = "Corresponding value:"

        def make(n: int, tail: int) -> PromptParts:
            r = random.Random(seed ^ 0x4B5)
            pairs = [(text.uuid_str(r), text.uuid_str(r)) for _ in range(n - 1)]
            pairs.insert(round(depth * (n - 1)), (key, value))
            if tail:  # one filler pair whose value is cut to close the gap to the target
                filler = " ".join(text.uuid_str(r) for _ in range(4))
                k = cut_to_tokens(text.uuid_str(r), max(1, tail // 3), spec.tokenizer)
                pairs.append((k, cut_to_tokens(filler, tail - tail // 3, spec.tokenizer)))
            return PromptParts(before, json.dumps(dict(pairs)), after, prefix)

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=1, n_guess=16,
                        tail_max=100)
        return finish(self, index, spec, fit, [value], seed, depth=depth, key=key)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, "Corresponding value:"))
        return {"score": substring_exact_match(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}
