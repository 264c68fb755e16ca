"""The accuracy gate (`msa-eval gate`) and the report's paired p-values, on constructed run
directories (manifest + records.jsonl, as `msa-eval run` writes them; no model is loaded)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from msa_eval.report import build_report
from msa_eval.report.gate import GateConfig, gate_pair, resolve_pairs, run_gate
from msa_eval.report.load import load_run
from msa_eval.report.stats import format_p, sign_test
from msa_eval.report.writers import to_csv, to_markdown
from msa_eval.runner.records import SampleRecord, append_records


def _rec(backend: str, i: int, score: float, task: str = "niah_single", length: int = 2048,
         prompt_hash: str | None = None, status: str = "ok") -> SampleRecord:
    return SampleRecord(backend=backend, sample_id=f"{task}-{length}-{i}", task=task, category="recall",
                        length=length, mode="chat", status=status,
                        prompt_hash=prompt_hash or f"h{task}{length}{i}", prompt_tokens_ref=length,
                        answers=["7"], output="7" if score else "x", parsed=None, score=score,
                        metric="substring_exact_match", extraction_failed=False)


def _scores(n: int, correct: int) -> list[float]:
    return [1.0] * correct + [0.0] * (n - correct)


def _arm_records(backend: str, scores: list[float], **kw) -> list[SampleRecord]:
    return [_rec(backend, i, s, **kw) for i, s in enumerate(scores)]


def _run(tmp: Path, name: str, records: list[SampleRecord]) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"kind": "msa-eval-run", "format": 1, "status": "complete"}))
    append_records(d / "records.jsonl", records)
    return d


def _gate(run_cli, *args: str):
    p = run_cli("gate", *map(str, args))
    assert "Traceback" not in p.stderr, p.stderr
    return p


# --- the exact test --------------------------------------------------------------------------------
def test_exact_mcnemar_on_a_known_table():
    """10 samples only A gets right, 3 only B, 20 both, 7 neither: McNemar's exact p is the
    two-sided binomial on the 13 discordant pairs, 2 * (C(13,0)+..+C(13,3)) / 2^13."""
    a = _scores(10, 10) + _scores(3, 0) + _scores(20, 20) + _scores(7, 0)
    b = _scores(10, 0) + _scores(3, 3) + _scores(20, 20) + _scores(7, 0)
    t = sign_test(a, b)
    hand = 2 * sum(math.comb(13, i) for i in range(4)) / 2**13
    assert (t.wins, t.losses, t.test) == (10, 3, "mcnemar") and t.p == pytest.approx(hand, rel=1e-12)
    assert t.p_less == pytest.approx(sum(math.comb(13, i) for i in range(3, 14)) / 2**13, rel=1e-12)
    scipy_stats = pytest.importorskip("scipy.stats")
    assert t.p == pytest.approx(scipy_stats.binomtest(3, 13, 0.5).pvalue, rel=1e-12)
    assert t.p_less == pytest.approx(scipy_stats.binomtest(3, 13, 0.5, alternative="greater").pvalue, rel=1e-12)
    rev = sign_test(b, a)  # swapping the arms swaps the one-sided side, not the two-sided p
    assert rev.p == t.p and rev.p_less == pytest.approx(scipy_stats.binomtest(10, 13, 0.5,
                                                                              alternative="greater").pvalue)


def test_sign_test_on_graded_scores_drops_ties():
    t = sign_test([0.5, 0.9, 0.2, 0.7, 0.3], [0.5, 0.4, 0.6, 0.1, 0.3])
    assert (t.wins, t.losses, t.test) == (2, 1, "sign") and t.p == 1.0 and t.p_less == pytest.approx(7 / 8)
    assert sign_test([1.0] * 4, [1.0] * 4).p == 1.0  # no discordant pair: nothing to test
    assert [format_p(p) for p in (0.0004, 0.0123, 0.2, 1.0)] == ["p<.001", "p=.012", "p=.20", "p=1"]


# --- the report shows p next to each task's Δ ------------------------------------------------------
def test_report_shows_the_exact_p_next_to_each_task_delta():
    dense = _arm_records("local:dense", _scores(40, 36))
    msa = _arm_records("local:msa", _scores(40, 20))
    rep = build_report(dense + msa, n_boot=200)
    [task] = [d for d in rep.deltas if d["kind"] == "task"]
    assert task["test"] == "mcnemar" and task["delta"] == -40.0
    assert task["p"] == pytest.approx(round(sign_test(_scores(40, 20), _scores(40, 36)).p, 4))
    assert task["p"] < 0.001
    assert all(d["p"] is None for d in rep.deltas if d["kind"] != "task")  # aggregates: bootstrap only
    md = to_markdown(rep)
    assert "| recall | niah_single | 90.0 | 50.0 | -40.0 [" in md and "] p<.001 |" in md
    assert "p<.001" in to_csv(rep) and "exact McNemar" in md


# --- verdicts --------------------------------------------------------------------------------------
def test_clear_drop_fails_with_exit_1(tmp_path, run_cli):
    records = _arm_records("local:dense", _scores(100, 90)) + _arm_records("local:msa", _scores(100, 50))
    d = _run(tmp_path, "run", records)
    p = _gate(run_cli, d)
    assert p.returncode == 1, p.stderr
    assert "gate: FAIL: 1 of 1 cell fail" in p.stdout and "FAIL" in p.stdout
    p = _gate(run_cli, d, "--json")
    res = json.loads(p.stdout)
    [cell] = res["cells"]
    assert p.returncode == 1 and res["verdict"] == "FAIL" and res["failed"] == 1
    assert (cell["task"], cell["length"], cell["n"], cell["delta"]) == ("niah_single", 2048, 100, -40.0)
    assert cell["hi"] < -2 and cell["p_drop"] < 0.05 and cell["test"] == "mcnemar"
    assert cell["b"].endswith("local:dense") and cell["a"].endswith("local:msa")


def test_no_drop_passes_with_exit_0(tmp_path, run_cli):
    same = _scores(50, 30)
    d = _run(tmp_path, "run", _arm_records("local:dense", same) + _arm_records("local:msa", same))
    p = _gate(run_cli, d, "--arms", "msa,dense")
    assert p.returncode == 0, p.stderr
    assert "gate: PASS: 0 of 1 cell fail" in p.stdout and not p.stderr.strip()


def test_harness_errors_are_scored_0_and_said(tmp_path):
    """An arm whose backend errored on 20 samples: they score 0 (as in the report), the cell
    fails, and the result says how many compared records are errors."""
    dense = _arm_records("local:dense", _scores(60, 60))
    msa = _arm_records("local:msa", _scores(60, 60))
    msa[:20] = [_rec("local:msa", i, 0.0, status="error") for i in range(20)]
    run = load_run(_run(tmp_path, "err", dense + msa))
    res = run_gate(resolve_pairs(run, None), GateConfig())
    [cell] = res.cells
    assert (cell.verdict, cell.errors_a, cell.errors_b, cell.losses) == ("FAIL", 20, 0, 20)
    assert res.error_note() is not None and res.error_note().startswith("20 of A's and 0 of B's")


def test_a_drop_within_noise_passes(tmp_path):
    """2 of 10 lost: the bootstrap bound reaches 0 and the exact p is .25; 3 of 3 lost: the
    percentile interval is [-100, -100] but the exact test (p = 1/8) keeps the cell a PASS."""
    cfg = GateConfig(max_drop=0.0)
    run = load_run(_run(tmp_path, "noise", _arm_records("local:dense", _scores(10, 10))
                        + _arm_records("local:msa", _scores(10, 8))))
    [(a, b)] = resolve_pairs(run, None)
    [cell] = gate_pair(a, b, cfg)
    assert cell.verdict == "PASS" and cell.delta == -20.0 and cell.hi >= 0 and cell.p_drop == 0.25
    tiny = load_run(_run(tmp_path, "tiny", _arm_records("local:dense", _scores(3, 3))
                         + _arm_records("local:msa", _scores(3, 0))))
    [cell] = gate_pair(*resolve_pairs(tiny, None)[0], cfg)
    assert (cell.lo, cell.hi, cell.verdict) == (-100.0, -100.0, "PASS") and cell.p_drop == 0.125
    five = load_run(_run(tmp_path, "five", _arm_records("local:dense", _scores(5, 5))
                         + _arm_records("local:msa", _scores(5, 0))))
    [cell] = gate_pair(*resolve_pairs(five, None)[0], cfg)
    assert cell.verdict == "FAIL" and cell.p_drop == 1 / 32  # 5 of 5: the smallest cell that can fail


def test_max_drop_is_the_margin(tmp_path, run_cli):
    """A significant 2-point drop over 1000 samples (30 lost, 10 won): FAIL at --max-drop 0,
    PASS at --max-drop 5 (the interval's upper bound is well above -5)."""
    b = _scores(1000, 600)
    a = list(b)
    for i in range(30):
        a[i] = 0.0  # lost
    for i in range(600, 610):
        a[i] = 1.0  # won
    d = _run(tmp_path, "run", _arm_records("local:dense", b) + _arm_records("local:msa", a))
    assert _gate(run_cli, d, "--max-drop", "0").returncode == 1
    assert _gate(run_cli, d, "--max-drop", "2").returncode == 0  # the point estimate is -2: not beyond
    p = _gate(run_cli, d, "--max-drop", "5", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["cells"][0]["delta"] == -2.0


def test_two_runs_from_different_backends_per_cell(tmp_path, run_cli):
    """Two runs of the same samples on two endpoints (one arm each): every task x length is a
    cell; only the cell with a clear drop fails."""
    a, b = [], []
    for task in ("niah_single", "niah_mk2"):
        for length in (2048, 4096):
            drop = task == "niah_mk2" and length == 4096
            a += _arm_records("openai:m3-vllm", _scores(60, 20 if drop else 45), task=task, length=length)
            b += _arm_records("openai:minimax-api", _scores(60, 45), task=task, length=length)
    ra, rb = _run(tmp_path, "vllm", a), _run(tmp_path, "api", b)
    p = _gate(run_cli, ra, rb, "--json")
    res = json.loads(p.stdout)
    assert p.returncode == 1 and (res["failed"], res["cells_total"]) == (1, 4)
    [bad] = [c for c in res["cells"] if c["verdict"] == "FAIL"]
    assert (bad["task"], bad["length"]) == ("niah_mk2", 4096)
    assert bad["a"] == f"{ra}:openai:m3-vllm" and bad["b"] == f"{rb}:openai:minimax-api"
    p = _gate(run_cli, rb, ra)  # B against A: no drop anywhere
    assert p.returncode == 0 and "gate: PASS: 0 of 4 cells fail" in p.stdout


# --- bad input: one line naming the fix, exit 2 ----------------------------------------------------
def _one_error_line(p, text: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], p.stderr


def test_shared_samples_gates_an_unfinished_run_on_what_both_hold(tmp_path, run_cli):
    """An interrupted run: refused by default (naming --shared-samples), gated on the shared samples
    with the flag (the left-out count said), and a changed prompt is still refused."""
    full = _run(tmp_path, "full", _arm_records("local:dense", _scores(40, 40)))
    part = _run(tmp_path, "part", _arm_records("local:msa", _scores(25, 5)))
    _one_error_line(_gate(run_cli, part, full), "pass --shared-samples to gate the samples both hold")
    p = _gate(run_cli, part, full, "--shared-samples", "--json")
    res = json.loads(p.stdout)
    assert p.returncode == 1 and res["cells"][0]["n"] == 25 and res["cells"][0]["verdict"] == "FAIL"
    assert "15 samples held by one arm only were left out" in p.stderr
    same = _run(tmp_path, "same", _arm_records("local:msa", _scores(25, 25)))
    assert _gate(run_cli, same, full, "--shared-samples").returncode == 0
    other = _arm_records("local:msa", _scores(25, 25))
    other[3] = _rec("local:msa", 3, 1.0, prompt_hash="another-prompt")
    _one_error_line(_gate(run_cli, _run(tmp_path, "changed", other), full, "--shared-samples"),
                    "niah_single @2k sample niah_single-2048-3 has prompt hash")


def test_bad_input(tmp_path, run_cli):
    dense = _arm_records("local:dense", _scores(20, 10))
    good = _run(tmp_path, "good", dense + _arm_records("local:msa", _scores(20, 10)))
    other = _arm_records("local:dense", _scores(20, 10))
    other[7] = _rec("local:dense", 7, 1.0, prompt_hash="another-prompt")
    changed = _run(tmp_path, "changed", other)
    _one_error_line(_gate(run_cli, good, changed),
                    "do not share prompts: niah_single @2k sample niah_single-2048-7 has prompt hash")
    short = _run(tmp_path, "short", dense[:15])
    _one_error_line(_gate(run_cli, good, short), "niah_single @2k sample niah_single-2048-15 is only in")
    _one_error_line(_gate(run_cli, tmp_path / "missing"), "pass the folder printed by `msa-eval run`")
    _one_error_line(_gate(run_cli, good, "--arms", "msa,oracle"),
                    "arm 'oracle' is not an arm of")
    _one_error_line(_gate(run_cli, good, "--arms", "msa"), "give two arm names")
    empty = _run(tmp_path, "empty", [])
    _one_error_line(_gate(run_cli, empty, good), "no records in")
    _one_error_line(_gate(run_cli, changed), "no msa/dense pair of arms")
    p = _gate(run_cli, good, "--alpha", "0.7")
    assert p.returncode == 2 and "0<x<0.5" in p.stderr
