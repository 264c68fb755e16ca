"""Real-data loaders on files in HELMET's and RULER's formats (written here, as a user would have them)."""
import json
import random
import uuid

import pytest

from tasks.base import BuildSpec, TaskError
from tasks.registry import all_tasks


def _uuid(r):
    return str(uuid.UUID(int=r.getrandbits(128), version=4))


@pytest.fixture
def helmet_file(tmp_path):
    r = random.Random(0)
    rows = []
    for _ in range(3):
        kv = {_uuid(r): _uuid(r) for _ in range(120)}  # ~8K tokens: longer than the 2K target
        key = list(kv)[5]  # near the start: survives end-of-context truncation
        rows.append({"context": "JSON data:\n" + json.dumps(kv), "question": f'"{key}"',
                     "answer": kv[key], "num_kvs": 120})
    p = tmp_path / "test_k120_dep6.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return p, rows


def test_helmet_json_kv_file_truncates_context_only(helmet_file, ref_tok):
    path, rows = helmet_file
    task = all_tasks()["helmet_json_kv_file"](path=str(path))
    s = task.build(1, BuildSpec(2048, ref_tok, "completion"))
    assert s.answers == [rows[1]["answer"]]
    assert s.metadata["truncated_tokens"] > 2000
    assert s.metadata["prompt_tokens"] + s.max_tokens <= 2048
    assert s.prompt.startswith("JSON data:\n{")
    assert s.prompt.rstrip().endswith(f"Key: {rows[1]['question']}\nCorresponding value:")
    assert s.score(f" {rows[1]['answer']}")["score"] == 1.0
    assert s.score("no idea")["score"] == 0.0


def test_ruler_file_reads_rows_and_refuses_too_long(tmp_path, ref_tok):
    p = tmp_path / "validation_2048.jsonl"
    p.write_text(json.dumps({"index": 0, "input": "The grass is green. " * 60 + "What is the number?",
                             "outputs": ["42", "43"], "answer_prefix": " Answer:"}) + "\n")
    task = all_tasks()["ruler_file"](path=str(p))
    s = task.build(0, BuildSpec(2048, ref_tok, "completion"))
    assert s.answers == ["42", "43"] and s.prompt.endswith("Answer:")
    assert s.score("42 and 43")["score"] == 1.0 and s.score("42")["score"] == 0.5
    with pytest.raises(TaskError, match="more than length"):
        task.build(0, BuildSpec(256, ref_tok, "completion"))
    with pytest.raises(TaskError, match="has 1 rows"):
        task.build(1, BuildSpec(2048, ref_tok, "completion"))


def test_missing_or_bad_files_are_one_line_errors(tmp_path, ref_tok):
    spec = BuildSpec(2048, ref_tok, "chat")
    with pytest.raises(TaskError, match="not found"):
        all_tasks()["ruler_file"](path=str(tmp_path / "nope.jsonl")).build(0, spec)
    with pytest.raises(TaskError, match="needs options"):
        all_tasks()["helmet_json_kv_file"]().build(0, spec)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x"}\n')
    with pytest.raises(TaskError, match="no 'question' field"):
        all_tasks()["helmet_json_kv_file"](path=str(bad)).build(0, spec)
