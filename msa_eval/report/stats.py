"""Paired statistics for A - B comparisons on the same samples: the percentile bootstrap of the
mean difference and the exact sign / McNemar test."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass


def paired_bootstrap(a: list[float], b: list[float], n_boot: int = 2000, seed: int = 0,
                     alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean(a - b), lo, hi): percentile bootstrap CI of the mean paired difference.
    a[i] and b[i] are scores of the same sample under two systems."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_bootstrap needs two equally long, non-empty score lists")
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = sum(d) / n
    rng = random.Random(seed)
    boots = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo = boots[int(alpha / 2 * n_boot)]
    hi = boots[min(n_boot - 1, int((1 - alpha / 2) * n_boot))]
    return mean, lo, hi


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


@dataclass(frozen=True)
class SignTest:
    """Exact sign test on paired differences a - b (zeros dropped). On 0/1 scores the non-zero
    differences are McNemar's discordant pairs, so this is the exact McNemar test."""

    wins: int  # a > b
    losses: int  # a < b
    test: str  # "mcnemar" (every score 0 or 1) or "sign"
    p: float  # two-sided: 2 * P(X <= min(wins, losses)), X ~ Bin(wins + losses, 1/2), capped at 1
    p_less: float  # one-sided, H1 "a below b": P(X >= losses)


def binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact (integer sums, one rounding)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def sign_test(a: list[float], b: list[float]) -> SignTest:
    """Exact sign / McNemar test of the paired scores a[i], b[i] (same sample under two systems)."""
    if len(a) != len(b):
        raise ValueError("sign_test needs two equally long score lists")
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    n = wins + losses
    binary = all(x in (0, 1) for x in a + b)
    p = min(1.0, 2 * binom_cdf_half(min(wins, losses), n)) if n else 1.0
    p_less = 1.0 - binom_cdf_half(losses - 1, n) if n else 1.0
    return SignTest(wins, losses, "mcnemar" if binary else "sign", p, p_less)


def format_p(p: float | None) -> str:
    """A compact p-value for tables: p<.001, p=.03, p=.2, p=1."""
    if p is None:
        return ""
    if p < 0.001:
        return "p<.001"
    if p >= 0.995:
        return "p=1"
    s = f"{p:.2g}" if p < 0.1 else f"{p:.2f}"
    return "p=" + (s[1:] if s.startswith("0.") else s)
