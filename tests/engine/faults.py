"""Faults injected into one request (tests of issue 19's per-request isolation)."""
from __future__ import annotations

from engine import SamplingParams


def faulty(attr: str, **kw) -> SamplingParams:
    """SamplingParams whose `attr` raises once built: a fault injected into ONE request's own sampling
    (`top_k`, read only by the temperature path of the sampler) or stop handling (`stop`, read only by
    the stop check). Injected because no real input reaches those faults any more: the values the probe
    used (temperature 1e-40, NaN temperature, non-string stops) are now handled or refused up front."""

    class Faulty(SamplingParams):
        def __getattribute__(self, name):
            if name == attr and object.__getattribute__(self, "__dict__").get("_armed"):
                raise RuntimeError(f"injected fault reading {attr}")
            return super().__getattribute__(name)

    p = Faulty(**kw)
    p._armed = True
    return p
