"""OpenAI-MRCR-style multi-round coreference (offline analogue, generated here).

A long synthetic conversation: the user asks "Write a {format} about {topic}." over and over, on 12
formats x 12 topics (so requests repeat, and many share the needle's format or its topic), and the
assistant answers each with sentences drawn from the Paul Graham essays (`tasks/loaders/essays.py`;
about 40-120 tokens; verse formats one sentence a line). 2, 4 or 8 identical needle requests sit at
seeded positions, each with its own answer (no essay sentence of a needle's answer appears in any other
answer). The last user turn asks, in OpenAI-MRCR's words, "Prepend {10 random letters and digits} to
the {i-th, as "1st"/"2nd"/"3rd"/"4th"...} (1 indexed) {format} about {topic}. Do not include any other
text in your response." Gold = prefix + that answer; graded as OpenAI-MRCR grades (0 without the
prefix, else the SequenceMatcher ratio of the rest, `tasks.metrics.prefixed_similarity`).

Chat mode sends the conversation as chat messages; completion mode as a User:/Assistant: transcript
(`tasks/helmet/conversation.py`). The number of filler rounds sets the length; the last filler answer
is extended by a cut continuation to close the gap to the target (`fit_turns`: two small calibration
counts, then one exact count of the finished prompt at most lengths). Task ids: `mrcr_2`, `mrcr_4`,
`mrcr_8` (that many needles) and `mrcr`, which cycles 2, 4, 8 over the sample index (balanced at any
sample count).
"""
from __future__ import annotations

import random
import re
import string
from functools import lru_cache
from typing import Any, ClassVar

from tasks.base import BuildSpec, Sample, Task, failed_score
from tasks.common import rng_for
from tasks.fitting import cut_to_tokens
from tasks.helmet import text
from tasks.helmet.conversation import ANSWER_PREFIX, Pieces, Turn, fit_turns, render_turns
from tasks.metrics import prefixed_similarity, similarity, strip_wrapping

VERSION = "mrcr-1"  # bump when the generated prompts or the grading change

FORMATS = ("poem", "short story", "riddle", "limerick", "song", "letter", "blog post", "speech", "fable",
           "sonnet", "haiku", "diary entry")
TOPICS = ("tapirs", "lighthouses", "volcanoes", "the moon", "bicycles", "honeybees", "glaciers", "libraries",
          "octopuses", "thunderstorms", "chess", "sourdough bread")
_GLUED = re.compile(r"[a-z0-9.!?\"')\]][A-Z]|\[\d+\]|\.\d")
VERSE = frozenset({"poem", "limerick", "song", "sonnet", "haiku"})


def ordinal(i: int) -> str:
    """1 -> "1st", 2 -> "2nd", 3 -> "3rd", 4 -> "4th", 11 -> "11th" (OpenAI-MRCR writes digits)."""
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"


def request(fmt: str, topic: str) -> str:
    return f"Write a {fmt} about {topic}."


@lru_cache(maxsize=8)
def sentence_pool(seed: int) -> tuple[str, ...]:
    """The essay sentences answers are drawn from: 6-30 words each, no footnote marks ('[4]') or numbered
    headings ('I/O.8 Efficiency'), none glued to a heading or to the next sentence by the haystack's
    whitespace collapsing ('geeks."On', '2017The', 'around.I'); a few names go too ('JavaScript')."""
    return tuple(s for s in text.essay_haystack(seed) if 6 <= len(s.split()) <= 30 and not _GLUED.search(s))


def _answer(rng: random.Random, pool: tuple[str, ...], fmt: str, banned: set[int], taken: set[int]) -> Pieces:
    """Pool sentences until 28-64 words (the last may run over), none in `banned`; their ids go into
    `taken`. In pieces split where the tokenizer splits anyway: prose joins them with spaces, verse
    formats put one sentence on each line."""
    wanted, count, picked = rng.randint(28, 64), 0, list[str]()
    while count < wanted:
        i = rng.randrange(len(pool))
        if i in banned:
            continue
        taken.add(i)
        picked.append(pool[i])
        count += len(pool[i].split())
    sep = "\n" if fmt in VERSE else " "
    return (picked[0], *(sep + x for x in picked[1:]))


