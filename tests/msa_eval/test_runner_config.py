"""Runner config, run directories and bad input: no model is loaded here (tokenizer only)."""
import json

import pytest

from msa_eval.cli.run_setup import RunArgs, prepare
from msa_eval.runner.config import ConfigError, load_suite, parse_length, suite_from_dict
from msa_eval.runner.manifest import open_run_dir
from msa_eval.runner.records import SampleRecord, append_records, read_records, repair_records


def args(tmp_path, **kw):
    base = dict(suite="helmet", backend="local", model=None, attention="dense", base_url=None,
                reference=None, lengths="2k", samples=1, tasks="niah_single", mode=None, seed=None,
                concurrency=None, limit=None, out=tmp_path / "run")
    base.update(kw)
    return RunArgs(**base)


def test_parse_length_and_suite_validation():
    assert parse_length("2k") == 2048 and parse_length("7.5k") == 7680 and parse_length(4096) == 4096
    with pytest.raises(ConfigError, match="bad length"):
        parse_length("two")
    with pytest.raises(ConfigError, match="Extra inputs"):
        suite_from_dict({"name": "x", "tasks": ["json_kv"], "stop_new_line": True}, "x.yaml")
    s = load_suite("helmet")
    assert s.name == "helmet" and s.lengths and s.tasks and s.attention == ("dense", "msa", "msa-oracle")
    assert len(load_suite("helmet_all").tasks) >= 9
    full = load_suite("helmet_full")
    assert full.lengths == () and len(full.tasks) >= 16


def test_helmet_all_covers_every_category():
    """`make run` is one task; helmet_all (named by the report's "not run" line) has every category."""
    from msa_eval.report.build import ALL_SUITE, CATEGORY_ORDER
    from tasks.helmet import CATEGORIES
    from tasks.registry import all_tasks

    cats = {all_tasks()[t.name].category for t in load_suite(ALL_SUITE).tasks}
    assert cats >= set(CATEGORIES) and cats == set(CATEGORY_ORDER)


