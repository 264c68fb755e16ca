"""The optional judge (`msa-eval run --judge SPEC`): rubric prompt, score parsing, spec
parsing, and a real run through the CLI against two scripted OpenAI servers (one answers
the tasks, one judges): the verdicts land in each open-ended record's `judge` field and in a
separate report section, never in the headline; a rerun judges nothing again; a changed
judge re-judges."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from msa_eval.cli import cli
from msa_eval.judge import JudgeError, judge_key, judge_messages, parse_judge_score, parse_judge_spec
from msa_eval.report import build_report, load_runs
from msa_eval.report.writers import to_markdown
from tests.msa_eval.scripted_openai_server import ScriptedOpenAI


@pytest.mark.parametrize("text,score", [
    ("Score: 2", 2), ("score:3\n", 3), ("**Score:** 1", 1), ("0", 0), ("Score: 1. On reflection, Score: 2", 2),
    ("Score: 7", None), ("The answer is good.", None), ("", None), (None, None),
])
def test_parse_judge_score(text, score):
    assert parse_judge_score(text) == score


def test_parse_judge_spec_forms_and_bad_input():
    assert judge_key(parse_judge_spec("local")) == "local:smollm2-135m"
    s = parse_judge_spec("local:/m/x.gguf:msa")
    assert (s.kind, s.model, s.attention) == ("local", "/m/x.gguf", "msa")
    s = parse_judge_spec("openai:gpt-4o-mini@https://api.openai.com/v1", {"api_key_env": "K"})
    assert (s.kind, s.model, s.base_url, s.options) == ("openai", "gpt-4o-mini", "https://api.openai.com/v1",
                                                        {"api_key_env": "K"})
    assert parse_judge_spec("preset:msa-eval-serve").base_url == "http://127.0.0.1:8000/v1"
    for bad in ("gpt-4o", "openai:gpt-4o", "openai:@http://x/v1"):
        with pytest.raises(JudgeError, match="bad --judge"):
            parse_judge_spec(bad)


def test_rubric_prompt_holds_question_reference_output_not_document():
    (m,) = judge_messages("longqa", "Who gave the lamp to Mara?", ["Kivo"], "It was Kivo.")
    assert m["role"] == "user"
    for part in ("Question: Who gave the lamp to Mara?", "Reference answer: Kivo", "It was Kivo.", "Score: N"):
        assert part in m["content"]
    (s,) = judge_messages("summ", None, ["A gave B a lamp. C gave D a cup."], "")
    assert "key events" in s["content"] and "(empty)" in s["content"]


def _invoke(tmp_path, gen_url, *extra):
    r = CliRunner().invoke(cli, ["run", "helmet", "--backend", "openai", "--base-url", gen_url, "--model", "m",
                                  "--tasks", "longqa,json_kv", "--lengths", "512", "--samples", "2",
                                  "--out", str(tmp_path / "run"), *extra], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def _records(tmp_path):
    return [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]


def test_judge_run_cli_storage_report_and_resume(tmp_path):
    with ScriptedOpenAI(text="Kivo") as gen, ScriptedOpenAI(text="Reasoning... Score: 2") as judge, \
            ScriptedOpenAI(text="no number here") as vague:
        _invoke(tmp_path, gen.base_url)  # first without a judge: the headline as it is
        plain = {r["sample_id"]: r["score"] for r in _records(tmp_path)}
        assert all(r.get("judge") is None for r in _records(tmp_path))
        _invoke(tmp_path, gen.base_url, "--judge", f"openai:j1@{judge.base_url}")
        recs = _records(tmp_path)
        assert {r["sample_id"]: r["score"] for r in recs} == plain  # the judge never touches `score`
        judged = [r for r in recs if r["task"] == "longqa"]
        assert len(judged) == 2 and all(r["judge"]["score"] == 2 and r["judge"]["status"] == "ok" and
                                        r["judge"]["judge"] == "openai:j1" and r["judge"]["rubric"] == "v1"
                                        for r in judged)
        assert all(r.get("judge") is None for r in recs if r["task"] == "json_kv")  # not open-ended
        sent = [q["body"]["messages"][0]["content"] for q in judge.requests]
        assert len(sent) == 2 and all("Reference answer:" in c and "Model answer:\nKivo" in c for c in sent)
        assert all(len(c) < 2000 for c in sent)  # the long story itself is never sent

        _invoke(tmp_path, gen.base_url, "--judge", f"openai:j1@{judge.base_url}")
        assert len(judge.requests) == 2  # resumed: nothing judged twice
        _invoke(tmp_path, gen.base_url, "--judge", f"openai:j2@{vague.base_url}")
        recs = _records(tmp_path)
        assert len(vague.requests) == 2
        assert all(r["judge"]["status"] == "unparsed" and r["judge"]["score"] is None
                   for r in recs if r["task"] == "longqa")

    records = load_runs([tmp_path / "run"])
    rep = build_report(records, n_boot=10)
    assert [(j["judge"], j["task"], j["mean"], j["n"], j["unparsed"]) for j in rep.judge] == \
        [("openai:j2", "longqa", None, 0, 2)]
    overall = next(r for r in rep.rows if r["kind"] == "overall")["cells"]
    stripped = build_report([r.model_copy(update={"judge": None}) for r in records], n_boot=10)
    assert next(r for r in stripped.rows if r["kind"] == "overall")["cells"] == overall  # not in the headline
    md = to_markdown(rep)
    head, _, judge_section = md.partition("## Optional judge (not in the headline)")
    assert judge_section and "openai:j2" in judge_section and "openai:j2" not in head


def test_local_judge_reply_is_opened_with_score_prefill():
    """A judge with its own tokenizer (local) continues "Score:" after the rubric; the
    stored raw reply starts with it, so "Score: 2 ..." parses and "Score: N" does not."""
    from msa_eval.judge_run import SCORE_PREFILL, _request, _verdict

    tok, s, rec = _longqa_record("local:dense")
    local, remote = _request(rec, s, tok), _request(rec, s, None)
    assert local.messages is None and local.prompt.endswith("<|im_start|>assistant\n" + SCORE_PREFILL)
    assert remote.prompt is None and remote.messages[-1]["role"] == "user"
    assert s.metadata["question"] in local.prompt and s.metadata["question"] in remote.messages[0]["content"]
    assert _verdict("k", SCORE_PREFILL + " 2\nbecause", None)["score"] == 2
    assert _verdict("k", SCORE_PREFILL + " N", None)["status"] == "unparsed"
    assert _verdict("k", "", "timeout")["status"] == "error"


def test_judging_sets_a_garbled_line_aside_before_it_rewrites_the_records(tmp_path):
    """judge_run rewrites records.jsonl with the verdicts: an unreadable line goes, byte for byte, to the
    sidecar first (it used to vanish), with the runner's notice."""
    from msa_eval.judge_run import judge_run
    from msa_eval.runner.run import default_factory

    _, s, rec = _longqa_record("openai:m")
    garbled = b'{"backend": "openai:m", "sample_id": "paid-for", \xff\n'
    (tmp_path / "records.jsonl").write_bytes(rec.model_dump_json().encode() + b"\n" + garbled)
    notices = []

    def progress(event, **kw):
        if event == "notice":
            notices.append(kw.get("message"))

    with ScriptedOpenAI(text="Score: 2") as judge:
        counts = judge_run(tmp_path, {s.id: s}, parse_judge_spec(f"openai:j1@{judge.base_url}"), default_factory,
                           progress=progress)
    assert counts["judged"] == 1
    assert (tmp_path / "records.jsonl.bad").read_bytes() == garbled
    assert [json.loads(x)["judge"]["score"] for x in (tmp_path / "records.jsonl").read_text().splitlines()] == [2]
    assert len([n for n in notices if n and "set aside 1 unreadable line" in n]) == 1


def _longqa_record(backend: str):
    """(reference tokenizer, a real longqa sample at 512 tokens, an ok record answering it from `backend`)."""
    from msa_eval.runner.records import SampleRecord
    from msa_eval.runner.reference import load_reference_tokenizer
    from tasks.base import BuildSpec
    from tasks.registry import get_task

    tok = load_reference_tokenizer("smollm2-135m")[0]
    s = get_task("longqa").build(0, BuildSpec(512, tok, "chat"))
    rec = SampleRecord(backend=backend, sample_id=s.id, task=s.task, category=s.category, length=512,
                       mode="chat", status="ok", prompt_hash=s.prompt_hash(), prompt_tokens_ref=1,
                       answers=s.answers, output="It was " + s.answers[0], parsed=None, score=1.0,
                       metric="rougeL_f1", extraction_failed=False)
    return tok, s, rec
