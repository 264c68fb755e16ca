"""Seeded text material for the offline generators: word pools, fictional names, UUIDs,
RULER's noise haystack, RULER's real essay haystack (the Paul Graham essays,
`tasks/loaders/essays.py`) and an essay-like template filler (the HELMET analogues' prose).
Everything is a pure function of a `random.Random` or a seed."""
from __future__ import annotations

import random
import re
import uuid
from functools import lru_cache

from tasks.loaders.essays import PAUL_GRAHAM, essay_text

ADJECTIVES = (
    "able ancient bitter bold brave bright broad calm cheerful clever cold cosy curious damp "
    "dark eager early elegant empty faint famous fancy fierce flat fresh gentle giant glad "
    "golden grand green grumpy happy heavy hollow honest huge humble icy jolly keen kind large "
    "lazy little lively lonely loud lucky mellow merry mighty modern muddy narrow neat noble "
    "odd old pale patient plain polite proud quick quiet rapid rare rich round royal rusty "
    "sandy scarlet shiny short silent silly silver simple sleepy slow smooth soft solid sour "
    "spicy steady stormy strange sturdy sunny sweet swift tall tame tender thin tidy tiny "
    "tough vast vivid warm wicked wide wild windy wise witty young zesty"
).split()

NOUNS = (
    "anchor apple arrow badger bakery balloon banana barrel basket beacon beetle bicycle "
    "blanket bottle bridge bucket butter cabin camera candle canyon castle cellar cherry "
    "chimney cloud compass cookie copper cottage crayon crystal curtain dagger desert dolphin "
    "dragon drum eagle engine falcon feather ferry fiddle forest fountain garden garlic "
    "glacier goblet guitar hammer harbor helmet honey island jacket kettle kitten ladder "
    "lantern lemon library lizard magnet maple marble meadow mirror monkey needle ocean "
    "orchard otter paddle palace parrot pebble pencil pepper piano pillow pirate planet "
    "pocket potato puzzle rabbit radio ribbon river rocket saddle sailor sandal scarf "
    "shadow shovel spider sponge statue stove sugar tiger tomato tower trumpet tunnel "
    "turtle umbrella valley velvet violin wagon walnut whistle window wizard"
).split()

VERBS = (
    "admired borrowed carried collected counted described examined fixed followed guarded "
    "measured mended noticed painted polished questioned recorded repaired sketched studied"
).split()

_ONSETS = "b br c d dr f g gr h k l m n p qu r s st t th v w z".split()
_VOWELS = "a e i o u ae ai ea io ou".split()
_CODAS = "n r l s th x nd rk lm st".split()

NOISE_SENTENCES = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)

_ESSAY_TEMPLATES = (
    "Most {adj} {noun}s are {adj2} when you look at them closely, which is why people keep {verb} them.",
    "In the end, the {adj} {noun} matters less than the habit of paying attention to it.",
    "A good {noun} is rarely {adj}; it becomes {adj2} only after years of careful use.",
    "When I first {verb} a {noun}, I assumed it would stay {adj}, and I was wrong.",
    "The question is not whether a {noun} can be {adj}, but who decides what {adj2} means.",
    "People who build {noun}s for a living tend to be {adj} about everything except {noun2}s.",
    "If you want to understand a {noun}, ask what it would take to make it {adj2}.",
    "Every {adj} idea starts as a {noun} that nobody has {verb} yet.",
    "There is a {adj} kind of patience in the way a {noun} ages next to a {noun2}.",
    "Startups, like {noun}s, look {adj} from far away and {adj2} from up close.",
)


def uuid_str(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


WORD_KEYS = len(ADJECTIVES) * len(NOUNS)  # distinct values of `word_key`


def word_key(rng: random.Random) -> str:
    """An `adjective-noun` key, RULER style."""
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def name(rng: random.Random, syllables: int | None = None) -> str:
    """A pronounceable fictional proper name (never a real entity by construction: the
    generator avoids nothing, but the space is large and the facts attached are invented)."""
    k = syllables or rng.choice((2, 2, 3))
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(k)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def distinct(rng: random.Random, make, n: int, exclude: set[str] | None = None) -> list[str]:
    """`n` distinct values of `make(rng)`, none in `exclude`."""
    out: list[str] = []
    seen = set(exclude or ())
    while len(out) < n:
        v = make(rng)
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def essay_sentence(rng: random.Random) -> str:
    t = rng.choice(_ESSAY_TEMPLATES)
    return t.format(
        adj=rng.choice(ADJECTIVES), adj2=rng.choice(ADJECTIVES), noun=rng.choice(NOUNS),
        noun2=rng.choice(NOUNS), verb=rng.choice(VERBS),
    )


def essay_sentences(rng: random.Random, n: int) -> list[str]:
    return [essay_sentence(rng) for _ in range(n)]


def noise_sentences(n: int) -> list[str]:
    """RULER's repeated noise haystack, `n` copies of its five-sentence block."""
    return [NOISE_SENTENCES] * n


ESSAY_SOURCE = PAUL_GRAHAM.source  # recorded in the samples' metadata


@lru_cache(maxsize=8)
def essay_haystack(seed: int) -> tuple[str, ...]:
    """One cycle of RULER's essay haystack, in sentences: the essays in their seeded order
    (`essays.essay_order`), split after '.', '!' or '?' and a space (RULER places needles
    between `sent_tokenize` sentences). The haystack repeats the cycle past its length."""
    return tuple(re.split(r"(?<=[.!?]) (?=\S)", essay_text(seed)))