def test_the_suite_names_the_default_arms(tmp_path):
    """No --attention: the suite's `attention` arms (helmet: dense, msa, msa-oracle); the flag overrides; a suite
    without the field runs both (msa, dense); the arms are the backends, so the field is not hashed twice."""
    a = prepare(args(tmp_path, attention=None))
    assert [b.attention for b in a.cfg.backends] == ["dense", "msa", "msa-oracle"]
    assert "attention" not in a.cfg.identity()["suite"]
    b = prepare(args(tmp_path, attention="msa", out=tmp_path / "b"))
    assert [x.attention for x in b.cfg.backends] == ["msa"]
    c = prepare(args(tmp_path, suite="helmet_full", attention=None, out=tmp_path / "c"))
    assert [x.attention for x in c.cfg.backends] == ["msa", "dense"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntasks: [niah_single]\nattention: [dense, sparse]\n")
    with pytest.raises(ConfigError, match="attention: unknown attention arm sparse"):
        prepare(args(tmp_path, suite=str(bad), attention=None, out=tmp_path / "d"))


def test_changed_config_is_refused_and_gets_a_new_default_dir(tmp_path):
    a = prepare(args(tmp_path))
    open_run_dir(a.run_dir, a.cfg, a.reference_info)
    same = prepare(args(tmp_path, limit=1))  # --limit does not change the config
    assert same.cfg.config_hash() == a.cfg.config_hash()
    open_run_dir(same.run_dir, same.cfg, same.reference_info)
    b = prepare(args(tmp_path, samples=2))
    assert b.cfg.config_hash() != a.cfg.config_hash()
    with pytest.raises(ConfigError, match="another config"):
        open_run_dir(b.run_dir, b.cfg, b.reference_info)
    default_a = prepare(args(tmp_path, out=None)).run_dir
    default_b = prepare(args(tmp_path, out=None, samples=2)).run_dir
    assert default_a != default_b and a.cfg.config_hash() in str(default_a)


def test_identical_prompts_for_local_and_openai_plans(tmp_path):
    local = prepare(args(tmp_path, tasks="json_kv,rag"))
    remote = prepare(args(tmp_path, backend="openai", model="some-model", base_url="http://127.0.0.1:9/v1",
                          tasks="json_kv,rag", out=tmp_path / "r2"))
    h = lambda p: [s.prompt_hash() for t in p.plan for s in t.samples]  # noqa: E731
    assert h(local) == h(remote)


def test_openai_response_cache_defaults_to_the_run_dir(tmp_path):
    remote = dict(backend="openai", model="some-model", base_url="http://127.0.0.1:9/v1")
    default = prepare(args(tmp_path, **remote))
    assert default.cfg.backends[0].options["cache_dir"] == str(tmp_path / "run" / "cache")
    own = prepare(args(tmp_path, **remote, backend_opts=(f"cache_dir={tmp_path / 'mine'}",)))
    assert own.cfg.backends[0].options["cache_dir"] == str(tmp_path / "mine")  # the user's wins
    assert own.cfg.config_hash() == default.cfg.config_hash()  # where the cache lives is no identity
    local = prepare(args(tmp_path))
    assert "cache_dir" not in local.cfg.backends[0].options  # the local backend takes no cache


def test_partial_trailing_line_is_dropped(tmp_path):
    rec = SampleRecord(backend="local:dense", sample_id="a/1/0", task="a", category="recall", length=2048,
                       mode="chat", status="ok", prompt_hash="x", prompt_tokens_ref=10, answers=["1"],
                       output="1", parsed="1", score=1.0, metric="subem", extraction_failed=False)
    p = tmp_path / "records.jsonl"
    append_records(p, [rec, rec.model_copy(update={"sample_id": "a/1/1"})])
    with open(p, "a") as f:
        f.write('{"backend": "local:dense", "sample_id": "a/1/2", "ta')  # kill -9 mid-write
    before = p.read_bytes()
    got = read_records(p)
    assert [r.sample_id for r in got] == ["a/1/0", "a/1/1"]
    assert p.read_bytes() == before  # readers never write (issue 19); the runner repairs:
    assert [r.sample_id for r in repair_records(p)[0]] == ["a/1/0", "a/1/1"]
    assert p.read_text().endswith("\n") and len(p.read_text().splitlines()) == 2


@pytest.mark.parametrize("argv,needle", [
    (["run", "helmet", "--tasks", "nope", "--dry-run"], "unknown task 'nope'"),
    (["run", "helmet", "--lengths", "16k", "--dry-run"], "beyond the model's context of 8192"),
    (["run", "helmet", "--lengths", "abc", "--dry-run"], "bad length"),
    (["run", "nosuite", "--dry-run"], "no suite 'nosuite'"),
    (["run", "helmet", "--backend", "openai", "--dry-run"], "needs --base-url"),
    (["report", "does-not-exist"], "not an msa-eval run directory"),
    (["tasks", "show", "nope"], "unknown task"),
])
def test_bad_input_is_one_clear_line(run_cli, argv, needle):
    p = run_cli(*argv)
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_unreachable_endpoint_is_one_line(run_cli, tmp_path):
    p = run_cli("run", "helmet", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1",
                "--model", "m", "--tasks", "icl", "--lengths", "2k", "--samples", "2", "--out", "r",
                "--backend-opt", "max_retries=0")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.strip().splitlines() if x.strip() and "error" in x.lower()]
    assert len(lines) == 1 and "in a row failed" in lines[0], p.stderr
    assert "error" in p.stderr.lower() and "Traceback" not in p.stderr, p.stderr[-2000:]
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["status"] == "error" and manifest["error"]


def test_dry_run_prints_token_counts(run_cli):
    p = run_cli("run", "helmet", "--dry-run", "--tasks", "json_kv,icl", "--lengths", "2k,4k")
    assert p.returncode == 0, p.stderr
    assert "json_kv" in p.stdout and "4096" in p.stdout and "icl" in p.stdout


