"""Run one task with one backend through the agent loop (CLI and batch runner use this)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.config import AgentConfig, AgentLimits, AgentResult
from agents.families import get_family
from agents.loop import AgentLoop
from agents.oracle import OraclePolicy
from agents.task import AgentTask


def task_config(task: AgentTask, base: AgentConfig) -> AgentConfig:
    """The run config with the task's own limits applied (limits are task properties)."""
    lim = {**base.limits.__dict__, **{k: v for k, v in task.limits.items() if k in AgentLimits.__dataclass_fields__}}
    return AgentConfig(AgentLimits(**lim), base.context_policy, base.tool_mode, base.temperature, base.seed)


def run_task(task: AgentTask, backend: Any, config: AgentConfig, trajectory: Path, resume: bool = False,
             container: bool = False, override_task_limits: bool = False) -> AgentResult:
    """Build the task's environment, run the loop (resuming if asked), close the environment.

    `backend="oracle"` selects the oracle policy for this task."""
    if backend == "oracle":
        backend = OraclePolicy(task.gold, task_id=task.id)
    cfg = config if override_task_limits else task_config(task, config)
    env = get_family(task.family).environment(task, container=container)
    try:
        return AgentLoop(task, env, backend, cfg, trajectory).run(resume=resume)
    finally:
        env.close()
