"""Run one task with one backend through the agent loop (CLI and batch runner use this)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.config import AgentConfig, AgentLimits, AgentResult
from agents.families import get_family
from agents.loop import AgentLoop
from agents.oracle import OraclePolicy
from agents.task import AgentTask


def task_config(task: AgentTask, base: AgentConfig) -> AgentConfig:
    """The run config with the task's own limits applied (limits are task properties)."""
    own = {k: v for k, v in task.limits.items() if k in AgentLimits.__dataclass_fields__
           and k != "context_window" and k not in base.explicit_limits}
    return replace(base, limits=replace(base.limits, **own))


def run_task(task: AgentTask, backend: Any, config: AgentConfig, trajectory: Path, resume: bool = False,
             container: bool = False, override_task_limits: bool = False) -> AgentResult:
    """Build the task's environment, run the loop (resuming if asked), close the environment.

    `backend="oracle"` selects the oracle policy for this task; it has no context window of
    its own, so its window is unlimited unless the config sets one below the default."""
    cfg = config if override_task_limits else task_config(task, config)
    if backend == "oracle":
        backend = OraclePolicy(task.gold, task_id=task.id)
    if isinstance(backend, OraclePolicy):
        if cfg.limits.context_window == AgentLimits().context_window:
            cfg = replace(cfg, limits=replace(cfg.limits, context_window=10**9))
    env = get_family(task.family).environment(task, container=container)
    try:
        return AgentLoop(task, env, backend, cfg, trajectory).run(resume=resume)
    finally:
        env.close()
