"""`msa-eval export-tokenizer MODEL DIR [--force]`: the model's tokenizer as Hugging Face files
(`engine.tokenizer_export`), for clients that tokenise on their side."""
from __future__ import annotations

from pathlib import Path

import click

from msa_eval import display


@click.command("export-tokenizer")
@click.argument("model")
@click.argument("out_dir", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace tokenizer files already in DIR.")
def export_tokenizer(model: str, out_dir: Path, force: bool) -> None:
    """Write MODEL's tokenizer (built-in name, .gguf path or HF directory) into DIR as tokenizer.json,
    tokenizer_config.json (chat template, bos/eos, context length) and special_tokens_map.json: what
    transformers' AutoTokenizer.from_pretrained(DIR) and lm-eval's huggingface tokenizer backend read.

    \b
    msa-eval export-tokenizer smollm2-135m tok/
    lm_eval --model local-completions --model_args base_url=...,tokenizer_backend=huggingface,tokenizer=tok/ ...
    """
    from engine.loader.resolve import load_tokenizer
    from engine.tokenizer_export import write_hf_tokenizer
    from msa_eval.errors import MsaEvalError

    loaded = load_tokenizer(model)
    try:
        paths = write_hf_tokenizer(loaded.tokenizer, out_dir, loaded.config.max_position, force=force)
    except (FileExistsError, NotADirectoryError) as e:
        raise MsaEvalError(str(e)) from None
    display.info(f"tokenizer of {loaded.model_id} written: {', '.join(str(p) for p in paths)}")
