"""Outside agent harnesses on our tasks: mini-swe-agent (its `mini` CLI, litellm's OpenAI-compatible
provider) runs in a task's workspace against any OpenAI-compatible endpoint (e.g. `msa-eval serve`);
the working tree it leaves is graded by the task's own verifier, and its trajectory is converted
(`agents/converters/mini_swe_agent.py`) into a run directory `msa-eval report` reads (agents/RECORDS.md):

  <run_dir>/manifest.json, records.jsonl, trajectories/<task>.jsonl   as `msa-eval run agents` writes them
  <run_dir>/mini-swe-agent/<task>.traj.json                           mini-swe-agent's own trajectory
  <run_dir>/mini-swe-agent/<task>.log                                 its console output

Limits: mini-swe-agent's local environment runs every command with `subprocess` in the workspace
folder, as the user running msa-eval, with no confinement at all (no network namespace, unlike our
`bash` tool); only repository families (regression, needle, rename) have a working tree for it.
Its settings are mini-swe-agent's own `mini.yaml` (prompts, tool-call parsing) with our overrides below;
its global config folder is a fresh one under the run directory, so a user's `~/.config/mini-swe-agent/.env`
(API keys, default model) is neither read nor written.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from agents.batch import RUN_SCHEMA
from agents.config import AgentResult
from agents.converters.mini_swe_agent import CostFn, convert, read_mini_trajectory, split_messages
from agents.env import WorkspaceEnvironment
from agents.errors import AgentHarnessError
from agents.families import get_family
from agents.task import AgentTask
from msa_common import __version__
from msa_common.atomic import atomic_write_json


@dataclass
class MiniSweAgentConfig:
    base_url: str  # the endpoint's .../v1
    model: str = "smollm2-135m"  # the model id sent in requests (litellm gets `openai/<model>`)
    step_limit: int = 4  # model calls
    max_tokens: int = 256  # per call; without it a server may generate to the end of the context
    temperature: float = 0.0
    command_timeout_s: int = 30  # per bash command (mini-swe-agent's environment timeout)
    timeout_s: float = 900.0  # the whole `mini` process

    @property
    def backend_key(self) -> str:
        return f"mini-swe-agent:{self.model}"


def mini_executable() -> list[str]:
    """The `mini` CLI of the running Python's environment (else on PATH); one line when it is missing."""
    beside = Path(sys.executable).with_name("mini")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("mini")
    if found:
        return [found]
    raise AgentHarnessError("mini-swe-agent is not installed (no `mini` command): pip install 'mini-swe-agent>=2.4,<3'")


def _builtin_config(name: str) -> str:
    """The absolute path of one of mini-swe-agent's own config files (a bare name would be looked up in
    the workspace first, where a task's repository could hold a file of that name)."""
    spec = importlib.util.find_spec("minisweagent")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return name
    return str(Path(next(iter(spec.submodule_search_locations))) / "config" / name)


def mini_overrides(cfg: MiniSweAgentConfig, cwd: Path, trajectory: Path) -> dict[str, Any]:
    """Our settings on top of mini-swe-agent's `mini.yaml`: no confirmation, our limits, our endpoint."""
    return {"agent": {"step_limit": cfg.step_limit, "cost_limit": 0, "mode": "yolo", "confirm_exit": False,
                      "output_path": str(trajectory)},
            "environment": {"cwd": str(cwd), "timeout": cfg.command_timeout_s},
            "model": {"model_name": f"openai/{cfg.model}", "cost_tracking": "ignore_errors",
                      "model_kwargs": {"api_base": cfg.base_url, "api_key": "unused", "max_tokens": cfg.max_tokens,
                                       "temperature": cfg.temperature, "drop_params": True}}}


def instruction(task: AgentTask) -> str:
    """The task's instruction, told how to run the tests with plain bash (our `run_tests` tool is not there)."""
    mods = task.spec.get("test_modules") or []
    tail = f"\n\nRun the tests with: python -m unittest {' '.join(mods)}" if mods else ""
    return task.instruction + tail


def check_endpoint(cfg: MiniSweAgentConfig) -> None:
    """One line naming the fix when nothing answers `GET <base_url>/models` or it does not list the model."""
    url = cfg.base_url.rstrip("/") + "/models"
    try:
        r = httpx.get(url, timeout=10.0)
        ids = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise AgentHarnessError(f"no OpenAI-compatible server answers {url} ({type(e).__name__}); start one "
                                "(msa-eval serve) or pass its --base-url ending in /v1") from None
    if ids is None:
        raise AgentHarnessError(f"{url} answered HTTP {r.status_code}; pass the server's --base-url ending in /v1")
    if ids and cfg.model not in ids:
        raise AgentHarnessError(f"{url} does not serve model {cfg.model!r} (it serves {', '.join(map(str, ids))}); "
                                "pass one of those as --model")


