"""Real-data loaders on files in HELMET's and RULER's formats (written here, as a user would have them)."""
import json
import random
import uuid

import pytest

from tasks.base import BuildSpec, TaskError
from tasks.loaders.files import HelmetJsonKVFile, LongBenchV2File, RulerFile
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


def test_helmet_file_as_parquet_and_json_array_reads_the_same_rows(helmet_file, ref_tok, tmp_path):
    """The same rows as parquet (written by `datasets`) and as one JSON array build the same samples."""
    datasets = pytest.importorskip("datasets")
    path, rows = helmet_file
    pq, arr = tmp_path / "test_k120_dep6.parquet", tmp_path / "test_k120_dep6.json"
    datasets.Dataset.from_list(rows).to_parquet(str(pq))
    arr.write_text(json.dumps(rows))
    spec = BuildSpec(2048, ref_tok, "completion")
    want = [HelmetJsonKVFile(path=str(path)).build(i, spec) for i in range(3)]
    for p in (pq, arr):
        got = [HelmetJsonKVFile(path=str(p)).build(i, spec) for i in range(3)]
        assert [(s.prompt, s.answers, s.metadata["truncated_tokens"]) for s in got] == \
            [(s.prompt, s.answers, s.metadata["truncated_tokens"]) for s in want]
        assert got[2].answers == [rows[2]["answer"]]


def test_longbench_v2_file_prompt_truncation_and_parse(tmp_path, ref_tok):
    """A LongBench-v2 data.json (a JSON array; a row without `difficulty` reads as None): its zero-shot prompt
    with the four choices, the context cut to the length, the answer parsed from "The correct answer is (X)"."""
    row = {"_id": "x1", "domain": "Single-Document QA", "difficulty": "easy", "length": "short",
           "question": "What colour is the grass?", "choice_A": "blue", "choice_B": "green", "choice_C": "red",
           "choice_D": "white", "answer": "B", "context": "The grass is green and the sky is blue. " * 400}
    other = {k: v for k, v in row.items() if k != "difficulty"} | {"_id": "x2", "answer": "D"}
    p = tmp_path / "data.json"
    p.write_text(json.dumps([row, other]))
    task = LongBenchV2File(path=str(p))
    s = task.build(0, BuildSpec(1024, ref_tok, "completion"))
    assert s.prompt is not None and s.answers == ["B"] and s.metadata["truncated_tokens"] > 2000
    assert s.metadata["prompt_tokens"] + s.max_tokens <= 1024
    assert s.prompt.startswith("Please read the following text and answer the question below.\n\n<text>\nThe grass")
    tail = ("\n</text>\n\nWhat is the correct answer to this question: What colour is the grass?\nChoices:\n"
            "(A) blue\n(B) green\n(C) red\n(D) white\n\nFormat your response as follows:")
    assert tail in s.prompt
    assert s.score("The correct answer is (B)")["score"] == 1.0
    assert s.score("**The correct answer is B**")["score"] == 1.0
    assert s.score("The correct answer is (A)")["score"] == 0.0
    assert s.score("green")["extraction_failed"]
    second = task.build(1, BuildSpec(1024, ref_tok, "chat"))
    assert second.answers == ["D"] and second.metadata["difficulty"] is None


def test_damaged_files_are_one_line_errors_naming_the_file(tmp_path, ref_tok):
    spec = BuildSpec(2048, ref_tok, "completion")
    cases = {"damaged.jsonl": ('{"input": "a", "outputs": ["1"]}\nnot json\n', "cannot be read as json"),
             "damaged.parquet": ("PAR1 this is not parquet", "cannot be read as parquet"),
             "empty.jsonl": ("", "holds no rows"),
             "rows.csv": ("input,outputs\n", "unknown suffix")}
    for name, (text, message) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(TaskError, match=message) as e:
            RulerFile(path=str(p)).build(0, spec)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
