"""The `msa-eval` entry point on bad input (issue 19, defects 12 and 13): each case runs the real
command in a subprocess and must exit non-zero with exactly one line on stderr, no traceback,
naming the fix. None of these cases loads a model (each fails at the edge, in about a second);
the one case that needs the model (a tiny temperature is greedy, not a crash) is apart."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SEED_OVER = str(2**70)


def _msa_eval(args: list[str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msa_eval", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "80"})


def _run_dir(tmp: Path, records: bytes | None = None, manifest: bytes | None = None) -> str:
    d = tmp / "run"
    d.mkdir()
    (d / "manifest.json").write_bytes(manifest if manifest is not None else
                                      json.dumps({"kind": "msa-eval-run", "status": "complete"}).encode())
    if records is not None:
        (d / "records.jsonl").write_bytes(records)
    return str(d)


# (id, argv builder (tmp dir -> argv), text the single stderr line must contain)
CASES = [
    ("generate-empty-prompt", lambda t: ["generate", ""], "PROMPT is empty: give the text"),
    ("generate-seed-2**70", lambda t: ["generate", "--seed", SEED_OVER, "hi"], "0<=x<=9223372036854775807"),
    ("generate-seed-negative", lambda t: ["generate", "--seed", "-1", "hi"], "0<=x<=9223372036854775807"),
    ("generate-negative-temperature", lambda t: ["generate", "--temperature", "-1", "hi"], "x>=0"),
    ("generate-empty-stop", lambda t: ["generate", "--stop", "", "hi"], "give a non-empty stop string"),
    ("generate-no-prompt", lambda t: ["generate"], "Missing argument 'PROMPT'"),
    ("run-concurrency-0", lambda t: ["run", "helmet", "--concurrency", "0", "--dry-run"], "0 is not in the range x>=1"),
    ("run-concurrency-text", lambda t: ["run", "helmet", "--concurrency", "many", "--dry-run"],
     "is not a valid integer"),
    ("run-samples-0", lambda t: ["run", "helmet", "--samples", "0", "--dry-run"], "x>=1"),
    ("run-unknown-arm", lambda t: ["run", "helmet", "--attention", "dense,msa-magic", "--dry-run"],
     "unknown attention arm msa-magic: use both or a comma list of dense, msa, msa-ref, msa-oracle"),
    ("run-limit-negative", lambda t: ["run", "helmet", "--limit", "-1", "--dry-run"], "x>=1"),
    ("run-seed-2**70", lambda t: ["run", "helmet", "--seed", SEED_OVER, "--dry-run"], "0<=x<=9223372036854775807"),
    ("run-bad-lengths", lambda t: ["run", "helmet", "--lengths", "2k,abc", "--dry-run"], "use tokens like 2048 or 2k"),
    ("run-tiny-length", lambda t: ["run", "helmet", "--lengths", "10", "--dry-run"], "whole token counts >= 256"),
    ("run-no-length", lambda t: ["run", "helmet", "--lengths", ",", "--dry-run"],
     "give comma-separated target lengths"),
    ("run-unknown-task", lambda t: ["run", "helmet", "--tasks", "nope", "--dry-run"], "run `msa-eval tasks list`"),
    ("run-unknown-suite", lambda t: ["run", "nosuite", "--dry-run"], "use one of"),
    ("run-suite-not-text", lambda t: ["run", _file(t, "s.yaml", b"\xff\xfe\x00"), "--dry-run"], "not a text file"),
    ("run-suite-not-mapping", lambda t: ["run", _file(t, "s.yaml", b"- 1\n"), "--dry-run"],
     "a suite is a YAML mapping"),
    ("run-openai-no-url", lambda t: ["run", "helmet", "--backend", "openai", "--dry-run"], "needs --base-url URL"),
    ("run-backend-opt-no-equals", lambda t: ["run", "helmet", "--backend-opt", "retries", "--dry-run"],
     "use key=value"),
    ("run-backend-opt-bad-yaml", lambda t: ["run", "helmet", "--backend-opt", "x=[1", "--dry-run"], "quote it"),
    ("run-out-is-a-file", lambda t: ["run", "helmet", "--out", _file(t, "x", b"")], "is a file, not a run directory"),
    ("run-out-other-folder", lambda t: ["run", "helmet", "--out", str(Path(_file(t, "x", b"")).parent)],
     "is not an msa-eval run directory: pick another --out"),
    ("report-missing-run-dir", lambda t: ["report", str(t / "missing")], "pass the folder printed by `msa-eval run`"),
    ("report-records-not-jsonl", lambda t: ["report", _run_dir(t, records=b"\x00\xffnot json\n{]\n")],
     "skipped 2 unreadable lines"),
    ("report-manifest-not-json", lambda t: ["report", _run_dir(t, manifest=b"{nope")],
     "remove the run directory or pick another --out"),
    ("report-bad-format", lambda t: ["report", "--format", "pdf", _run_dir(t)], "subset of md,csv,json"),
    ("report-no-args", lambda t: ["report"], "Missing argument 'RUN_DIRS...'"),
    ("agents-concurrency-0", lambda t: ["run", "agents", "--concurrency", "0"], "0 is not in the range x>=1"),
    ("agents-limit-0", lambda t: ["run", "agents", "--limit", "0"], "x>=1"),
    ("agents-unknown-suite", lambda t: ["run", "agents", "--suite", "nope"], "suites: default"),
    ("agent-show-missing", lambda t: ["agent", "show", str(t / "missing.jsonl")], "pass the .jsonl file"),
    ("agent-show-not-a-trajectory", lambda t: ["agent", "show", _file(t, "t.jsonl", b"\xff garbage\n")],
     "not an msa-eval trajectory"),
    ("unknown-command", lambda t: ["frobnicate"], "No such command 'frobnicate'"),
]


def _file(tmp: Path, name: str, data: bytes) -> str:
    p = tmp / name
    p.write_bytes(data)
    return str(p)


@pytest.mark.parametrize("build,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, build, needle):
    p = _msa_eval(build(tmp_path), tmp_path)
    lines = p.stderr.splitlines()
    assert p.returncode != 0, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    print(f"bad-input case ok: exit {p.returncode}: {lines[0][:100]}")


def test_a_tiny_temperature_is_greedy_not_a_traceback(tmp_path):
    """`generate --temperature 1e-40` overflowed logits/temperature to inf and crashed in
    torch.multinomial; now it gives the greedy tokens (the default model, 4 tokens)."""
    base = ["generate", "--max-tokens", "4", "--json", "The capital of France is"]
    tiny = _msa_eval(base[:1] + ["--temperature", "1e-40"] + base[1:], tmp_path, timeout=600)
    assert tiny.returncode == 0 and "Traceback" not in tiny.stderr, tiny.stderr[-2000:]
    greedy = _msa_eval(base, tmp_path, timeout=600)
    assert greedy.returncode == 0, greedy.stderr[-2000:]
    assert json.loads(tiny.stdout)["text"] == json.loads(greedy.stdout)["text"]
