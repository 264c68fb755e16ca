"""`msa-eval export`: a real run of the default model (dense, one 512-token sample) written as an
hf folder, parquet and jsonl, read back with `datasets` and compared with the records field by
field; nested fields on a record built from the real one; --force; bad input; lazy import."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from msa_eval.export import COLUMNS, from_row
from msa_eval.report.load import load_run
from msa_eval.runner.records import SampleRecord, append_records

from .conftest import msa_eval_cmd


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("export_run")
    run_dir = d / "run"
    out = subprocess.run(msa_eval_cmd("run", "helmet", "--backend", "local", "--attention", "dense",
                                      "--tasks", "niah_single", "--lengths", "512", "--samples", "1",
                                      "--out", str(run_dir)),
                         cwd=d, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return run_dir


def _export(run_cli, run_dir, fmt, out, *extra):
    return run_cli("export", str(run_dir), "--format", fmt, "--out", str(out), *extra)


def _read_back(fmt, path, cache_dir):
    import datasets

    if fmt == "hf":
        return datasets.load_from_disk(str(path))
    if fmt == "parquet":
        return datasets.Dataset.from_parquet(str(path), cache_dir=str(cache_dir))
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache_dir))


def _assert_same(rows, records, fmt):
    assert len(rows) == len(records)
    for row, rec in zip(rows, records, strict=True):
        got, want = from_row(row), rec.model_dump()
        assert set(got) == set(want)
        for k, v in want.items():
            if fmt == "jsonl" and isinstance(v, float) and not isinstance(got[k], str):
                assert math.isclose(got[k], v, rel_tol=0, abs_tol=1e-15), (k, got[k], v)  # pandas' 15 places
            else:
                assert got[k] == v and type(got[k]) is type(v), (k, got[k], v)
        if fmt != "jsonl":
            assert SampleRecord.model_validate(got) == rec


@pytest.mark.parametrize("fmt", ["hf", "parquet", "jsonl"])
def test_real_run_round_trips_through_datasets(real_run, run_cli, tmp_path, fmt):
    records = load_run(real_run).records
    assert len(records) == 1 and records[0].status == "ok"
    out = tmp_path / f"export.{fmt}"
    res = _export(run_cli, real_run, fmt, out)
    assert res.returncode == 0, res.stderr
    assert f"1 record of {real_run} written as {fmt}: {out}" in res.stdout + res.stderr
    ds = _read_back(fmt, out, tmp_path / "cache")
    assert ds.column_names == [c.name for c in COLUMNS]
    if fmt != "jsonl":  # jsonl readers infer types; the others keep the written features
        assert {k: str(v) for k, v in ds.features.items()}["answers"] == "List(Value('string'))"
        assert ds.features["prompt_tokens"].dtype == "int64" and ds.features["metrics"].dtype == "string"
    _assert_same(list(ds), records, fmt)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_nested_fields_and_extra_fields_round_trip(real_run, run_cli, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(real_run, run_dir)
    real = load_run(run_dir).records[0]
    nested = SampleRecord.model_validate(real.model_dump() | {
        "backend": "local:msa", "metrics": {"ruler_recall": 1.0, "f1": 0.25},
        "judge": {"model": "j", "verdict": "correct", "score": 1},
        "msa_telemetry": {"version": 2, "layers": [{"recall": [0.5, 1.0], "far_recall": [None, 0.75]}]},
        "answers": ["a", "b ü"], "attention_density": 0.125, "future_field": {"x": [1, 2]}})
    append_records(run_dir / "records.jsonl", [nested])
    records = load_run(run_dir).records
    assert len(records) == 2 and records[1].model_extra == {"future_field": {"x": [1, 2]}}
    for fmt in ("hf", "parquet", "jsonl"):
        out = tmp_path / f"export.{fmt}"
        assert _export(run_cli, run_dir, fmt, out).returncode == 0
        rows = list(_read_back(fmt, out, tmp_path / "cache"))
        _assert_same(rows, records, fmt)
        assert json.loads(rows[1]["msa_telemetry"]) == nested.msa_telemetry and rows[0]["extra"] is None


def test_columns_are_the_record_fields_and_the_documented_schema():
    assert [c.name for c in COLUMNS] == [*SampleRecord.model_fields, "extra"]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    rows = [line.split(" | ") for line in doc.splitlines() if line.startswith("| `")]
    assert [(r[0].strip("| `"), r[1], r[2].rstrip(" |")) for r in rows] == [(c.name, c.dtype, c.meaning)
                                                                           for c in COLUMNS]


@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_existing_path_refused_then_replaced_with_force(real_run, run_cli, tmp_path, fmt):
    out = tmp_path / "out"
    (out / "old").mkdir(parents=True) if fmt == "hf" else out.write_text("old")
    res = _export(run_cli, real_run, fmt, out)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {out} exists: pass --force to replace it, or choose another --out"]
    assert (out / "old").is_dir() if fmt == "hf" else out.read_text() == "old"
    res = _export(run_cli, real_run, fmt, out, "--force")
    assert res.returncode == 0, res.stderr
    assert not (out / "old").exists() if fmt == "hf" else out.read_bytes()[:4] == b"PAR1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .tmp / .old sibling left
    _assert_same(list(_read_back(fmt, out, tmp_path / "cache")), load_run(real_run).records, fmt)


def test_failed_write_leaves_the_old_output(real_run, tmp_path, monkeypatch):
    import datasets

    from msa_eval.errors import MsaEvalError
    from msa_eval.export import records_dataset, write_dataset

    out = tmp_path / "out.parquet"
    out.write_text("old")
    ds = records_dataset(load_run(real_run).records)

    def half_written(self, path, *a, **kw):
        open(path, "wb").write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(datasets.Dataset, "to_parquet", half_written)
    with pytest.raises(OSError, match="disk full"):
        write_dataset(ds, "parquet", out, force=True)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]
    with pytest.raises(MsaEvalError, match="unknown export format 'csv': use one of parquet, jsonl, hf"):
        write_dataset(ds, "csv", tmp_path / "x")


def test_bad_input_one_line_exit_2(real_run, run_cli, tmp_path):
    not_run = tmp_path / "notrun"
    not_run.mkdir()
    res = _export(run_cli, not_run, "hf", tmp_path / "x")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        (f"error: {not_run} is not an msa-eval run directory (no manifest.json): pass the folder printed by "
         "`msa-eval run`")]
    res = _export(run_cli, real_run, "csv", tmp_path / "x")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "'csv' is not one of 'parquet', 'jsonl', 'hf'" in res.stderr and "export --help`)" in res.stderr
    empty = tmp_path / "empty"
    shutil.copytree(real_run, empty)
    (empty / "records.jsonl").write_text("")
    res = _export(run_cli, empty, "jsonl", tmp_path / "x")
    assert res.returncode == 2 and "no records in" in res.stderr and "run `msa-eval run` first" in res.stderr
    agent_run = tmp_path / "agent_run"
    agent_run.mkdir()
    (agent_run / "manifest.json").write_text(json.dumps({"schema": "msa-eval.agent-run/1"}))
    res = _export(run_cli, agent_run, "hf", tmp_path / "x")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "is an agent run (`msa-eval run agents`)" in res.stderr and "msa-eval report" in res.stderr
    res = _export(run_cli, real_run, "hf", real_run.parent, "--force")
    assert res.returncode == 2 and "would replace the run directory" in res.stderr
    assert (real_run / "records.jsonl").is_file()
    assert not (tmp_path / "x").exists()


def test_help_does_not_import_datasets_and_a_missing_datasets_names_pip(monkeypatch):
    code = ("import sys; from msa_eval.cli import cli; "
            "cli.main(['--help'], standalone_mode=False); cli.main(['export', '--help'], standalone_mode=False); "
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "export" in out.stdout and out.stdout.strip().splitlines()[-1] == "False"

    from msa_eval.errors import MsaEvalError
    from msa_eval.export import records_dataset

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(MsaEvalError, match=r"needs the `datasets` package: pip install datasets"):
        records_dataset([])
