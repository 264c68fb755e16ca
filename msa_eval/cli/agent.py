"""`msa-eval agent run|list|show` and `msa-eval run agents --suite S`.

`run repo` (the single-prompt forms of families A and B) is the HELMET runner's suite
`configs/repo.yaml`: `msa-eval run repo --backend ...` goes through `run` like any suite.
If `run` is a plain command, `register` wraps it in a group that keeps `run SUITE ...` working
and adds `run agents`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from msa_eval import display

BACKENDS = ("oracle", "local", "openai")


def register(group: click.Group) -> None:
    group.add_command(agent)
    existing = group.commands.get("run")
    if isinstance(existing, click.Group):
        existing.add_command(run_agents, "agents")
    else:
        disp = RunDispatch(existing)
        disp.add_command(run_agents, "agents")
        group.add_command(disp, "run")


class RunDispatch(click.Group):
    """`run agents ...` -> the agent batch; anything else -> the original `run SUITE` command."""

    def __init__(self, fallback: click.Command | None):
        super().__init__(name="run", help=(fallback.help if fallback else "Run a suite.") +
                         "\n\n`run agents --suite S` runs an agent suite.")
        self.fallback = fallback
        if fallback is not None:
            fallback.epilog = (fallback.epilog or "") + "Agent suites: msa-eval run agents --suite S (see run agents --help)."

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if self.fallback is None or (args and args[0] in self.commands):
            return super().parse_args(ctx, args)
        ctx.meta["msa_run_fallback_args"] = list(args)
        return []

    def invoke(self, ctx: click.Context) -> Any:
        args = ctx.meta.pop("msa_run_fallback_args", None)
        if args is not None:
            with self.fallback.make_context("run", args, parent=ctx.parent) as sub:
                return self.fallback.invoke(sub)
        return super().invoke(ctx)


@click.group()
def agent() -> None:
    """Long-horizon tool-calling agents on repository tasks (families A-D)."""


def _backend_opts(f):
    opts = [
        click.option("--backend", "backend_kind", type=click.Choice(BACKENDS), default="oracle", show_default=True,
                     help="oracle = scripted gold replay; local = in-process engine; openai = any endpoint (e.g. msa-eval serve)."),
        click.option("--model", default=None, help="local: name/HF dir/.gguf (default smollm2-135m); openai: model id."),
        click.option("--attention", default="dense", type=click.Choice(["dense", "msa", "msa-ref"]), show_default=True),
        click.option("--base-url", default=None, help="openai backend base URL (.../v1)."),
        click.option("--suite", default="default", show_default=True, help="Agent suite in configs/agents.yaml."),
        click.option("--config", "config_path", type=click.Path(path_type=Path), default=None, help="Suite YAML."),
        click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Override the task's step limit."),
        click.option("--context-policy", type=click.Choice(["none", "truncate-observations", "summarize"]), default="none", show_default=True),
        click.option("--context-window", type=click.IntRange(min=1), default=None, help="Tokens the model accepts (default 131072)."),
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
            count = lambda text: len(tok.encode(text))  # noqa: E731
        return (lambda task: OraclePolicy(task.gold, count, task.id)), "oracle", {"name": "oracle", "tokenizer": kw.get("tokenizer")}
    from msa_eval.backends.factory import make_backend

    model = kw["model"] or "smollm2-135m"
    if kind == "local":
        b = make_backend("local", model=model, attention=kw["attention"])
        key = f"local:{kw['attention']}"
    else:
        b = make_backend("openai", base_url=kw["base_url"], model=model)
        key = f"openai:{model}"
    return (lambda task: b), key, b.describe()


@agent.command("list")
@click.option("--suite", default="default", show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None)
@click.option("--regenerate", is_flag=True, help="Regenerate instead of reading the cache.")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(suite, config_path, regenerate, as_json) -> None:
    """List the tasks of an agent suite (generating and validating them on first use)."""
    from agents.suite import load_suite

    tasks = load_suite(suite, config_path, regenerate)
    rows = [{"id": t.id, "family": t.family, "max_steps": t.limits.get("max_steps"), "gold_tool_calls": len(t.gold),
             "knobs": t.knobs, "hash": t.content_hash()} for t in tasks]
    display.print_json(rows) if as_json else display.agent_tasks_table(suite, rows)


@agent.command("run")
@click.option("--task", "task_ref", required=True, help="FAMILY (first task of A/B/C/D) or FAMILY:ID or ID.")
@_backend_opts
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Trajectory path (default runs/agents/<task>-<backend>.jsonl).")
@click.option("--resume", "resume", is_flag=True, help="Continue the trajectory at --out.")
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="Family A from your own repository (a directory with test_*.py files) instead of the suite.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help="Generator seed with --source.")
@click.option("--json", "as_json", is_flag=True)
def run_cmd(task_ref, out, resume, source, seed, as_json, **kw) -> None:
    """Run one agent task through the loop and grade it."""
    from agents.run_one import run_task
    from agents.suite import find_task, load_suite

    if source is not None:
        from agents.errors import AgentHarnessError
        from agents.families import get_family

        tasks = get_family("A").generate(seed, 1, source=str(source))
        if not tasks:
            raise AgentHarnessError(f"no single-site mutation of {source} breaks its tests; try another --seed or repository")
        task = tasks[0]
    else:
        task = find_task(load_suite(kw["suite"], kw["config_path"]), task_ref)
    factory, key, _ = _make_backend(kw)
    out = out or Path("runs") / "agents" / f"{task.id}-{key.replace(':', '-')}.jsonl"
    res = run_task(task, factory(task), _config(kw), out, resume=resume, container=_container(kw))
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
@click.option("--families", default=None, help="Only these families, e.g. A,B.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N tasks (>= 1).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Run directory (default runs/agents-<suite>-<backend>).")
@click.option("--json", "as_json", is_flag=True)
def run_agents(concurrency, families, limit, out, as_json, **kw) -> None:
    """Run an agent suite as a batch (resumable: rerun the same command to continue)."""
    from agents.batch import run_batch
    from agents.suite import load_suite

    tasks = load_suite(kw["suite"], kw["config_path"])
    if families:
        keep = {f.strip().upper() for f in families.split(",")}
        tasks = [t for t in tasks if t.family in keep]
    tasks = tasks[:limit] if limit else tasks
    factory, key, info = _make_backend(kw)
    out = out or Path("runs") / f"agents-{kw['suite']}-{key.replace(':', '-')}"
    display.info(f"run directory: {out} ({len(tasks)} tasks)")
    summary = run_batch(tasks, factory, key, info, _config(kw), out, kw["suite"], concurrency,
                        on_result=None if as_json else display.agent_record_line, container=_container(kw))
    rows = [r for r in summary.records if r["task_id"] in {t.id for t in tasks}]
    if as_json:
        display.print_json(rows)
    else:
        display.agent_summary_table(rows, summary.ran, summary.skipped)
