"""Every HELMET-style generator: seeded determinism, length fitting under the real tokenizer,
gold output scores 1 and a wrong/empty output 0 under the task's own metric."""
import pytest

from tasks.base import BuildSpec, continue_chat_text
from tasks.fitting import count_tokens  # noqa: F401  (imported for clarity of intent)
from tasks.helmet import CATEGORIES
from tasks.registry import all_tasks, get_task

GENERATED = [n for n, c in all_tasks().items() if c.fidelity in ("faithful", "analogue")]


def gold_output(sample) -> str:
    """What a perfect model would answer, written the way a model would."""
    t, a, m = sample.task, sample.answers, sample.metadata
    if t == "cite":
        by_name = {v: k for k, v in m["support"].items()}
        return " ".join(f"{name} was born there [{by_name[name]}]." for name in a)
    if t == "rerank":
        return "Ranking: " + a[0]
    if t == "icl":
        return f"label: {a[0]}"
    if t == "summ":
        return a[0]
    if t in ("longqa_mc", "longqa"):  # longqa: ROUGE-L F1 (HELMET En.QA) rewards the bare answer
        return a[0]
    if t.startswith("mrcr"):  # the prefixed answer itself (OpenAI-MRCR grading)
        return a[0]
    if t == "graphwalks":
        return "Final Answer: [" + ", ".join(a) + "]"
    return "The answer is " + ", ".join(a) + "."


def test_all_seven_categories_are_covered():
    cats = {all_tasks()[n].category for n in GENERATED}
    assert set(CATEGORIES) <= cats
    assert {all_tasks()[n].fidelity for n in GENERATED if all_tasks()[n].category != "recall"} == {"analogue"}
    assert {all_tasks()[n].fidelity for n in GENERATED if all_tasks()[n].category == "recall"} == {"faithful"}


@pytest.mark.parametrize("name", GENERATED)
def test_seeded_determinism(name, ref_tok):
    task = get_task(name)
    a = task.build(1, BuildSpec(2048, ref_tok, "chat", seed=7))
    b = get_task(name).build(1, BuildSpec(2048, ref_tok, "chat", seed=7))
    c = task.build(1, BuildSpec(2048, ref_tok, "chat", seed=8))
    assert a.to_dict() == b.to_dict()
    assert a.prompt_hash() != c.prompt_hash()
    assert a.id == f"{name}/2048/0001"


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize("length,mode", [(2048, "chat"), (4096, "completion")])
def test_length_within_two_percent(name, length, mode, ref_tok):
    s = get_task(name).build(2, BuildSpec(length, ref_tok, mode))
    if mode == "chat":
        real = len(ref_tok.encode(continue_chat_text(s.messages, ref_tok)))
    else:
        real = len(ref_tok.encode(s.prompt, add_special_tokens=True))
    assert real == s.metadata["prompt_tokens"]
    total = real + s.max_tokens
    assert 0.98 * length <= total <= length, (name, total)


@pytest.mark.parametrize("name", GENERATED)
def test_gold_scores_one_wrong_scores_zero(name, ref_tok):
    s = get_task(name).build(3, BuildSpec(2048, ref_tok, "chat"))
    gold = s.score(gold_output(s))
    assert gold["score"] == pytest.approx(1.0), (name, gold)
    assert gold["extraction_failed"] is False
    wrong = s.score("I am sorry, I cannot find it. label: 99 Ranking: 1 > 2. Summary: nothing [1].")
    assert wrong["score"] == 0.0, (name, wrong)
    empty = s.score("")
    assert empty["score"] == 0.0 and empty["extraction_failed"] is True
    assert s.score(None)["score"] == 0.0


@pytest.mark.parametrize("name", ["niah_single", "json_kv", "rag", "longqa"])
def test_needle_depth_is_recorded_and_placed(name, ref_tok):
    task = get_task(name)
    depths = []
    for i in range(3):
        s = task.build(i, BuildSpec(2048, ref_tok, "completion"))
        depths.append(s.metadata["depth"])
        assert 0.0 <= s.metadata["depth"] <= 1.0
        if name == "niah_single":  # the needle sits at the recorded depth of the haystack
            needle = f"for {s.metadata['key']} is: {s.answers[0]}"
            pos = s.prompt.index(needle) / len(s.prompt)
            assert abs(pos - s.metadata["depth"]) < 0.1
    assert len(set(depths)) == 3


def test_mode_changes_rendering_not_answers(ref_tok):
    chat = get_task("niah_mk2").build(0, BuildSpec(2048, ref_tok, "chat"))
    comp = get_task("niah_mk2").build(0, BuildSpec(2048, ref_tok, "completion"))
    assert chat.messages and chat.prompt is None and comp.prompt and comp.messages is None
    assert chat.answers == comp.answers
    assert comp.prompt.rstrip().endswith("mentioned in the provided text is")
    assert chat.messages[-1] == {"role": "assistant", "content": comp.metadata["answer_prefix"]}


@pytest.mark.parametrize("name,one", [("niah_single", True), ("niah_mk3", True), ("niah_mv", False)])
def test_niah_wording_and_prefill_follow_ruler(name, one, ref_tok):
    """RULER's singular rewrite when one value is asked; the answer prefix opens the
    assistant turn in chat mode, so the model's output starts with the value."""
    s = get_task(name).build(0, BuildSpec(2048, ref_tok, "chat"))
    user, prefill = s.messages[-2]["content"], s.messages[-1]
    key, vtype = s.metadata["key"], "uuid" if name == "niah_mk3" else "number"
    if one:
        assert user.startswith(f"A special magic {vtype} is hidden within the following text.")
        assert user.endswith(f"What is the special magic {vtype} for {key} mentioned in the provided text?")
        assert prefill == {"role": "assistant",
                           "content": f"The special magic {vtype} for {key} mentioned in the provided text is"}
    else:
        assert user.startswith("Some special magic numbers are hidden")
        assert prefill["content"].endswith(f"for {key} mentioned in the provided text are")
    assert f"One of the special magic {vtype}s for {key} is: {s.answers[0]}." in user  # needle stays plural
    gold = s.score(" " + ", ".join(s.answers) + ".")  # a continuation of the prefix
    assert gold["score"] == 1.0 and gold["parsed"] == ", ".join(s.answers) + "."
