"""`msa-eval tasks list | show NAME`: the registered tasks and a rendered sample."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from msa_eval import display

if TYPE_CHECKING:
    from tasks.base import PromptMode


@click.group()
def tasks() -> None:
    """Offline tasks (HELMET-style suite, repo-scale coding, ...)."""


@tasks.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_tasks(as_json: bool) -> None:
    """Every registered task with its category, fidelity, metric and budget."""
    from tasks.registry import all_tasks

    rows = [cls().describe() for cls in all_tasks().values()]
    if as_json:
        display.print_json(rows)
        return
    display.table("tasks", ["name", "category", "fidelity", "metric", "max_tokens", "description"],
                  [(r["name"], r["category"], r["fidelity"], r["metric"], r["max_tokens"],
                    r["description"]) for r in rows])


@tasks.command("show")
@click.argument("name")
@click.option("--length", default="2k", show_default=True, help="Target length of the sample.")
@click.option("--index", type=int, default=0, show_default=True, help="Sample index.")
@click.option("--mode", type=click.Choice(["chat", "completion"]), default="chat", show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--tokenizer", "reference", default="smollm2-135m", show_default=True,
              help="Reference tokenizer (model name/path or tokenizer.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole sample as JSON.")
def show(name: str, length: str, index: int, mode: PromptMode, seed: int, reference: str, as_json: bool) -> None:
    """Describe task NAME and render one sample (prompt head and tail, gold, metadata)."""
    from msa_eval.runner.config import ConfigError, parse_length
    from msa_eval.runner.plan import make_task
    from msa_eval.runner.reference import load_reference_tokenizer
    from tasks.base import BuildSpec, TaskError

    task = make_task(name, {})
    tok, _ = load_reference_tokenizer(reference)
    try:
        sample = task.build(index, BuildSpec(parse_length(length), tok, mode, seed))
    except TaskError as e:
        raise ConfigError(str(e)) from None
    if as_json:
        display.print_json({"task": task.describe(), "sample": sample.to_dict()})
    else:
        display.task_sample(task.describe(), sample.to_dict())
