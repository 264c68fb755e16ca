"""HELMET JSON-KV (faithful): retrieve the value of one UUID key from a JSON object of
UUID -> UUID pairs; the number of pairs sets the length. Scored by substring exact match.
The context is `json.dumps` of the pairs, counted in pieces of one pair each (`fit_pieces`)."""
from __future__ import annotations

import json
import random
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_pieces
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

        r = random.Random(seed ^ 0x4B5)
        pool: list[tuple[str, str]] = []

        def filler_pairs(n: int) -> list[tuple[str, str]]:  # a prefix-stable stream of pairs
            while len(pool) < n:
                pool.append((text.uuid_str(r), text.uuid_str(r)))
            return pool[:n]

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            pairs = filler_pairs(n)  # pair n - 1 only feeds the tail
            pairs, extra = pairs[:n - 1], pairs[n - 1]
            pairs.insert(round(depth * (n - 1)), (key, value))
            if tail:  # one filler pair whose key and value are cut to close the gap to the target
                k = cut_to_tokens(extra[0], max(1, tail // 3), spec.tokenizer)
                pairs.append((k, cut_to_tokens(extra[1] + " " + extra[0], tail - tail // 3, spec.tokenizer)))
            # json.dumps(dict(pairs)), one piece per pair, split before the space after each comma
            last = len(pairs) - 1
            pieces = [("{" if i == 0 else " ") + json.dumps(k) + ": " + json.dumps(v) + ("}" if i == last else ",")
                      for i, (k, v) in enumerate(pairs)]
            return PromptParts(before, "", after, prefix), pieces

        fit = fit_pieces(make, spec, self.budget(spec), self.name, n_min=1, n_guess=16,
                         tail_max=100)
        return finish(self, index, spec, fit, [value], seed, depth=depth, key=key)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, "Corresponding value:"))
        return {"score": substring_exact_match(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}
