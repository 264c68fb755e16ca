"""inspect-ai on both sides (issue 21): the real `inspect eval` (a subprocess, its own CLI) with its
OpenAI-compatible providers against the real `msa-eval serve` (default model, dense, CPU) on three
samples of our tasks exported as an inspect task (msa_eval/inspect_task.py), scored with our metric;
its answers equal those of `msa-eval run --backend openai` against the same server (greedy), and
`msa-eval export --format inspect` writes that run as inspect eval logs which inspect_ai's reader
and `inspect view`'s server read back.

Two tasks, one per provider kind: niah_single (its chat prompt ends with an assistant prefill, so
it goes out as text: `openai-api-completions/...`) and json_kv (a plain chat: `openai-api/...`),
json_kv at max_tokens 8 so the test stays short. `inspect eval` runs as a subprocess, as a user
runs it: its start (about 10 s of imports) is small beside the generation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest

from msa_eval.report.load import load_run
from msa_eval.runner.records import SampleRecord, append_records
from tests.engine.serve_process import free_port, running_server

from .conftest import msa_eval_cmd

pytest.importorskip("inspect_ai")

MODEL = "smollm2-135m"
REPO = Path(__file__).resolve().parents[2]
TASK_FILE = "msa_eval/inspect_task.py"  # relative to the working directory: inspect-ai 0.3.285 refuses an absolute one
SUITE = """name: inspect_pair
mode: chat
seed: 42
samples: 3
lengths: [1k]
tasks:
  - niah_single
  - {name: json_kv, max_tokens: 8}
