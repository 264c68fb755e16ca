"""The default suite holds a long-horizon task: oracle >= 100 tool calls, trajectory > 100K tokens."""
from __future__ import annotations

from agents.config import AgentConfig
from agents.families import get_family
from agents.run_one import run_task
from agents.suite import load_suite_config


def test_default_suite_has_a_long_horizon_task(agent_cache, tmp_path):
    suite = load_suite_config("default")
    long_entries = [e for e in suite["families"]["ledger"] if "scope" in e]
    assert long_entries, "the default suite must keep its long ledger entry"
    knobs = {k: v for k, v in long_entries[0].items() if k != "n"}
    (task,) = get_family("ledger").generate(suite["seed"], 1, **knobs)
    res = run_task(task, "oracle", AgentConfig(), tmp_path / "long.jsonl")
    assert res.status == "submitted" and res.score == 1.0
    assert res.tool_calls >= 100
    assert res.trajectory_tokens > 100_000  # counted as ceil(chars / 4); SmolLM2's tokenizer counts more
    assert res.peak_context_tokens > 100_000