def run_mini_swe_agent(task: AgentTask, cfg: MiniSweAgentConfig, run_dir: Path, cost: CostFn | None = None,
                       before_grade: Callable[[WorkspaceEnvironment], None] | None = None) -> AgentResult:
    """Run `mini` on `task` in a fresh workspace, grade what it leaves, record it in `run_dir`."""
    check_endpoint(cfg)
    run_dir = Path(run_dir)
    own = run_dir / "mini-swe-agent"
    own.mkdir(parents=True, exist_ok=True)
    traj, log = own / f"{task.id}.traj.json", own / f"{task.id}.log"
    env = workspace_environment(task)
    try:
        over = own / f"{task.id}.config.yaml"
        over.write_text(yaml.safe_dump(mini_overrides(cfg, env.ws.root, traj.resolve())))
        cmd = [*mini_executable(), "-c", _builtin_config("mini.yaml"), "-c", str(over.resolve()),
               "-t", instruction(task), "-o", str(traj.resolve()), "-y", "--exit-immediately"]
        env_vars = {**os.environ, "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1",
                    "MSWEA_GLOBAL_CONFIG_DIR": str((own / "config").resolve()), "MSWEA_COST_TRACKING": "ignore_errors",
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches its price map from GitHub otherwise
                    # its default, 10 attempts backing off up to 60 s, spends minutes on a server that is down
                    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": os.environ.get("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "3")}
        t0 = time.monotonic()
        with open(log, "w", encoding="utf-8") as f:
            try:
                p = subprocess.run(cmd, cwd=env.ws.root, env=env_vars, stdin=subprocess.DEVNULL, stdout=f,
                                   stderr=subprocess.STDOUT, timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                raise AgentHarnessError(f"mini-swe-agent ran past {cfg.timeout_s:g} s on {task.id}; "
                                        f"see {log}") from None
        wall = time.monotonic() - t0
        if not traj.is_file():
            raise AgentHarnessError(f"mini-swe-agent exited with {p.returncode} and wrote no trajectory; see {log}")
        if before_grade is not None:
            before_grade(env)
        info = {"name": "mini-swe-agent", "model": cfg.model, "base_url": cfg.base_url, "harness": "mini-swe-agent",
                "config": asdict(cfg)}
        return grade_and_record(task, env, traj, run_dir, cfg.backend_key, info, cost, wall)
    finally:
        env.close()


def grade_and_record(task: AgentTask, env: WorkspaceEnvironment, trajectory: Path, run_dir: Path, backend_key: str,
                     backend_info: dict[str, Any], cost: CostFn | None = None, wall_s: float = 0.0) -> AgentResult:
    """Grade `env`'s working tree with the task's verifier, convert mini-swe-agent's `trajectory`,
    and append the record to `run_dir` (created when new; a run of another backend is refused)."""
    data = read_mini_trajectory(trajectory)
    _, _, exit_extra = split_messages(data)
    submitted = exit_extra.get("exit_status") == "Submitted"
    grade = env.grade(str(exit_extra.get("submission") or "") if submitted else None)
    run_dir = Path(run_dir)
    _manifest(run_dir, task, backend_key, backend_info)
    res = convert(data, task, grade, run_dir / "trajectories" / f"{task.id}.jsonl", backend_info, cost, wall_s)
    rec = {"schema": RUN_SCHEMA, **res.to_dict(), "task_hash": task.content_hash(), "config_hash": None,
           "backend": backend_key, "suite": None, "knobs": task.knobs, "harness": "mini-swe-agent",
           "harness_trajectory": str(trajectory), "finished_at": time.time()}
    with open(run_dir / "records.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return res


def workspace_environment(task: AgentTask) -> WorkspaceEnvironment:
    """A fresh environment of `task` with a working tree (the caller closes it); other families are refused."""
    env = get_family(task.family).environment(task)
    if not isinstance(env, WorkspaceEnvironment):
        env.close()
        raise AgentHarnessError(f"task {task.id} (family {task.family}) has no working tree for mini-swe-agent; "
                                "use a repository family: regression, needle or rename")
    return env


def _manifest(run_dir: Path, task: AgentTask, backend_key: str, info: dict[str, Any]) -> None:
    (run_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    path = run_dir / "manifest.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    if old and old.get("backend") != backend_key:
        raise AgentHarnessError(f"{run_dir} holds a run of backend {old.get('backend')!r}, not {backend_key!r}; "
                                "use a new --out directory")
    tasks = {**old.get("tasks", {}), task.id: task.content_hash()}
    atomic_write_json(path, {"schema": RUN_SCHEMA, "suite": None, "backend": backend_key, "backend_info": info,
                             "harness": "mini-swe-agent", "config": info.get("config"), "config_hash": None,
                             "tasks": tasks, "sandbox": "mini-swe-agent-local",
                             "versions": {"msa_eval": __version__}, "status": "complete",
                             "updated_at": time.time()})
