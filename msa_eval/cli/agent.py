"""`msa-eval agent run|list|show|mini-swe-agent` and `msa-eval run agents --suite S`.

Families are named `regression`, `needle`, `rename`, `ledger` (the letters A-D still work).
`run repo` (the single-prompt forms of `regression` and `needle`) is the HELMET runner's suite
`configs/repo.yaml`: `msa-eval run repo --backend ...` goes through `run` like any suite.
`run` (below) is that suite command with `run agents` beside it.

The suite cache lives under `$MSA_EVAL_HOME/agent-suites`; this module is where that folder is
found (`_suite_cache`) and handed down.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from msa_eval import display
from msa_eval.cli.options import attention_option
from msa_eval.cli.run import run as _suite_run

BACKENDS = ("oracle", "local", "openai")


class RunDispatch(click.Group):
    """`run agents ...` -> the agent batch; anything else -> the original `run SUITE` command."""

    def __init__(self, fallback: click.Command | None):
        super().__init__(name="run", help=((fallback.help or "") if fallback else "Run a suite.") +
                         "\n\n`run agents --suite S` runs an agent suite.")
        self.fallback = fallback
        if fallback is not None:
            fallback.epilog = ((fallback.epilog or "")
                               + "Agent suites: msa-eval run agents --suite S (see run agents --help).")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if self.fallback is None or (args and args[0] in self.commands):
            return super().parse_args(ctx, args)
        ctx.meta["msa_run_fallback_args"] = list(args)
        return []

    def invoke(self, ctx: click.Context) -> Any:
        args = ctx.meta.pop("msa_run_fallback_args", None)
        if args is not None:
            assert self.fallback is not None  # parse_args only sets the arguments aside with a fallback
            with self.fallback.make_context("run", args, parent=ctx.parent) as sub:
                return self.fallback.invoke(sub)
        return super().invoke(ctx)


@click.group()
def agent() -> None:
    """Long-horizon tool-calling agents on repository tasks (families regression, needle, rename, ledger)."""


def _backend_opts(f):
    opts = [
        click.option("--backend", "backend_kind", type=click.Choice(BACKENDS), default="oracle", show_default=True,
                     help="oracle = scripted gold replay; local = in-process engine; "
                          "openai = any endpoint (e.g. msa-eval serve)."),
        click.option("--model", default=None,
                     help="local: name/HF dir/.gguf (default smollm2-135m); openai: model id."),
        attention_option(),
        click.option("--base-url", default=None, help="openai backend base URL (.../v1)."),
        click.option("--suite", default="default", show_default=True, help="Agent suite in configs/agents.yaml."),
        click.option("--config", "config_path", type=click.Path(path_type=Path), default=None, help="Suite YAML."),
        click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Override the task's step limit."),
        click.option("--context-policy", type=click.Choice(["none", "truncate-observations", "summarize"]),
                     default="none", show_default=True),
        click.option("--context-window", type=click.IntRange(min=1), default=None,
                     help="Tokens the model accepts (default 131072)."),
        click.option("--tool-mode", type=click.Choice(["native", "text"]), default="native", show_default=True),
        click.option("--max-output-tokens", type=click.IntRange(min=1), default=1024, show_default=True),
        click.option("--max-wall-s", type=click.FloatRange(min=0, min_open=True), default=None),
        click.option("--max-cost-usd", type=click.FloatRange(min=0, min_open=True), default=None),
        click.option("--max-total-tokens", type=click.IntRange(min=1), default=None),
        click.option("--sandbox", type=click.Choice(["auto", "local", "docker"]), default="auto", show_default=True,
                     help="auto: Docker when `docker info` works and the image is present, else local."),
        click.option("--tokenizer", default=None,
                     help="oracle: count tokens with this model's tokenizer (e.g. smollm2-135m); default chars/4."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _config(kw: dict[str, Any]):
    from agents.config import AgentConfig, AgentLimits

    lim = AgentLimits(max_output_tokens=kw["max_output_tokens"], max_wall_s=kw["max_wall_s"],
                      max_cost_usd=kw["max_cost_usd"], max_total_tokens=kw["max_total_tokens"])
    if kw["context_window"]:
        lim.context_window = kw["context_window"]
    if kw["max_steps"]:
        lim.max_steps = kw["max_steps"]
    explicit = tuple(k for k in ("max_steps", "max_wall_s", "max_cost_usd", "max_total_tokens") if kw[k] is not None)
    return AgentConfig(lim, kw["context_policy"], kw["tool_mode"], explicit_limits=explicit)


def _container(kw: dict[str, Any]) -> bool:
    from agents.sandbox import DEFAULT_IMAGE, container_available

    if kw["sandbox"] == "local":
        return False
    ok = container_available()
    if kw["sandbox"] == "docker" and not ok:
        from agents.errors import AgentHarnessError

        raise AgentHarnessError(f"--sandbox docker needs a working Docker engine and the image {DEFAULT_IMAGE} "
                                "(set MSA_EVAL_SANDBOX_IMAGE); use --sandbox local")
    return ok


def _make_backend(kw: dict[str, Any]):
    """(factory(task) -> backend, key, description)."""
    kind = kw["backend_kind"]
    if kind == "oracle":
        from agents.oracle import OraclePolicy

        count = None
        if kw.get("tokenizer"):
            from msa_eval.runner.reference import load_reference_tokenizer

            tok, _ = load_reference_tokenizer(kw["tokenizer"])
            count = lambda text: len(tok.encode(text))  # noqa: E731 - a one-line local helper
        info = {"name": "oracle", "tokenizer": kw.get("tokenizer")}
        return (lambda task: OraclePolicy(task.gold, count, task.id)), "oracle", info
    from msa_eval.backends.factory import make_backend

    model = kw["model"] or "smollm2-135m"
    if kind == "local":
        b = make_backend("local", model=model, attention=kw["attention"])
        key = f"local:{kw['attention']}"
    else:
        b = make_backend("openai", base_url=kw["base_url"], model=model)
        key = f"openai:{model}"
    return (lambda task: b), key, b.describe()


_CACHE_NOTED: list[bool] = []


def _suite_cache() -> Path:
    """Where agent suites are cached: `$MSA_EVAL_HOME/agent-suites` (read here, at the edge).
    `MSA_EVAL_CACHE`, the old second variable, is no longer read: say so once, never move silently."""
    from msa_common.home import msa_eval_home

    cache = msa_eval_home() / "agent-suites"
    if os.environ.get("MSA_EVAL_CACHE") and not _CACHE_NOTED:
        _CACHE_NOTED.append(True)
        display.info(f"note: MSA_EVAL_CACHE is no longer read; agent suites are cached under MSA_EVAL_HOME "
                     f"({cache}): set MSA_EVAL_HOME to choose the folder")
    return cache


def _open_suite(kw: dict[str, Any]):
    from agents.suite import open_suite

    return open_suite(kw["suite"], kw["config_path"], _suite_cache())


def _task_row(t) -> dict[str, Any]:
    return {"id": t.id, "max_steps": t.limits.get("max_steps"), "gold_tool_calls": len(t.gold), "knobs": t.knobs,
            "hash": t.content_hash()}


@agent.command("list")
@click.option("--suite", default="default", show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None)
@click.option("--validate", is_flag=True, help="Generate and gold-validate the entries not cached yet (minutes).")
@click.option("--regenerate", is_flag=True, help="Generate and validate every entry again, ignoring the cache.")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(suite, config_path, validate, regenerate, as_json) -> None:
    """List the entries of an agent suite and the tasks of those already generated (at once: tasks
    are generated and validated when first run, or here with --validate)."""
    from agents.families import get_family
    from agents.suite import entry_status, entry_tasks

    s = _open_suite({"suite": suite, "config_path": config_path})
    rows = []
    for e in s.entries:
        if validate or regenerate:
            status, tasks = "cached", entry_tasks(e, s.cache, regenerate)
        else:
            status, tasks = entry_status(e, s.cache)
        rows.append({"family": e.family, "entry": e.index, "seed": e.seed, "n": e.n, "knobs": e.knobs,
                     "description": get_family(e.family).description, "cache": status,
                     "tasks": [_task_row(t) for t in tasks]})
    display.print_json(rows) if as_json else display.agent_tasks_table(suite, rows)


@agent.command("run")
@click.option("--task", "task_ref", required=True,
              help="FAMILY (its first task: regression, needle, rename, ledger or A-D), FAMILY:ID or ID.")
@_backend_opts
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Trajectory path (default runs/agents/<task>-<backend>.jsonl).")
@click.option("--resume", "resume", is_flag=True, help="Continue the trajectory at --out.")
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="A regression task from your own repository (a folder with test_*.py files), not the suite.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Generator seed with --source.")
@click.option("--json", "as_json", is_flag=True)
def run_cmd(task_ref, out, resume, source, seed, as_json, **kw) -> None:
    """Run one agent task through the loop and grade it (generating its suite entry on first use)."""
    from agents.run_one import run_task
    from agents.suite import find_task

    if source is not None:
        from agents.errors import AgentHarnessError
        from agents.families import get_family

        tasks = get_family("regression").generate(seed, 1, source=str(source))
        if not tasks:
            raise AgentHarnessError(f"no single-site mutation of {source} breaks its tests; "
                                    "try another --seed or repository")
        task = tasks[0]
    else:
        task = find_task(_open_suite(kw), task_ref)
    factory, key, _ = _make_backend(kw)
    out = out or Path("runs") / "agents" / f"{task.id}-{key.replace(':', '-')}.jsonl"
    res = run_task(task, factory(task), _config(kw), out, resume=resume, container=_container(kw))
    display.print_json(res.to_dict()) if as_json else display.agent_result(res.to_dict())


@agent.command("mini-swe-agent")
@click.option("--task", "task_ref", required=True,
              help="A repository task: FAMILY (regression, needle, rename), FAMILY:ID or ID.")
@click.option("--base-url", required=True, help="OpenAI-compatible endpoint (.../v1), e.g. msa-eval serve's.")
@click.option("--model", default="smollm2-135m", show_default=True, help="Model id sent in requests.")
@click.option("--suite", default="default", show_default=True, help="Agent suite in configs/agents.yaml.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None, help="Suite YAML.")
@click.option("--max-steps", type=click.IntRange(min=1), default=4, show_default=True,
              help="mini-swe-agent's step limit (model calls).")
@click.option("--max-output-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="max_tokens of every call.")
@click.option("--command-timeout-s", type=click.IntRange(min=1), default=30, show_default=True,
              help="Per bash command.")
@click.option("--prices", "prices_path", type=click.Path(path_type=Path), default=None,
              help="Price table for cost per call (default configs/prices.yaml; unknown model: cost empty).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default runs/agents-mini-swe-agent-<model>); `msa-eval report` reads it.")
@click.option("--json", "as_json", is_flag=True)
def mini_swe_agent_cmd(task_ref, base_url, model, suite, config_path, max_steps, max_output_tokens,
                       command_timeout_s, prices_path, out, as_json) -> None:
    """Run mini-swe-agent (its `mini` CLI through litellm, local environment) on one of our repository tasks
    against BASE_URL; grade the working tree it leaves with the task's verifier; record the run beside ours."""
    from agents.external import MiniSweAgentConfig, run_mini_swe_agent
    from agents.suite import find_task
    from msa_eval.backends.pricing import PriceTable

    task = find_task(_open_suite({"suite": suite, "config_path": config_path}), task_ref)
    prices = PriceTable.load(prices_path)
    cfg = MiniSweAgentConfig(base_url, model, max_steps, max_output_tokens, command_timeout_s=command_timeout_s)
    out = out or Path("runs") / f"agents-mini-swe-agent-{model.replace('/', '-')}"
    res = run_mini_swe_agent(task, cfg, out, cost=lambda p, c: prices.cost(model, p, c))
    display.print_json(res.to_dict()) if as_json else display.agent_result(res.to_dict())


