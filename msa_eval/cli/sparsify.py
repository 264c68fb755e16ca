"""`msa-eval sparsify --model M --out DIR`: give a dense GQA checkpoint an MSA indexer (KL alignment,
frozen backbone). The adapter is then used as `--model M+DIR --attention msa`."""
from __future__ import annotations

import shlex
import sys

import click

from msa_eval import display


def _layers(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    if value.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give comma-separated layer indices, e.g. 0,1 (or 'none')") from None


@click.command("sparsify")
@click.option("--model", required=True, help="Built-in name, HF directory or .gguf path (a dense GQA model).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Adapter folder to write (resumes a checkpoint there).")
@click.option("--block-size", default=128, show_default=True, type=click.Choice(["64", "128"]),
              help="MSA block = KV page size.")
@click.option("--topk", default=16, show_default=True, type=click.Choice(["4", "8", "16", "32"]),
              help="Blocks per query (own block included).")
@click.option("--d-idx", default=None, type=click.Choice(["16", "32", "64", "128", "256"]),
              help="Index head dim [default: the model's head dim].")
@click.option("--dense-layers", default=None, help="Comma-separated layers kept dense [default: 0,1], or 'none'.")
@click.option("--index-norm/--no-index-norm", default=False, show_default=True,
              help="Learned RMSNorm on the index heads.")
@click.option("--tokens", default=16384, show_default=True, type=click.IntRange(min=1),
              help="Calibration tokens (plus one held-out sequence).")
@click.option("--seq-len", default=8192, show_default=True, type=click.IntRange(min=128))
@click.option("--warmup-steps", default=40, show_default=True, type=click.IntRange(min=0),
              help="Dense-KL steps per layer.")
@click.option("--steps", default=20, show_default=True, type=click.IntRange(min=0),
              help="Sparse-KL steps per layer after the warm-up.")
@click.option("--queries", default=128, show_default=True, type=click.IntRange(min=1), help="Query positions per step.")
@click.option("--lr", default=2e-3, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--teacher", default="mean", show_default=True, type=click.Choice(["mean", "max"]),
              help="Group teacher: mean of the heads' probabilities (msa-spec) or their per-key max, renormalised.")
@click.option("--long-range", default=0.0, show_default=True, type=click.FloatRange(0, 1),
              help="Share of each step's queries taken as those with the most attention mass outside their own block.")
@click.option("--recurrence", default=0.0, show_default=True, type=click.FloatRange(0, 0.5),
              help="Share of training tokens overwritten by copies of earlier spans of the same sequence (long-range "
                   "look-ups).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--data", multiple=True, type=click.Path(exists=True),
              help="Text / .jsonl files, folders or a saved `datasets` dataset (repeatable) [default: an offline "
                   "corpus from this machine].")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available).")
@click.option("--json", "as_json", is_flag=True, help="Print the provenance as JSON.")
def sparsify_cmd(model, out, block_size, topk, d_idx, dense_layers, index_norm, tokens, seq_len, warmup_steps,
                 steps, queries, lr, teacher, long_range, recurrence, seed, data, device, as_json):
    """Train MSA index projections for MODEL by KL alignment; the backbone stays frozen."""
    from engine.sparsify import SparsifyConfig, sparsify
    from msa_eval.errors import MsaEvalError

    try:
        cfg = SparsifyConfig(model=model, out=out, block_size=int(block_size), topk=int(topk),
                             d_idx=int(d_idx) if d_idx else None, dense_layers=_layers(dense_layers),
                             index_norm=index_norm, tokens=tokens, seq_len=seq_len, warmup_steps=warmup_steps,
                             steps=steps, queries=queries, lr=lr, teacher=teacher, long_range=long_range,
                             recurrence=recurrence, seed=seed, data=tuple(data), device=device)
    except ValueError as e:
        raise MsaEvalError(str(e)) from None
    command = "msa-eval " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    prov = sparsify(cfg, command=command, progress=not as_json)
    if as_json:
        display.print_json(prov)
    else:
        display.sparsify_summary(prov, out)
