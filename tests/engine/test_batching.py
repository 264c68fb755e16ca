"""Continuous batching: a mixed batch gives exactly what each prompt gives alone."""
from engine import SamplingParams

PROMPTS = [
    "Write a short poem about the sea.",
    "List three prime numbers and explain why they are prime. " * 6,
    "Hi",
    "The quick brown fox jumps over the lazy dog. " * 30,
    [{"role": "user", "content": "What is 2 + 2?"}],
]


def test_batch_equals_alone(default_llm):
    p = SamplingParams(max_tokens=24, ignore_eos=True)
    alone = [default_llm.generate(x, p)[0].token_ids for x in PROMPTS]
    batched = default_llm.generate(PROMPTS, p)
    assert [o.token_ids for o in batched] == alone
    assert all(len(t) == 24 for t in alone)


def test_batch_with_tiny_token_budget_interleaves_prefill_and_decode():
    """A 64-token step budget forces chunked prefill mixed with other requests' decodes."""
    from engine import LLM

    llm = LLM("smollm2-135m", device="cpu", max_num_batched_tokens=64, max_num_seqs=3, progress=False)
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [llm.generate(x, p)[0].token_ids for x in PROMPTS]
    assert [o.token_ids for o in llm.generate(PROMPTS, p)] == alone


def test_sampling_seed_is_reproducible(default_llm):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=7)
    a = default_llm.generate("Tell me a story", p)[0].token_ids
    b = default_llm.generate("Tell me a story", p)[0].token_ids
    assert a == b


def test_stop_string_and_max_tokens(default_llm):
    out = default_llm.generate([[{"role": "user", "content": "Count from 1 to 20 separated by commas."}]],
                               SamplingParams(max_tokens=60, stop=["5"]))[0]
    assert "5" not in out.text and out.finish_reason == "stop"
    out = default_llm.generate("Once upon a time", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_prompt_logprobs_match_full_forward(default_llm):
    import torch

    from tests.engine.test_parity_hf import all_logits

    ids = default_llm.tokenizer.encode("Paris is the capital of France.")
    lps = default_llm.prompt_logprobs(ids, top_n=2)
    full = torch.log_softmax(all_logits(default_llm, ids), -1)
    assert lps[0][0] is None and len(lps) == len(ids)
    for i in range(1, len(ids)):
        assert abs(lps[i][0] - float(full[i - 1, ids[i]])) < 1e-4
        assert len(lps[i][1]) == 2
