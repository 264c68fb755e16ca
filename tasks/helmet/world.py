"""A seeded world of fictional people for the RAG, re-rank and citation analogues.

Every person has a unique full name, a birth town, a birth year, an occupation, an employer
and a signature deed; people may share a surname (hard negatives for retrieval). Passages
state some of a person's facts in plain prose plus a few sentences of essay filler.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from tasks.helmet import text

OCCUPATIONS = (
    "astronomer", "baker", "cartographer", "chemist", "clockmaker", "composer", "engineer",
    "glassblower", "historian", "librarian", "mathematician", "navigator", "painter", "potter",
    "sculptor", "shipwright", "surveyor", "translator", "weaver", "botanist",
)

ATTRIBUTES = ("town", "year", "occupation", "employer")

QUESTIONS = {
    "town": "In which town was {name} born?",
    "year": "In which year was {name} born?",
    "occupation": "What was the occupation of {name}?",
    "employer": "Which company did {name} work for?",
}


@dataclass(frozen=True)
class Person:
    first: str
    surname: str
    town: str
    year: str
    occupation: str
    employer: str
    deed: str

    @property
    def name(self) -> str:
        return f"{self.first} {self.surname}"

    def fact(self, attr: str) -> str:
        n = self.name
        return {
            "town": f"{n} was born in the town of {self.town}.",
            "year": f"{n} was born in {self.year}.",
            "occupation": f"{n} worked as a {self.occupation} for most of their life.",
            "employer": f"For many years {n} was employed by {self.employer}.",
            "deed": f"{n} is remembered for {self.deed}.",
        }[attr]

    def get(self, attr: str) -> str:
        return getattr(self, attr)


def people(rng: random.Random, n: int, surnames: int | None = None) -> list[Person]:
    """`n` people with distinct names, towns, years and employers; about three people share
    each surname."""
    k = surnames or max(1, n // 3)
    sur = text.distinct(rng, lambda r: text.name(r, 2), k)
    towns = text.distinct(rng, lambda r: text.name(r, 2) + r.choice(("ford", "holm", "wick", "by")), n)
    years = text.distinct(rng, lambda r: str(r.randrange(1600, 1990)), n)
    kinds = ("Works", "Company", "Guild", "Trading House")
    employers = text.distinct(rng, lambda r: f"{text.name(r)} {r.choice(kinds)}", n)
    out: list[Person] = []
    seen: set[str] = set()
    for i in range(n):
        while True:
            first, s = text.name(rng), rng.choice(sur)
            if f"{first} {s}" not in seen:
                seen.add(f"{first} {s}")
                break
        deed = f"building a {rng.choice(text.ADJECTIVES)} {rng.choice(text.NOUNS)}"
        out.append(Person(first, s, towns[i], years[i], rng.choice(OCCUPATIONS), employers[i], deed))
    return out


def passage(p: Person, attrs: tuple[str, ...], rng: random.Random, filler: int = 2) -> str:
    """Prose about `p` stating exactly the facts in `attrs`, with `filler` essay sentences."""
    sents = [p.fact(a) for a in attrs] + text.essay_sentences(rng, filler)
    head, rest = sents[0], sents[1:]
    rng.shuffle(rest)
    return " ".join([head] + rest)
