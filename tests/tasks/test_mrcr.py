"""The MRCR-style task: seeded determinism, lengths within 1% under the reference tokenizer (2K-32K, and
128K), the conversation's structure (k identical needle requests, the asked one's answer is the gold),
OpenAI-MRCR's grading, and the too-short length's one line."""
from __future__ import annotations

import re

import pytest

from tasks.base import BuildSpec, TaskError
from tasks.helmet.mrcr import VERSION, ordinal, request
from tasks.metrics import prefixed_similarity
from tasks.registry import get_task
from tests.tasks.lengths import check


def turns_of(sample) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in sample.messages]


def test_ordinals_are_written_as_openai_mrcr_writes_them():
    assert [ordinal(i) for i in (1, 2, 3, 4, 8, 11, 12, 13, 21, 22, 23, 101)] == [
        "1st", "2nd", "3rd", "4th", "8th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st"]


def test_same_seed_same_bytes_other_seed_other_prompt(ref_tok):
    for mode in ("chat", "completion"):
        a = get_task("mrcr").build(4, BuildSpec(4096, ref_tok, mode, seed=3))
        b = get_task("mrcr").build(4, BuildSpec(4096, ref_tok, mode, seed=3))
        c = get_task("mrcr").build(4, BuildSpec(4096, ref_tok, mode, seed=4))
        assert a.to_dict() == b.to_dict() and a.prompt_text() == b.prompt_text()
        assert a.prompt_hash() != c.prompt_hash()


@pytest.mark.parametrize("length", [2048, 4096, 8192, 32768])
@pytest.mark.parametrize("mode", ["chat", "completion"])
@pytest.mark.parametrize("index", range(3))  # needle counts 2, 4, 8
def test_within_one_percent(length, mode, index, ref_tok):
    check(get_task("mrcr").build(index, BuildSpec(length, ref_tok, mode)), length, ref_tok)


@pytest.mark.slow
def test_within_one_percent_at_128k(ref_tok):
    s = get_task("mrcr_8").build(0, BuildSpec(131072, ref_tok, "chat"))
    check(s, 131072, ref_tok)
    assert s.metadata["rounds"] > 1000


