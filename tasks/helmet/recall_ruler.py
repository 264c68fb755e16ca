"""RULER's tracing and aggregation tasks (faithful): variable tracking (vt), common words
extraction (cwe) and frequent words extraction (fwe). Scored by RULER recall. Contexts are
counted in pieces split at their spaces and newlines (`fit_pieces`), so 1M-token prompts build fast."""
from __future__ import annotations

import random
import string
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_pieces
from tasks.helmet import text
from tasks.metrics import ruler_recall


class _RulerTask(Task):
    category = "recall"
    fidelity = "faithful"
    metric = "ruler_recall"

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, sample.metadata.get("answer_prefix", "")))
        return {"score": ruler_recall(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}


def _coded_word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 6)))


class VariableTracking(_RulerTask):
    name = "vt"
    max_tokens = 48
    description = "RULER variable tracking: one chain of 4 hops (VAR X = VAR Y) in noise text"
    hops = 4

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        names = text.distinct(rng, lambda r: "".join(r.choice(string.ascii_uppercase) for _ in range(5)),
                              self.hops + 1)
        value = text.number(rng, 5)
        chain = [f"VAR {names[0]} = {value}."] + [
            f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, self.hops + 1)]
        fracs = sorted(rng.random() for _ in chain)
        before = ("Memorize and track the chain(s) of variable assignment hidden in the "
                  "following text.\n\n")
        after = (f"\nQuestion: Find all variables that are assigned the value {value} in the "
                 "text above.")
        prefix = (f"Answer: According to the chain(s) of variable assignment in the text above, "
                  f"{len(names)} variables are assigned the value {value}, they are:")

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            units = text.noise_sentences(n)
            for f, stmt in sorted(zip(fracs, chain, strict=True), reverse=True):
                units.insert(round(f * n), stmt)
            if tail:
                units.append(cut_to_tokens(text.NOISE_SENTENCES, tail, spec.tokenizer))
            return PromptParts(before, "", after, prefix), [units[0]] + [" " + u for u in units[1:]]

        fit = fit_pieces(make, spec, self.budget(spec), self.name, n_guess=32, tail_max=30)
        return finish(self, index, spec, fit, names, seed, depth=fracs[0])


class CommonWords(_RulerTask):
    name = "cwe"
    max_tokens = 96
    description = "RULER common words extraction: 10 words x 20 among words x 3 in a numbered list"
    n_common, freq_common, freq_rare = 10, 20, 3

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        common = text.distinct(rng, lambda r: text.name(r).lower(), self.n_common)
        before = ("Below is a numbered list of words. In these words, some appear more often "
                  "than others. Memorize the ones that appear most often.\n")
        after = f"\nQuestion: What are the {self.n_common} most common words in the above list?"
        prefix = f"Answer: The top {self.n_common} words that appear most often in the list are:"

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            r = random.Random(seed ^ 0xC0E)
            rare = text.distinct(r, lambda q: text.name(q).lower(), n, set(common))
            words = common * self.freq_common + rare * self.freq_rare
            r.shuffle(words)
            # "\n".join(f"{i + 1}. {w}"), in pieces "\n{i + 1}." and " {w}" (each counted once)
            pieces = [p for i, w in enumerate(words) for p in (f"\n{i + 1}." if i else "1.", " " + w)]
            return PromptParts(before, "", after, prefix), pieces

        fit = fit_pieces(make, spec, self.budget(spec), self.name, n_min=1, n_guess=32)
        return finish(self, index, spec, fit, common, seed)


class FrequentWords(_RulerTask):
    name = "fwe"
    max_tokens = 48
    description = "RULER frequent words extraction: top-3 coded words of a Zipf(2) text"
    alpha = 2.0

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        before = ("Read the following coded text and track the frequency of each coded word. "
                  "Find the three most frequently appeared coded words.\n")
        after = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
                 "What are the three most frequently appeared words in the above coded text?")
        prefix = "Answer: According to the coded text above, the three most frequently appeared words are:"

        def counts_for(n: int) -> tuple[list[str], list[int]]:
            r = random.Random(seed ^ 0xF3E)
            vocab = text.distinct(r, _coded_word, max(8, n // 8))
            w = [1.0 / (i + 1) ** self.alpha for i in range(len(vocab))]
            total = sum(w)  # once: summing inside the loop made 1M-token prompts quadratic
            counts = [max(1, int(n * x / total)) for x in w]
            for i in (2, 1, 0):  # strict order at the top so the gold top-3 is unambiguous
                counts[i] = max(counts[i], counts[i + 1] + 1)
            return vocab, counts

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            vocab, counts = counts_for(n)
            words = [v for v, c in zip(vocab, counts, strict=True) for _ in range(c)]
            random.Random(seed ^ 0x5F).shuffle(words)
            pieces = [p for i, w in enumerate(words) for p in ((" ....", " " + w) if i else (w,))]
            return PromptParts(before, "", after, prefix), pieces  # " .... ".join(words)

        fit = fit_pieces(make, spec, self.budget(spec), self.name, n_min=16, n_guess=64)
        vocab, _ = counts_for(fit.n)
        return finish(self, index, spec, fit, vocab[:3], seed)
