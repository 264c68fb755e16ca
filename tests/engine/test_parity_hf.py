"""Our engine against HF transformers on the real default model (same GGUF file)."""
import torch

from engine import SamplingParams
from engine.testing import all_logits


def test_logits_match_hf_on_512_tokens(default_llm, hf_model):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (512,), generator=g).tolist()
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    ours = all_logits(default_llm, ids)
    assert not torch.isnan(ours).any()
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel <= 1e-3, f"relative error {rel:.2e} (max abs {(ours - ref).abs().max():.2e})"


def test_chunked_prefill_equals_one_shot(default_llm):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 40000, (300,), generator=g).tolist()
    one = all_logits(default_llm, ids)
    for chunk in (128, 77):  # page-aligned and awkward chunk boundaries
        chunked = all_logits(default_llm, ids, chunk=chunk)
        assert torch.allclose(one, chunked, rtol=1e-4, atol=1e-4), (chunk, (one - chunked).abs().max())


PROMPTS = ["The history of the Roman Empire", "def fibonacci(n):", "Once upon a time, in a small village,"]


def test_64_greedy_tokens_match_hf(default_llm, hf_model):
    for prompt in PROMPTS:
        ours = default_llm.generate(prompt, SamplingParams(max_tokens=64, ignore_eos=True))[0].token_ids
        x = torch.tensor([default_llm.tokenizer.encode(prompt)])
        ref = hf_model.generate(x, max_new_tokens=64, min_new_tokens=64, do_sample=False)[0, x.shape[1]:].tolist()
        assert ours == ref, prompt
