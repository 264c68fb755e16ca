"""records.jsonl under damage (issue 19, defect 10): readers never write, only the runner
repairs, and nothing is lost.

A real run (the runner, the openai backend, the scripted OpenAI server on 127.0.0.1) writes
three records; copies of it get a truncated last line (a kill -9 mid-append), a garbled
middle line, or both. `read_records`, `load_run` and the `msa-eval report` subprocess leave
the file byte-identical; the runner's resume moves the unreadable lines' exact bytes to
`records.jsonl.bad`, prints one notice and generates the lost samples again."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from msa_eval.cli.run_setup import RunArgs, prepare
from msa_eval.report.load import load_run, load_runs
from msa_eval.runner import run_suite
from msa_eval.runner.records import read_records, scan_records
from tests.msa_eval.conftest import msa_eval_cmd
from tests.msa_eval.scripted_openai_server import ScriptedOpenAI

GARBLE = b'{"backend": "openai:m", "sample_id": \xff\xfe not json'
CASES = ("truncated", "garbled", "both")


@pytest.fixture(scope="module")
def server():
    with ScriptedOpenAI(text="The special magic number is 1234") as s:
        yield s


def _args(server, out, **kw):
    a = RunArgs("helmet", "openai", "m", "dense", server.base_url, None, "512", 3, "niah_single",
                None, None, None, None, out)
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _cli_argv(server, out) -> list[str]:  # the same run as _args, from the command line
    return ["run", "helmet", "--backend", "openai", "--base-url", server.base_url, "--model", "m",
            "--tasks", "niah_single", "--lengths", "512", "--samples", "3", "--out", str(out)]


@pytest.fixture(scope="module")
def base_run(server, tmp_path_factory):
    """A finished run of 3 samples; its prep (plan, tokenizer) is reused by the resume tests."""
    out = tmp_path_factory.mktemp("base") / "run[/x]"  # `[` in the name: printed literally
    prep = prepare(_args(server, out))
    run_suite(prep.cfg, prep.run_dir, prep.plan, prep.reference_info, reference_tokenizer=prep.tokenizer)
    lines = (out / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    return prep, out, lines


def _damaged(base_run, tmp_path, case: str):
    """A copy of the base run with `case` applied; returns (dir, lines written, partial, garbled)."""
    _, src, lines = base_run
    d = tmp_path / "run[/x]"
    shutil.copytree(src, d)
    shutil.rmtree(d / "cache")  # the resume must ask the server again, not replay the cache
    new, partial, garbled = list(lines), None, None
    if case in ("garbled", "both"):
        garbled = GARBLE
        new[1] = garbled + b"\n"
    if case in ("truncated", "both"):
        partial = lines[2][: len(lines[2]) // 2]
        new[2] = partial
    (d / "records.jsonl").write_bytes(b"".join(new))
    return d, b"".join(new), partial, garbled


@pytest.mark.parametrize("case", CASES)
def test_readers_leave_the_file_byte_identical(base_run, tmp_path, case):
    d, data, partial, garbled = _damaged(base_run, tmp_path, case)
    path = d / "records.jsonl"
    kept = {0, 1, 2} - ({1} if garbled else set()) - ({2} if partial else set())
    assert len(read_records(path)) == len(kept)
    run = load_run(d)
    assert run.unreadable == 3 - len(kept) and "skipped" in run.warning()
    scan = scan_records(path)
    assert scan.partial == partial and scan.bad == ([garbled] if garbled else [])
    assert path.read_bytes() == data and not (d / "records.jsonl.bad").exists()


@pytest.mark.parametrize("case", CASES)
def test_report_cli_is_read_only_and_warns_once(base_run, tmp_path, case):
    d, data, _, _ = _damaged(base_run, tmp_path, case)
    p = subprocess.run(msa_eval_cmd("report", "--no-plots", "--out", str(tmp_path / "rep"), str(d)),
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    assert (d / "records.jsonl").read_bytes() == data  # the old reader rewrote it without the bad lines
    warnings = [x for x in p.stderr.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "unreadable line" in warnings[0] and "run[/x]" in warnings[0]
    assert "Traceback" not in p.stderr and not (d / "records.jsonl.bad").exists()


def test_a_reader_never_races_the_runners_append(base_run, tmp_path):
    """The runner is mid-append (half a line on disk) when a report reads; the append then
    completes. The old reader rewrote the file in between, so the finished append left a
    garbled fragment and the record was lost."""
    _, src, lines = base_run
    d = tmp_path / "live"
    shutil.copytree(src, d)
    path = d / "records.jsonl"
    cut = len(lines[2]) // 2
    path.write_bytes(lines[0] + lines[1] + lines[2][:cut])
    assert len(load_runs([d])) == 2  # the report's view while the append is in flight
    with open(path, "ab") as f:
        f.write(lines[2][cut:])
    assert path.read_bytes() == b"".join(lines) and len(read_records(path)) == 3


@pytest.mark.parametrize("case", ["truncated", "garbled"])
def test_runner_resume_repairs_with_a_sidecar_and_reruns(base_run, server, tmp_path, case):
    prep, _, lines = base_run
    d, _, partial, garbled = _damaged(base_run, tmp_path, case)
    notices: list[str] = []
    sent = len(server.requests)
    cfg = replace(prep.cfg, backends=tuple(replace(b, options={**b.options, "cache_dir": str(d / "cache")})
                                           for b in prep.cfg.backends))  # this copy's own cache
    result = run_suite(cfg, d, prep.plan, prep.reference_info, reference_tokenizer=prep.tokenizer,
                       progress=lambda ev, **kw: notices.append(kw["message"]) if ev == "notice" else None)
    assert len(notices) == 1 and result.generated == 1 and len(server.requests) - sent == 1
    assert ("dropped 1 partial record" in notices[0]) == (case == "truncated")
    assert ("set aside 1 unreadable line" in notices[0]) == (case == "garbled")
    assert (d / "records.jsonl.bad").read_bytes() == (partial or garbled) + b"\n"  # the exact bytes
    after = (d / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert after[0] == lines[0]  # good lines keep their bytes
    recs = read_records(d / "records.jsonl")
    assert sorted(r.sample_id for r in recs) == [f"niah_single/512/000{i}" for i in range(3)]
    assert all(r.status == "ok" for r in recs)
    events = json.loads((d / "manifest.json").read_text())["events"]
    assert any("repaired" in e for e in events)


def test_cli_resume_prints_one_notice_for_both(base_run, server, tmp_path):
    _, _, lines = base_run
    d, _, partial, garbled = _damaged(base_run, tmp_path, "both")
    sent = len(server.requests)
    p = subprocess.run(msa_eval_cmd(*_cli_argv(server, d)), capture_output=True, text=True, timeout=600,
                       env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    notes = [x for x in p.stderr.splitlines() if "partial record" in x]
    assert len(notes) == 1 and notes[0].startswith("warning: ")
    assert "dropped 1 partial record" in notes[0] and "set aside 1 unreadable line" in notes[0]
    assert "2 generated, 1 resumed, 0 errors" in p.stderr and len(server.requests) - sent == 2
    assert (d / "records.jsonl.bad").read_bytes() == garbled + b"\n" + partial + b"\n"
    after = (d / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert after[0] == lines[0] and len(after) == 3
    assert json.loads((d / "manifest.json").read_text())["status"] == "complete"
