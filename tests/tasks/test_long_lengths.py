"""Every generated recall task at long lengths under the reference tokenizer: prompt + budget within
1% of the target (and never over it), the recorded count exact, gold answers score 1 and wrong ones 0.
Prompt-construction time is a benchmark (`benchmarks/quality` preset `prompts`), never asserted here."""
from __future__ import annotations

import pytest

from tasks.base import BuildSpec
from tasks.registry import all_tasks, get_task
from tests.tasks.lengths import check

RECALL = [n for n, c in all_tasks().items() if c.category == "recall" and c.fidelity == "faithful"]


def test_the_recall_tasks_are_all_here():
    assert {"niah_single", "niah_mk2", "niah_mk3", "niah_mv", "niah_single_noise", "json_kv", "vt", "cwe",
            "fwe"} <= set(RECALL)


@pytest.mark.parametrize("name", RECALL)
@pytest.mark.parametrize("length,mode", [(32768, "chat"), (131072, "completion")])
def test_within_one_percent(name, length, mode, ref_tok):
    check(get_task(name).build(1, BuildSpec(length, ref_tok, mode)), length, ref_tok)


def test_one_million_tokens(ref_tok):
    s = get_task("niah_single").build(0, BuildSpec(1 << 20, ref_tok, "chat"))
    check(s, 1 << 20, ref_tok)
    assert s.answers[0] in s.messages[0]["content"]


@pytest.mark.parametrize("name", RECALL)
def test_gold_scores_one_wrong_scores_zero_at_32k(name, ref_tok):
    s = get_task(name).build(2, BuildSpec(32768, ref_tok, "chat", seed=11))
    again = get_task(name).build(2, BuildSpec(32768, ref_tok, "chat", seed=11))
    assert s.prompt_hash() == again.prompt_hash()  # deterministic under the seed
    assert s.score("The answer is " + ", ".join(s.answers) + ".")["score"] == pytest.approx(1.0)
    assert s.score("I am sorry, I cannot find it.")["score"] == 0.0
    assert s.score("")["score"] == 0.0


@pytest.fixture(scope="module")
def metaspace_tok():
    """Another tokenizer family: a SentencePiece-style BPE (Metaspace: splits at spaces only, so a
    newline does not end a piece) trained here on the essays, with a plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from engine.tokenizer import Tokenizer as Wrapped
    from tasks.loaders.essays import essay_text

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    text = essay_text(0)
    hf.train_from_iterator([text[i:i + 5000] for i in range(0, 200_000, 5000)],
                           trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>"]))
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    return Wrapped(hf, template, None, None, set(), False)


@pytest.mark.parametrize("name", ["niah_single", "cwe", "json_kv"])
def test_any_tokenizer(name, metaspace_tok):
    check(get_task(name).build(0, BuildSpec(32768, metaspace_tok, "chat")), 32768, metaspace_tok)
