"""Helpers shared by the task generators (helmet, repo, loaders): sample assembly, depth grid, parsing."""
from __future__ import annotations

import random
import re
from typing import Any

from tasks.base import BuildSpec, Sample, Task, sample_seed
from tasks.fitting import Fit, render


def rng_for(task: Task, spec: BuildSpec, index: int) -> tuple[random.Random, int]:
    seed = sample_seed(spec.seed, task.name, spec.target_length, index)
    return random.Random(seed), seed


def depth_for(index: int, n_depths: int = 11) -> float:
    """Needle depth in [0, 1] on an 11-point grid, visited in a stride so that the first few
    samples already spread over the context (0, .7, .4, .1, .8, ...)."""
    return ((index * 7) % n_depths) / (n_depths - 1)


def finish(
    task: Task, index: int, spec: BuildSpec, fit: Fit, answers: list[str], seed: int,
    **meta: Any,
) -> Sample:
    """Render the fitted parts for the spec's mode and wrap them in a Sample."""
    prompt, messages = render(fit.parts, spec.mode)
    metadata = {
        "target_length": spec.target_length, "prompt_tokens": fit.prompt_tokens,
        "n_items": fit.n, "tail_tokens": fit.tail, "seed": seed, "fidelity": task.fidelity,
        "answer_prefix": fit.parts.answer_prefix, "truncated_tokens": 0, **meta,
    }
    return Sample(
        id=f"{task.name}/{spec.target_length}/{index:04d}", task=task.name,
        category=task.category, answers=answers, prompt=prompt, messages=messages,
        mode=spec.mode, max_tokens=task.budget(spec), stop=list(task.stop),
        metadata=metadata, scorer=task.score,
    )


def after_prefix(output: str, prefix: str) -> str:
    """HELMET's parse: the text after the last occurrence of the answer prefix (or after its
    last word, e.g. 'Answer:'), else the whole output; stripped."""
    if prefix:
        for p in (prefix, prefix.split()[-1] if prefix.split() else prefix):
            i = output.rfind(p)
            if i >= 0:
                return output[i + len(p):].strip()
    return output.strip()


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def first_int(text: str) -> str | None:
    m = re.search(r"-?\d+", text)
    return m.group(0) if m else None


def spread(n: int, k: int, rng: random.Random) -> list[int]:
    """`k` distinct positions in range(n), sorted."""
    return sorted(rng.sample(range(n), k))


def insert_at_depth(units: list[str], needle: str, depth: float) -> tuple[list[str], int]:
    """Insert `needle` between units at fractional `depth`; returns (units, position)."""
    pos = round(depth * len(units))
    return units[:pos] + [needle] + units[pos:], pos
