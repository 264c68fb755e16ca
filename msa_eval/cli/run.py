"""`msa-eval run SUITE --backend local|openai ...`: run a suite and print the side-by-side table.

Default (`msa-eval run helmet --backend local`): the default model, MSA and dense attention,
the suite's lengths (those the model can hold), ending with the report table.
"""
from __future__ import annotations

from pathlib import Path

import click

from msa_eval import display
from msa_eval.cli.options import arms_option, engine_kwargs, engine_options


@click.command()
@click.argument("suite", default="helmet")
@click.option("--backend", "backend_kind", type=click.Choice(["local", "openai"]), default="local",
              show_default=True, help="Where the model runs.")
@click.option("--model", default=None,
              help="local: built-in name, HF dir or .gguf (default smollm2-135m); openai: model id.")
@arms_option(help="local backend attention arms: both (msa and dense) or a comma list of dense, msa, msa-ref, "
             "msa-oracle (e.g. dense,msa,msa-oracle), run on identical prompts.")
@click.option("--base-url", default=None, help="openai backend: the endpoint's base URL (…/v1).")
@click.option("--tokenizer", "reference", default=None,
              help="Reference tokenizer for prompt fitting (model name/path or tokenizer.json); "
                   "default: the local model, else smollm2-135m.")
@click.option("--lengths", default=None, help="Target lengths, e.g. 2k,4k,8k (default: the suite's).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Samples per task and length.")
@click.option("--tasks", "task_names", default=None, help="Comma-separated task names (default: the suite's).")
@click.option("--mode", type=click.Choice(["chat", "completion"]), default=None,
              help="Prompt mode (default: the suite's).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None,
              help="Generator seed, 0..2**63-1 (default: the suite's).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Requests per batch, >= 1 (local default 1, openai 8).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Run at most N samples per task and length (same run directory).")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default runs/<suite>-<backend>-<config hash>).")
@click.option("--backend-opt", "backend_opts", multiple=True, metavar="KEY=VALUE",
              help="Backend option, repeatable (openai: max_retries=0, chat_only=true, ...; "
                   "local: max_num_seqs=4, ...).")
@click.option("--judge", "judge", default=None, metavar="SPEC",
              help="Optional judge of the open-ended tasks (summ, longqa), off by default and never in the "
                   "headline: local[:MODEL[:ATTENTION]], openai:MODEL@BASE_URL or preset:NAME.")
@click.option("--judge-opt", "judge_opts", multiple=True, metavar="KEY=VALUE",
              help="Judge backend option, repeatable (e.g. api_key_env=MY_KEY).")
@engine_options
@click.option("--telemetry/--no-telemetry", default=True, show_default=True,
              help="Local MSA arms: record what the indexer chose per sample (block recall against the oracle, "
                   "keys read, layer overlap; decode runs eagerly: a quality run, not a speed run).")
@click.option("--dry-run", is_flag=True,
              help="Build prompts and show token counts (with --json: the prompts); load no model.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run(suite, backend_kind, model, attention, base_url, reference, lengths, samples, task_names,
        mode, seed, concurrency, limit, out, backend_opts, judge, judge_opts, weights, kv_cache_tokens,
        no_dequant_cache, tensor_parallel_size, kv_cache_dtype, telemetry, dry_run, as_json) -> None:
    """Run SUITE (a name under configs/ or a YAML path) and print the side-by-side report."""
    from msa_eval.cli.run_setup import RunArgs, prepare

    args = RunArgs(suite, backend_kind, model, attention, base_url, reference, lengths, samples,
                   task_names, mode, seed, concurrency, limit, out, backend_opts,
                   engine_kwargs(weights, kv_cache_tokens, no_dequant_cache, tensor_parallel_size, kv_cache_dtype),
                   telemetry)
    judge_spec = None
    if judge:
        from msa_eval.judge import parse_judge_spec
        from msa_eval.runner.config import parse_backend_opts

        judge_spec = parse_judge_spec(judge, parse_backend_opts(tuple(judge_opts)))
    prep = prepare(args)
    if dry_run:
        if as_json:  # every prompt, exactly as each backend would receive it
            display.print_json([s.to_dict() | {"prompt_hash": s.prompt_hash()}
                                for p in prep.plan for s in p.samples])
            return
        display.dry_run_table(prep.dry_run_rows())
        display.info(f"{prep.n_samples} samples x {len(prep.cfg.backends)} backend(s); "
                     f"would write {prep.run_dir}", dim=True)
        return
    from msa_eval.backends.base import BackendError
    from msa_eval.errors import MsaEvalError
    from msa_eval.report import build_report, load_runs
    from msa_eval.report.plots import plot_report
    from msa_eval.report.writers import write_report
    from msa_eval.runner import run_suite

    display.info(f"run directory: {prep.run_dir}")
    try:
        with display.RunProgress() as progress:
            result = run_suite(prep.cfg, prep.run_dir, prep.plan, prep.reference_info, progress=progress,
                               reference_tokenizer=prep.tokenizer)
            if judge_spec is not None:
                from msa_eval.judge_run import judge_run
                from msa_eval.runner.run import default_factory

                counts = judge_run(prep.run_dir, {s.id: s for p in prep.plan for s in p.samples},
                                   judge_spec, default_factory, progress=progress)
    except BackendError as e:  # harness failure: one line; the records written so far are kept
        raise MsaEvalError(str(e)) from None
    records = load_runs([prep.run_dir])
    wanted = {s.id for p in prep.plan for s in p.samples}
    records = [r for r in records if r.sample_id in wanted]
    rep = build_report(records)
    paths = write_report(rep, prep.run_dir / "report")
    plot_report(rep, records, prep.run_dir / "report")
    if as_json:
        display.print_json(rep.to_dict())
    else:
        display.report_tables(rep)
    display.info(f"{result.generated} generated, {result.skipped} resumed, {result.errors} errors; "
                 f"report: {paths['markdown']}", dim=True)
    if judge_spec is not None:
        display.info(f"judge: {counts['judged']} judged, {counts['skipped']} kept, "
                     f"{counts['errors']} errors (not in the headline)", dim=True)