class Mrcr(Task):
    name = "mrcr"
    category = "coref"
    metric = "mrcr_similarity"
    max_tokens = 200  # the largest per-sample budget; each sample's is its gold answer's length + margin
    stop = ("\n\nUser:",)  # completion mode: the transcript's next turn
    description = ("OpenAI-MRCR-style multi-round coreference: reproduce the i-th of 2/4/8 identical requests' "
                   "answers with a random prefix, in a long synthetic conversation (needle count cycles 2, 4, 8)")
    needle_counts: ClassVar[tuple[int, ...]] = (2, 4, 8)

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        k = self.needle_counts[index % len(self.needle_counts)]
        pool = sentence_pool(spec.seed)
        fmt, topic = rng.choice(FORMATS), rng.choice(TOPICS)
        needle_ids: set[int] = set()
        needles = [_answer(rng, pool, fmt, needle_ids, needle_ids) for _ in range(k)]
        fracs = sorted(rng.random() for _ in range(k))
        asked = rng.randrange(k)  # 0-based
        prefix = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
        question = (f"Prepend {prefix} to the {ordinal(asked + 1)} (1 indexed) {fmt} about {topic}. "
                    "Do not include any other text in your response.")
        gold = prefix + "".join(needles[asked])

        r = random.Random(seed ^ 0x3C4)
        fillers: list[Turn] = []  # a prefix-stable stream: user and assistant turns, alternating
        others = [(f, t) for f in FORMATS for t in TOPICS if (f, t) != (fmt, topic)]

        def filler_turns(n: int) -> list[Turn]:
            while len(fillers) < 2 * n:
                u = r.random()
                if u < 0.3:  # same format, another topic
                    f, t = fmt, r.choice([x for x in TOPICS if x != topic])
                elif u < 0.6:  # same topic, another format
                    f, t = r.choice([x for x in FORMATS if x != fmt]), topic
                else:
                    f, t = r.choice(others)
                fillers.extend([("user", (request(f, t),)), ("assistant", _answer(r, pool, f, needle_ids, set()))])
            return fillers[:2 * n]

        t_rng = random.Random(seed ^ 0x7A1)
        extension = "".join(" " + "".join(_answer(t_rng, pool, "prose", needle_ids, set())) for _ in range(4))

        def make(n: int, tail: int) -> list[Turn]:
            turns = list(filler_turns(n))
            if tail and turns:  # the last filler answer runs on (its tail text cut to a token count)
                turns[-1] = ("assistant", (*turns[-1][1], cut_to_tokens(extension, tail, spec.tokenizer).rstrip()))
            for j in reversed(range(k)):  # needle j lands before needle j + 1 (equal positions included)
                pos = 2 * round(fracs[j] * n)
                turns[pos:pos] = [("user", (request(fmt, topic),)), ("assistant", needles[j])]
            return turns + [("user", (question,))]

        budget = spec.max_tokens or (len(spec.tokenizer.encode(gold)) * 5 // 4 + 16)
        fit = fit_turns(make, spec, budget, self.name, n_min=2, n_guess=16, tail_max=120)
        rounds = (len(fit.turns) - 1) // 2
        at = 2 * round(fracs[asked] * fit.n) + 2 * asked  # the asked needle's user turn
        prompt, messages = render_turns(fit.turns, spec.mode)
        metadata = {
            "target_length": spec.target_length, "prompt_tokens": fit.prompt_tokens, "n_items": fit.n,
            "tail_tokens": fit.tail, "seed": seed, "fidelity": self.fidelity,
            "answer_prefix": ANSWER_PREFIX if spec.mode == "completion" else "", "truncated_tokens": 0,
            "task_version": VERSION, "needles": k, "asked": asked + 1, "depth": (at // 2) / max(1, rounds - 1),
            "needle_depths": [round((round(f * fit.n) + j) / max(1, rounds - 1), 4) for j, f in enumerate(fracs)],
            "prefix": prefix, "format": fmt, "topic": topic, "rounds": rounds,
            "haystack_source": text.ESSAY_SOURCE,
        }
        return Sample(
            id=f"{self.name}/{spec.target_length}/{index:04d}", task=self.name, category=self.category,
            answers=[gold], prompt=prompt, messages=messages, mode=spec.mode, max_tokens=budget,
            stop=list(self.stop), metadata=metadata, scorer=self.score)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric, prefix_found=0.0, similarity=0.0)
        prefix, gold = sample.metadata["prefix"], sample.answers[0]
        found = strip_wrapping(output).startswith(prefix)
        return {"score": prefixed_similarity(output, gold, prefix), "metric": self.metric,
                "parsed": strip_wrapping(output), "extraction_failed": not found, "prefix_found": float(found),
                "similarity": similarity(output, gold, prefix)}


class Mrcr2(Mrcr):
    name = "mrcr_2"
    needle_counts = (2,)
    description = "OpenAI-MRCR-style multi-round coreference with 2 needles"


class Mrcr4(Mrcr):
    name = "mrcr_4"
    needle_counts = (4,)
    description = "OpenAI-MRCR-style multi-round coreference with 4 needles"


class Mrcr8(Mrcr):
    name = "mrcr_8"
    needle_counts = (8,)
    description = "OpenAI-MRCR-style multi-round coreference with 8 needles"