@agent.command("show")
@click.argument("trajectory", type=click.Path(path_type=Path))
@click.option("--max-chars", type=click.IntRange(min=1), default=1500, show_default=True, help="Per message.")
@click.option("--json", "as_json", is_flag=True)
def show_cmd(trajectory, max_chars, as_json) -> None:
    """A readable transcript of a trajectory file."""
    from agents.errors import AgentHarnessError
    from agents.trajectory import read_trajectory

    try:
        t = read_trajectory(trajectory)
    except UnicodeDecodeError:
        raise AgentHarnessError(f"{trajectory} is not UTF-8 text, so it is not an msa-eval trajectory: "
                                "pass the .jsonl file written by `agent run`") from None
    if as_json:
        display.print_json({"header": t.header, "steps": t.steps, "events": t.events, "result": t.result})
    else:
        display.agent_transcript(t, max_chars)


@click.command("agents")
@_backend_opts
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks in flight, >= 1.")
@click.option("--families", default=None, help="Only these families, e.g. regression,needle (or A,B).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N tasks (>= 1).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default runs/agents-<suite>-<backend>).")
@click.option("--json", "as_json", is_flag=True)
def run_agents(concurrency, families, limit, out, as_json, **kw) -> None:
    """Run an agent suite as a batch (resumable: rerun the same command to continue)."""
    from agents.batch import run_batch
    from agents.suite import suite_tasks

    only = [f for f in families.split(",") if f.strip()] if families else None
    tasks = suite_tasks(_open_suite(kw), only, limit)
    factory, key, info = _make_backend(kw)
    out = out or Path("runs") / f"agents-{kw['suite']}-{key.replace(':', '-')}"
    display.info(f"run directory: {out} ({len(tasks)} tasks)")
    summary = run_batch(tasks, factory, key, info, _config(kw), out, kw["suite"], concurrency,
                        on_result=None if as_json else display.agent_record_line, container=_container(kw))
    from agents.families import canonical_task_id

    ids = {t.id for t in tasks}
    rows = [r for r in summary.records if canonical_task_id(r["task_id"]) in ids]
    if as_json:
        display.print_json(rows)
    else:
        display.agent_summary_table(rows, summary.ran, summary.skipped)


run = RunDispatch(_suite_run)  # `msa-eval run SUITE ...` and `msa-eval run agents ...`
run.add_command(run_agents, "agents")