@pytest.mark.parametrize("name,k", [("mrcr_2", 2), ("mrcr_4", 4), ("mrcr_8", 8)])
def test_the_asked_needle_is_the_gold(name, k, ref_tok):
    for index in range(3):
        s = get_task(name).build(index, BuildSpec(4096, ref_tok, "chat"))
        m = s.metadata
        assert m["needles"] == k and m["task_version"] == VERSION and 1 <= m["asked"] <= k
        turns = turns_of(s)
        assert [r for r, _ in turns] == ["user", "assistant"] * m["rounds"] + ["user"]
        ask = request(m["format"], m["topic"])
        at = [i for i, (r, c) in enumerate(turns) if r == "user" and c == ask]
        assert len(at) == k  # the needle requests, and no filler asks the same
        answers = [turns[i + 1][1] for i in at]
        assert len(set(answers)) == k  # each needle has its own answer
        assert s.answers == [m["prefix"] + answers[m["asked"] - 1]]
        assert turns[-1][1] == (f"Prepend {m['prefix']} to the {ordinal(m['asked'])} (1 indexed) {m['format']} "
                                f"about {m['topic']}. Do not include any other text in your response.")
        assert re.fullmatch(r"[A-Za-z0-9]{10}", m["prefix"])
        assert m["depth"] == pytest.approx((at[m["asked"] - 1] // 2) / (m["rounds"] - 1))
        assert m["needle_depths"] == pytest.approx([(i // 2) / (m["rounds"] - 1) for i in at], abs=1e-4)
        # distractors share the needle's format or topic, never both
        fillers = [c for r, c in turns[:-1] if r == "user" and c != ask]
        assert any(f" {m['format']} about " in c for c in fillers)
        assert any(c.endswith(f" {m['topic']}.") for c in fillers)
        sizes = [len(ref_tok.encode(a)) for a in answers]
        assert 30 <= min(sizes) and max(sizes) <= 150, sizes
        # no sentence of a needle's answer occurs in another turn (the answer is not found by content)
        others = " ".join(c for i, (r, c) in enumerate(turns) if r == "assistant" and i - 1 not in at)
        asked = answers[m["asked"] - 1].replace("\n", " ")
        gold_sentences = [x for x in re.split(r"(?<=[.!?]) ", asked) if len(x.split()) >= 6]
        assert not any(x in others for x in gold_sentences)


def test_mrcr_cycles_two_four_eight_needles(ref_tok):
    counts = [get_task("mrcr").build(i, BuildSpec(4096, ref_tok, "chat")).metadata["needles"] for i in range(6)]
    assert counts == [2, 4, 8, 2, 4, 8]


def test_completion_mode_is_a_transcript_with_the_same_answers(ref_tok):
    chat = get_task("mrcr_4").build(1, BuildSpec(4096, ref_tok, "chat"))
    comp = get_task("mrcr_4").build(1, BuildSpec(4096, ref_tok, "completion"))
    assert comp.messages is None and comp.prompt.endswith("\n\nAssistant:")
    assert comp.metadata["answer_prefix"] == "Assistant:" and chat.metadata["answer_prefix"] == ""
    assert chat.answers == comp.answers and chat.prompt is None
    assert comp.prompt.count("User: " + request(comp.metadata["format"], comp.metadata["topic"]) + "\n\n") == 4
    assert "\n\nUser:" in comp.stop
    # the model continues after "Assistant:", with a leading space
    assert comp.score(" " + comp.answers[0] + "\n")["score"] == 1.0


def test_grading_follows_openai_mrcr(ref_tok):
    s = get_task("mrcr_4").build(2, BuildSpec(4096, ref_tok, "chat"))
    gold, prefix = s.answers[0], s.metadata["prefix"]
    body = gold[len(prefix):]
    assert s.score(gold)["score"] == 1.0 and s.score(gold)["extraction_failed"] is False
    for wrapped in (f"  {gold}\n", f'"{gold}"', f"```\n{gold}\n```", f"'{gold}'"):
        assert s.score(wrapped)["score"] == 1.0, wrapped
    assert s.score(body)["score"] == 0.0 and s.score(body)["extraction_failed"] is True  # no prefix: 0
    assert s.score(body)["prefix_found"] == 0.0 and s.score(body)["similarity"] == 1.0  # copied, no prefix
    assert s.score("Sure! " + gold)["score"] == 0.0  # the response must start with the prefix
    half = s.score(prefix + body[: len(body) // 2])["score"]
    assert 0.3 < half < 0.9  # a partial copy scores in between
    other = [c for r, c in turns_of(s) if r == "assistant" and prefix + c != gold][0]
    assert s.score(prefix + other)["score"] < 0.5  # another answer scores low
    assert s.score("")["score"] == 0.0 and s.score(None)["extraction_failed"] is True
    assert prefixed_similarity(gold, gold, "") == 0.0


def test_a_length_too_short_names_the_minimum(ref_tok):
    with pytest.raises(TaskError, match=r"^target length 512 is too small for task mrcr_8 \(needs > \d+ tokens\); "
                                        r"pick a longer length$") as e:
        get_task("mrcr_8").build(0, BuildSpec(512, ref_tok, "chat"))
    assert int(re.search(r"needs > (\d+)", str(e.value)).group(1)) > 512


def test_the_version_and_the_extra_metric_reach_the_records(ref_tok):
    from msa_eval.backends.base import GenResult
    from msa_eval.runner.run import to_record

    s = get_task("mrcr").build(0, BuildSpec(2048, ref_tok, "chat"))
    rec = to_record("local:dense", s, GenResult(id=s.id, text=s.answers[0]))
    assert rec.task_version == VERSION and rec.score == 1.0 and rec.metrics == {"prefix_found": 1.0, "similarity": 1.0}
    assert to_record("local:dense", get_task("niah_single").build(0, BuildSpec(2048, ref_tok, "chat")),
                     GenResult(id="x", text="1")).task_version is None
