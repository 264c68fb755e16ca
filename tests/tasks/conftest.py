import pytest


@pytest.fixture(scope="session")
def ref_tok():
    """The default model's real tokenizer (read from the GGUF; fetched on first use)."""
    from msa_eval.runner.reference import load_reference_tokenizer

    tok, _ = load_reference_tokenizer("smollm2-135m")
    return tok
