"""benchmarks/quality/needles: `@fp8` settings run on an FP8 KV cache and are paired against their bf16 twin
(the issue-22 quality preset `fp8`), on constructed rows and on one real default-model sample."""
from __future__ import annotations

import pytest

from benchmarks.quality import needles
from benchmarks.quality.run import PRESETS


def _rows(setting: str, scores: list[float]) -> list[dict]:
    return [{"bench": "needle", "setting": setting, "id": f"niah_single/4096/{i}", "task": "niah_single",
             "length": 4096, "density": None, "score": s} for i, s in enumerate(scores)]


def test_fp8_settings_pair_against_their_bf16_twin():
    assert [needles.baseline(s) for s in ("msa", "msa@fp8", "dense@fp8", "x=/a/b@fp8", "x=/a/b")] == \
        ["dense", "msa", "dense", "x", "dense"]
    assert [needles.baseline(s) for s in ("msa@fp8-hadamard", "x=/a/b@fp8-hadamard")] == ["msa", "x"]
    assert needles.resolve_setting("m", "dense@fp8-hadamard", None)[1:] == ("m", "dense", {}, "fp8-hadamard")
    rows = (_rows("dense", [1, 1, 1, 0]) + _rows("dense@fp8", [1, 1, 0, 1])
            + _rows("msa", [1, 0, 0, 0]) + _rows("msa@fp8", [1, 0, 1, 1]))
    by = {c["setting"]: c for c in needles.cells(rows)}
    assert "gap" not in by["dense"]
    assert (by["dense@fp8"]["gap"], by["dense@fp8"]["dense_better"], by["dense@fp8"]["setting_better"]) == (0, 1, 1)
    assert (by["msa@fp8"]["gap"], by["msa@fp8"]["dense_better"], by["msa@fp8"]["setting_better"]) == (50, 0, 2)
    assert (by["msa"]["gap"], by["msa"]["dense_better"]) == (-50, 2)  # msa itself still against dense
    md = "\n".join(needles.markdown(rows))
    assert "| msa@fp8 - msa |" in md and "msa@fp8: msa better / msa@fp8 better" in md
    assert "| 0 / 2 (+50 +-" in md


def test_an_msa_only_run_still_prints_its_paired_counts():
    # no dense setting: msa has no baseline, msa@fp8 pairs against msa
    md = "\n".join(needles.markdown(_rows("msa", [1, 0, 0, 1]) + _rows("msa@fp8", [1, 1, 0, 0])))
    assert "msa@fp8: msa better / msa@fp8 better" in md and "| 1 / 1 (+0 +-" in md
    assert "msa: dense better" not in md


def test_fp8_preset_is_the_issue_cells():
    p = PRESETS["fp8"].needles
    assert p is not None and p.settings == ("dense", "dense@fp8", "msa", "msa@fp8")
    assert (p.n, p.seed, p.lengths, p.topk) == (100, 42, (4096, 8192), 4)


@pytest.mark.timeout(600)
def test_real_fp8_setting_runs_on_an_fp8_cache(monkeypatch):
    seen: list[str] = []
    real = needles.generate

    def spy(model, attention, over, rows, max_seqs, kv_cache_dtype="auto"):
        seen.append(kv_cache_dtype)
        return real(model, attention, over, rows, max_seqs, kv_cache_dtype)

    monkeypatch.setattr(needles, "generate", spy)
    cfg = needles.Needles(("dense", "dense@fp8"), n=1, lengths=(512,), tasks=("niah_single",), recall=0, max_seqs=1)
    rows = needles.run(cfg)
    assert seen == ["auto", "fp8"]
    got = {r["setting"]: r for r in rows if r["bench"] == "needle"}
    assert set(got) == {"dense", "dense@fp8"} and got["dense"]["id"] == got["dense@fp8"]["id"]
    assert got["dense"]["score"] == 1.0 and got["dense@fp8"]["score"] == 1.0  # an easy 512-token needle
    cell = next(c for c in needles.cells(rows) if c["setting"] == "dense@fp8")
    assert cell["gap"] == 0 and cell["n"] == 1
