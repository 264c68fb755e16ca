"""A seeded fictional story for the long-document QA and summarisation analogues: a cast,
places, items, and a sequence of events ("On day 12, Tarin gave the copper lantern to
Velma in the harbor.") mixed with descriptive filler sentences, split into chapters."""
from __future__ import annotations

import random
from dataclasses import dataclass

from tasks.helmet import text

PLACES = ("harbor", "market", "library", "orchard", "lighthouse", "mill", "chapel", "bakery",
          "bridge", "tavern", "garden", "workshop")


@dataclass(frozen=True)
class Event:
    day: int
    giver: str
    receiver: str
    item: str
    place: str

    def sentence(self) -> str:
        return (f"On day {self.day}, {self.giver} gave the {self.item} to {self.receiver} "
                f"in the {self.place}.")


def cast(rng: random.Random, n: int = 8) -> list[str]:
    return text.distinct(rng, text.name, n)


def items(rng: random.Random, n: int) -> list[str]:
    return text.distinct(rng, lambda r: f"{r.choice(text.ADJECTIVES)} {r.choice(text.NOUNS)}", n)


def events(rng: random.Random, people: list[str], things: list[str]) -> list[Event]:
    """One hand-over per item, on increasing days, between two different people."""
    out = []
    for d, item in enumerate(things):
        a, b = rng.sample(people, 2)
        out.append(Event(d + 1, a, b, item, rng.choice(PLACES)))
    return out


def filler(rng: random.Random, people: list[str]) -> str:
    who = rng.choice(people)
    return rng.choice((
        f"{who} walked past the {rng.choice(PLACES)} and thought about the {rng.choice(text.ADJECTIVES)} weather.",
        f"The {rng.choice(PLACES)} was {rng.choice(text.ADJECTIVES)} that morning, and {who} said little.",
        f"{who} remembered an old song about a {rng.choice(text.NOUNS)} and hummed it quietly.",
        f"Nobody in the {rng.choice(PLACES)} spoke of the {rng.choice(text.NOUNS)} again.",
        text.essay_sentence(rng),
    ))


def chapters(units: list[str], per_chapter: int = 40) -> str:
    out = []
    for c in range(0, len(units), per_chapter):
        out.append(f"Chapter {c // per_chapter + 1}\n" + " ".join(units[c:c + per_chapter]))
    return "\n\n".join(out)