"""
# task -> (inspect model, task args beyond the task's name): each sample sent the way msa-eval run sends it
CASES = {"niah_single": (f"openai-api-completions/msa/{MODEL}", []),
         "json_kv": (f"openai-api/msa/{MODEL}", ["-T", "max_tokens=8"])}


def _inspect_bin() -> str:
    exe = Path(sys.executable).with_name("inspect")
    return str(exe) if exe.exists() else "inspect"


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-model-len", "2048") as url:
        yield url


@pytest.fixture(scope="module")
def our_run(base_url, tmp_path_factory):
    """`msa-eval run` of the two tasks (3 samples each, 1K, seed 42) through our openai backend."""
    d = tmp_path_factory.mktemp("inspect_run")
    (d / "suite.yaml").write_text(SUITE)
    out = subprocess.run(msa_eval_cmd("run", str(d / "suite.yaml"), "--backend", "openai", "--base-url", base_url,
                                      "--model", MODEL, "--out", str(d / "run")),
                         cwd=d, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return d / "run"


@pytest.fixture(scope="module")
def inspect_logs(base_url, tmp_path_factory):
    """task -> the log of `inspect eval msa_eval/inspect_task.py -T task=TASK` (both run at once)."""
    d = tmp_path_factory.mktemp("inspect_logs")
    env = {**os.environ, "MSA_BASE_URL": base_url, "MSA_API_KEY": "unused"}
    procs = {}
    for task, (model, args) in CASES.items():
        cmd = [_inspect_bin(), "eval", TASK_FILE, "--model", model, "-T", f"task={task}", *args,
               "--log-dir", str(d / task), "--display", "plain", "--log-format", "eval"]
        procs[task] = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=env)
    logs = {}
    for task, p in procs.items():
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
        [log] = (d / task).glob("*.eval")
        logs[task] = log
    return logs


def _records(run_dir: Path, task: str) -> dict[str, SampleRecord]:
    return {r.sample_id: r for r in load_run(run_dir).records if r.task == task}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(CASES))
def test_inspect_eval_scores_our_metric_and_answers_as_msa_eval_run(task, inspect_logs, our_run):
    from inspect_ai.log import read_eval_log

    from tasks.registry import get_task

    log = read_eval_log(str(inspect_logs[task]), resolve_attachments=True)
    records = _records(our_run, task)
    metric = get_task(task).metric
    assert (log.status, log.eval.task, log.eval.model) == ("success", task, CASES[task][0])
    assert [s.id for s in log.samples] == sorted(records) and len(records) == 3
    for s in log.samples:
        rec = records[s.id]
        assert rec.status == "ok" and rec.output  # a real answer, right or wrong
        assert s.output.completion == rec.output  # greedy: the same tokens through inspect and through our backend
        assert (s.metadata["prompt_hash"], s.metadata["prompt_format"]) == (rec.prompt_hash, rec.prompt_format)
        [(name, score)] = s.scores.items()
        assert (name, score.value, score.answer) == (metric, rec.score, rec.parsed)
        assert score.metadata["extraction_failed"] == rec.extraction_failed
        # the request inspect sent is the one our backend sends: greedy, the task's max_tokens, the sample's seed
        [call] = [e.call for e in s.events if e.event == "model"]
        body = call.request
        assert (body["model"], body["temperature"], body["max_tokens"]) == (MODEL, 0.0, s.metadata["max_tokens"])
        assert body["seed"] == s.metadata["seed"] and "stop" not in body
        if rec.prompt_format == "chat":
            assert [m["role"] for m in body["messages"]] == ["user"] and "prompt" not in body
        else:
            # the reference tokenizer's chat template with the answer prefix opening the assistant turn
            assert rec.prompt_format == "chat-prefill-ref" and body["prompt"] == s.input
            assert body["prompt"].endswith("<|im_start|>assistant\nThe special magic number for "
                                           f"{s.metadata['key']} mentioned in the provided text is")
    [result] = log.results.scores
    assert result.name == metric
    assert result.metrics["mean"].value == pytest.approx(sum(r.score for r in records.values()) / 3)


def test_a_sample_through_the_wrong_kind_of_provider_fails_with_one_line_naming_the_right_one(tmp_path, monkeypatch):
    from inspect_ai import eval as inspect_eval

    from msa_eval.inspect_task import msa_eval

    monkeypatch.setenv("MSA_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # never reached
    monkeypatch.setenv("MSA_API_KEY", "unused")
    for task, model, want in (("niah_single", f"openai-api/msa/{MODEL}", "openai-api-completions/SERVICE/MODEL"),
                              ("json_kv", f"openai-api-completions/msa/{MODEL}", "openai-api/SERVICE/MODEL")):
        [log] = inspect_eval(msa_eval(task=task, samples=1), model=model, log_dir=str(tmp_path), display="none")
        assert log.status == "error"
        message = log.samples[0].error.message
        assert f"sample {task}/1024/0000 goes out as" in message and f"use --model {want}" in message
        assert "\n" not in message


def _view_get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30)


@pytest.mark.slow
def test_export_inspect_reads_back_and_inspect_view_serves_it(our_run, run_cli, tmp_path):
    from inspect_ai.log import read_eval_log

    out = tmp_path / "logs"
    res = run_cli("export", str(our_run), "--format", "inspect", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert f"6 records of {our_run} written as 1 inspect eval log: {out}" in res.stdout + res.stderr
    [path] = out.iterdir()
    assert path.name == f"inspect_pair_openai-{MODEL}.eval"
    log = read_eval_log(str(path))
    records = {r.sample_id: r for r in load_run(our_run).records}
    assert (log.status, log.eval.task, log.eval.model) == ("success", "inspect_pair", f"msa-eval/openai:{MODEL}")
    assert log.eval.model_base_url == json.loads((our_run / "manifest.json").read_text())["config"]["backends"][0][
        "base_url"]
    assert sorted(s.id for s in log.samples) == sorted(records) and len(records) == 6
    for s in log.samples:
        rec = records[s.id]
        assert SampleRecord.model_validate(s.metadata) == rec  # the whole record
        assert (s.output.completion, s.target) == (rec.output, rec.answers)
        assert {k: (v.value, v.answer) for k, v in s.scores.items()} == {rec.metric: (rec.score, rec.parsed)}
        assert s.output.usage.input_tokens == rec.prompt_tokens and s.error is None
    means = {e.name: e.metrics["mean"].value for e in log.results.scores}
    want = {}
    for rec in records.values():
        want.setdefault(rec.metric, []).append(rec.score)
    assert means == pytest.approx({m: sum(v) / len(v) for m, v in want.items()}) and len(means) == 2

    # inspect view starts on the folder; its own server lists the log and reads it (the browser UI is not run)
    port = free_port()
    view = subprocess.Popen([_inspect_bin(), "view", "--log-dir", str(out), "--host", "127.0.0.1", "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert view.poll() is None, "inspect view exited"
            try:
                if _view_get(port, "/").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "inspect view did not start in 120 s"
            time.sleep(0.5)
        files = _view_get(port, "/api/log-files").json()["files"]
        assert [(Path(urllib.parse.urlparse(f["name"]).path), f["task"]) for f in files] == [(path, "inspect_pair")]
        served = _view_get(port, "/api/logs/" + urllib.parse.quote(str(path), safe=""))
        assert served.status_code == 200
        assert sorted(s["id"] for s in served.json()["samples"]) == sorted(records)
    finally:
        view.terminate()
        view.wait(timeout=30)

    res = run_cli("export", str(our_run), "--format", "inspect", "--out", str(out))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"error: {out} exists: pass --force to replace it, or choose another --out"]
    assert run_cli("export", str(our_run), "--format", "inspect", "--out", str(out), "--force").returncode == 0
    assert [p.name for p in out.iterdir()] == [path.name]


@pytest.mark.slow
def test_export_inspect_writes_one_log_per_backend_and_error_records_as_errors(our_run, tmp_path):
    import shutil

    from inspect_ai.log import read_eval_log

    from msa_eval.inspect_log import write_inspect_logs

    run_dir = tmp_path / "run"
    shutil.copytree(our_run, run_dir)
    real = load_run(run_dir).records[0]
    failed = SampleRecord.model_validate(real.model_dump() | {
        "backend": "local:msa", "status": "error", "output": None, "parsed": None, "score": 0.0,
        "extraction_failed": True, "error": "BackendError: the server went away", "finish_reason": "error"})
    append_records(run_dir / "records.jsonl", [failed])
    run = load_run(run_dir)
    out = write_inspect_logs(run.records, run.manifest, run_dir, tmp_path / "logs")
    assert sorted(p.name for p in out.iterdir()) == ["inspect_pair_local-msa.eval", f"inspect_pair_openai-{MODEL}.eval"]
    log = read_eval_log(str(out / "inspect_pair_local-msa.eval"))
    [s] = log.samples
    assert log.eval.model == "msa-eval/local:msa" and s.id == real.sample_id
    assert s.error.message == "BackendError: the server went away" and s.output.completion == ""
    assert s.scores[real.metric].value == 0.0 and SampleRecord.model_validate(s.metadata) == failed
    assert log.results.scores[0].metrics["mean"].value == 0.0


def test_help_does_not_import_inspect_and_a_missing_inspect_names_the_extra(monkeypatch, tmp_path):
    code = ("import sys; from msa_eval.cli import cli; cli.main(['export', '--help'], standalone_mode=False); "
            "print('inspect_ai' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "inspect view --log-dir" in out.stdout and out.stdout.strip().splitlines()[-1] == "False"

    from msa_eval.errors import MsaEvalError
    from msa_eval.inspect_log import write_inspect_logs

    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # `import inspect_ai.log` now raises ImportError
    monkeypatch.setitem(sys.modules, "inspect_ai.log", None)
    with pytest.raises(MsaEvalError, match=r"needs inspect-ai: pip install 'msa-eval\[inspect\]'"):
        write_inspect_logs([], {}, tmp_path, tmp_path / "logs")
    assert not (tmp_path / "logs").exists()