def test_tasks_list_and_show(run_cli):
    p = run_cli("tasks", "list", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert rows["json_kv"]["fidelity"] == "faithful" and rows["rag"]["fidelity"] == "analogue"
    assert rows["ruler_file"]["fidelity"] == "real-data"
    p = run_cli("tasks", "show", "niah_mv", "--length", "2k", "--json")
    assert p.returncode == 0, p.stderr
    sample = json.loads(p.stdout)["sample"]
    assert sample["id"] == "niah_mv/2048/0000" and len(sample["answers"]) == 4
    user = [m["content"] for m in sample["messages"] if m["role"] == "user"][-1]
    assert all(a in user for a in sample["answers"])
    assert sample["messages"][-1]["role"] == "assistant"  # the answer prefix, continued by the model


def test_dry_run_json_prints_prompts_identical_across_modes_of_backends(run_cli):
    p = run_cli("run", "helmet", "--dry-run", "--json", "--tasks", "icl", "--lengths", "2k")
    q = run_cli("run", "helmet", "--dry-run", "--json", "--tasks", "icl", "--lengths", "2k",
                "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "x")
    assert p.returncode == 0 and q.returncode == 0, p.stderr + q.stderr
    a, b = json.loads(p.stdout), json.loads(q.stdout)
    assert [s["prompt_hash"] for s in a] == [s["prompt_hash"] for s in b] and a[0]["messages"]


def _tok():
    from msa_eval.runner.reference import load_reference_tokenizer

    return load_reference_tokenizer("smollm2-135m")[0]


def test_suite_msa_overrides_and_per_task_lengths(tmp_path):
    a = prepare(args(tmp_path, tasks=None, samples=None, lengths=None, attention="both"))
    msa, dense = a.cfg.backends
    assert msa.attention == "msa" and msa.options["msa_overrides"] == load_suite("helmet").msa_overrides
    assert "msa_overrides" not in dense.options
    from dataclasses import replace

    from msa_eval.runner.config import TaskEntry
    from msa_eval.runner.plan import build_plan

    suite = replace(load_suite("helmet"), tasks=(TaskEntry("niah_single", lengths=(2048, 4096)), TaskEntry("rag")))
    plan = build_plan(suite, (2048,), _tok(), limit=1)
    assert [(p.task.name, p.length) for p in plan] == [("niah_single", 2048), ("niah_single", 4096), ("rag", 2048)]
    b = prepare(args(tmp_path, tasks=None, samples=None, lengths="2k", attention="both",
                     backend_opts=("msa_overrides={topk: 8}",), out=tmp_path / "b"))
    assert {p.length for p in b.plan} == {2048}  # --lengths applies to every task
    assert b.cfg.backends[0].options["msa_overrides"]["topk"] == 8
    assert b.cfg.config_hash() != a.cfg.config_hash()


def test_attention_arms_are_a_comma_list(tmp_path):
    """`--attention dense,msa,msa-oracle`: one local backend per arm, in order, on the same plan; `both` = msa,dense."""
    a = prepare(args(tmp_path, attention="dense,msa,msa-oracle,msa"))
    assert [b.attention for b in a.cfg.backends] == ["dense", "msa", "msa-oracle"]
    assert all(b.options["msa_overrides"] == load_suite("helmet").msa_overrides for b in a.cfg.backends[1:])
    b = prepare(args(tmp_path, attention="both", out=tmp_path / "b"))
    assert [x.attention for x in b.cfg.backends] == ["msa", "dense"]
    with pytest.raises(ValueError, match="unknown attention arm sparse"):
        args(tmp_path, attention="dense,sparse")


def test_engine_settings_from_the_command_line_reach_the_local_backend(tmp_path):
    """`run --weights / --kv-cache-tokens / --no-dequant-cache` (or their MSA_EVAL_* variables, read by
    click) become local backend options under any --backend-opt; only the weight mode, which changes the
    numbers, is part of the config hash."""
    from msa_eval.cli.options import engine_kwargs

    assert engine_kwargs(None, None, False) == {} and engine_kwargs(None, 0, False) == {}
    plain = prepare(args(tmp_path, out=tmp_path / "p"))
    sized = prepare(args(tmp_path, out=tmp_path / "s", engine_opts=engine_kwargs(None, 4096, True)))
    assert sized.cfg.backends[0].options == {"kv_cache_tokens": 4096, "dequant_cache": False}
    assert sized.cfg.config_hash() == plain.cfg.config_hash()
    q4 = prepare(args(tmp_path, out=tmp_path / "q", engine_opts=engine_kwargs("q4", None, False),
                      backend_opts=("kv_cache_tokens=8192",)))
    assert q4.cfg.backends[0].options == {"weights": "q4", "kv_cache_tokens": 8192}
    assert q4.cfg.config_hash() != plain.cfg.config_hash()
