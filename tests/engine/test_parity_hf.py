"""Our engine against HF transformers on the real default model (same GGUF file)."""
import torch

from engine import SamplingParams
from engine.scheduler import ScheduledChunk
from engine.sequence import Sequence


def all_logits(llm, ids, chunk: int | None = None):
    """Logits of every position, prefilled in chunks of `chunk` tokens (None = one shot)."""
    eng = llm.engine
    seq = Sequence("probe", list(ids), SamplingParams(), max_len=len(ids))
    eng.blocks.grow("probe", len(ids))
    outs = []
    try:
        step = chunk or len(ids)
        for s in range(0, len(ids), step):
            c = ScheduledChunk(seq, s, min(step, len(ids) - s))
            i, p, m = eng._pack([c])
            with torch.inference_mode():
                outs.append(llm.model.logits(llm.model.hidden_states(i, p, m, llm.cache, eng.attention)))
            seq.num_computed += c.length
    finally:
        eng.blocks.release("probe")
    return torch.cat(outs)


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
