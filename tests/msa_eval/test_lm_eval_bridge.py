"""lm-eval bridge: a tiny local task YAML (generate_until, multiple_choice,
loglikelihood_rolling) through `python -m msa_eval.lm_eval_bridge --model msa-local`,
offline, on the default model. Skipped only when lm_eval is not installed."""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

HERE = Path(__file__).parent / "lm_eval_tiny"


@pytest.fixture(scope="module")
def lm_eval_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval")
    for y in HERE.glob("*.yaml"):
        (d / y.name).write_text(y.read_text().replace("DATA_FILE", str(HERE / "tiny.jsonl")))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "msa_eval.lm_eval_bridge", "--model", "msa-local",
           "--model_args", "model=smollm2-135m,attention=dense",
           "--tasks", "msa_tiny_gen,msa_tiny_mc,msa_tiny_roll", "--include_path", str(d),
           "--output_path", str(d / "out"), "--log_samples"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(Path(glob.glob(str(d / "out" / "*" / "results_*.json"))[0]).read_text())
    samples = {t: [json.loads(x) for x in
                   Path(glob.glob(str(d / "out" / "*" / f"samples_{t}_*.jsonl"))[0]).read_text().splitlines()]
               for t in ("msa_tiny_gen", "msa_tiny_mc", "msa_tiny_roll")}
    return results["results"], samples


def test_all_three_request_types_ran(lm_eval_run):
    res, _ = lm_eval_run
    assert res["msa_tiny_gen"]["exact_match,strip"] >= 0.75  # trivially easy continuations
    assert res["msa_tiny_mc"]["acc,none"] >= 0.75
    assert 1.0 < res["msa_tiny_roll"]["word_perplexity,none"] < 1e6


def test_loglikelihoods_match_the_engine(lm_eval_run):
    from engine import LLM

    _, samples = lm_eval_run
    llm = LLM("smollm2-135m", attention="dense", progress=False)
    tok = llm.tokenizer
    assert tok.bos_token_id is not None  # SmolLM2 has one: rolling windows start with it, as in HF / API models
    for s in samples["msa_tiny_roll"]:
        ids = [tok.bos_token_id] + tok.encode(s["target"])
        expected = sum(lp for lp, _ in llm.prompt_logprobs(ids)[1:])
        assert float(s["filtered_resps"][0]) == pytest.approx(expected, abs=1e-3)
    for s in samples["msa_tiny_mc"]:  # each choice scored as log p(choice | question)
        lls = [float(r[0][0]) if isinstance(r[0], list) else float(r[0]) for r in s["resps"]]
        assert all(x < 0 for x in lls) and len(lls) == 2


def test_importing_the_bridge_keeps_lm_evals_own_models_visible():
    """lm-eval fills its registry on the first look-up only while it is empty: the bridge registers
    lm-eval's models before msa-local, so `local-completions` still resolves in a fresh process."""
    code = ("import msa_eval.lm_eval_bridge; from lm_eval.api.registry import get_model; "
            "print(get_model('local-completions').__name__, get_model('msa-local').__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["LocalCompletionsAPI", "MsaLocalLM"]
