"""RULER needle-in-a-haystack tasks (faithful re-implementations, HELMET's Recall category).

Needle: "One of the special magic {numbers|uuids} for {key} is: {value}." Haystacks:
`essay` (RULER's Paul Graham essays, `tasks/loaders/essays.py`: concatenated in a seeded order,
repeated past their length, needles placed between sentences), `noise` (RULER's repeated "The
grass is green..." block) or `needle` (distractor needles with other keys, RULER multikey 2/3).
Scored by RULER recall: fraction of gold values in the output. Prompts are fitted by
`fit_pieces` (one exact count per sample), so 1M-token samples build in seconds.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar

from tasks.base import BuildSpec, ChatPrefix, PromptParts, Sample, Task, failed_score
from tasks.common import after_prefix, depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_pieces
from tasks.helmet import text
from tasks.metrics import ruler_recall


class NiahTask(Task):
    category = "recall"
    fidelity = "faithful"
    metric = "ruler_recall"
    max_tokens = 32
    haystack: ClassVar[str] = "essay"  # essay | noise | needle
    key_kind: ClassVar[str] = "words"  # words | uuids
    value_kind: ClassVar[str] = "numbers"  # numbers | uuids
    num_values: ClassVar[int] = 1
    # chat mode: the answer prefix opens the assistant turn (RULER/HELMET place it right
    # after the generation prompt), see benchmarks/CHANGELOG.md
    chat_prefix: ClassVar[ChatPrefix] = "assistant"

    def _key(self, rng: random.Random) -> str:
        return text.word_key(rng) if self.key_kind == "words" else text.uuid_str(rng)

    def _value(self, rng: random.Random) -> str:
        return text.number(rng) if self.value_kind == "numbers" else text.uuid_str(rng)

    def _needle(self, key: str, value: str) -> str:
        return f"One of the special magic {self.value_kind} for {key} is: {value}."

    def _units(self, spec: BuildSpec, seed: int, exclude: set[str]) -> Callable[[int], list[str]]:
        """units(n): the first n haystack units (a prefix-stable stream)."""
        if self.haystack == "noise":
            return lambda n: [text.NOISE_SENTENCES] * n
        if self.haystack == "essay":
            cycle = text.essay_haystack(spec.seed)
            return lambda n: [cycle[i % len(cycle)] for i in range(n)]
        rng, seen = random.Random(seed ^ 0x5EED), set(exclude)
        pool: list[str] = []
        # word keys are adjective-noun pairs (13K of them): past 3/4 of those (about 200K tokens of
        # distractors) later distractors may repeat an earlier one's key, never the asked key
        distinct = text.WORD_KEYS * 3 // 4 if self.key_kind == "words" else 1 << 62

        def needles(n: int) -> list[str]:  # distractors: other keys, each with its own value
            while len(pool) < n:
                k = self._key(rng)
                if k in exclude or (k in seen and len(seen) < distinct):
                    continue
                seen.add(k)
                pool.append(self._needle(k, self._value(rng)))
            return pool[:n]
        return needles

    def _wording(self, key: str) -> tuple[str, str, str]:
        """(before, after, answer prefix) in RULER's words; like RULER's `niah.py`, a task
        asking for ONE value speaks in the singular ("A special magic number ... What is
        the special magic number ..."): the plural question made the small model list
        several near-copies. The needle sentences keep the plural ("One of the ...")."""
        vtype = self.value_kind
        if self.num_values == 1:
            one = vtype[:-1]
            return ((f"A special magic {one} is hidden within the following text. Make sure to "
                     f"memorize it. I will quiz you about the {one} afterwards.\n"),
                    f"\nWhat is the special magic {one} for {key} mentioned in the provided text?",
                    f"The special magic {one} for {key} mentioned in the provided text is")
        return ((f"Some special magic {vtype} are hidden within the following text. Make sure to "
                 f"memorize it. I will quiz you about the {vtype} afterwards.\n"),
                f"\nWhat are all the special magic {vtype} for {key} mentioned in the provided text?",
                f"The special magic {vtype} for {key} mentioned in the provided text are")

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        key = self._key(rng)
        values = text.distinct(rng, self._value, self.num_values)
        depth = depth_for(index)
        # multi-value: first needle at `depth`, the others at seeded depths
        depths = [depth] + [rng.random() for _ in range(self.num_values - 1)]
        before, after, prefix = self._wording(key)

        units = self._units(spec, seed, {key})

        def make(n: int, tail: int) -> tuple[PromptParts, list[str]]:
            haystack = units(n + (1 if tail else 0))
            if tail:  # a partial extra haystack unit closes the gap to the target length
                haystack[-1] = cut_to_tokens(haystack[-1], tail, spec.tokenizer)
            for d, v in sorted(zip(depths, values, strict=True), reverse=True):
                haystack.insert(round(d * len(haystack)), self._needle(key, v))
            pieces = [haystack[0]] + [" " + u for u in haystack[1:]]  # " ".join, split at the spaces
            return PromptParts(before, "", after, prefix, chat_prefix=self.chat_prefix), pieces

        fit = fit_pieces(make, spec, self.budget(spec), self.name, n_min=1, n_guess=64,
                         tail_max=80)
        source = {"haystack_source": text.ESSAY_SOURCE} if self.haystack == "essay" else {}
        return finish(self, index, spec, fit, values, seed, depth=depth, depths=depths,
                      key=key, haystack=self.haystack, **source)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        parsed = first_line(after_prefix(output, sample.metadata.get("answer_prefix", "")))
        return {"score": ruler_recall(output, sample.answers), "metric": self.metric,
                "parsed": parsed or None, "extraction_failed": not parsed}


class NiahSingle(NiahTask):
    name = "niah_single"
    description = "RULER niah_single_2: one word-key -> 7-digit number needle in the Paul Graham essays"


class NiahSingleNoise(NiahTask):
    name = "niah_single_noise"
    haystack = "noise"
    description = "RULER niah_single_1: one needle in the repeated 'grass is green' noise haystack"


class NiahMultiKey2(NiahTask):
    name = "niah_mk2"
    haystack = "needle"
    description = "RULER niah_multikey_2 (HELMET recall): haystack made of distractor needles (word keys, numbers)"


class NiahMultiKey3(NiahTask):
    name = "niah_mk3"
    haystack = "needle"
    key_kind = "uuids"
    value_kind = "uuids"
    max_tokens = 48
    description = "RULER niah_multikey_3 (HELMET recall): UUID keys and UUID values, needle haystack"


class NiahMultiValue(NiahTask):
    name = "niah_mv"
    num_values = 4
    max_tokens = 64
    description = "RULER niah_multivalue (HELMET recall): four values for one key in the Paul Graham essays"
