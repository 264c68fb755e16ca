"""The engine's tokenizer as Hugging Face tokenizer files, for clients that tokenise on their side
(lm-eval's `tokenizer_backend=huggingface`, transformers' `AutoTokenizer.from_pretrained(DIR)`).

Written: `tokenizer.json` (the `tokenizers` object the engine encodes with, saved by that library),
`tokenizer_config.json` (`PreTrainedTokenizerFast`, bos / eos, the chat template, `model_max_length`)
and `special_tokens_map.json`. The post-processor is replaced by one that adds exactly what
`Tokenizer.encode(text, add_special_tokens=True)` adds (BOS when the model asks for it, else nothing), so
`AutoTokenizer(...)(text)` gives the engine's ids. Limits: transformers' `decode(skip_special_tokens=True)`
also drops the answer markup the engine keeps (`engine.tokenizer.MARKUP_TOKENS`, for models that mark
those tokens special); templates render with transformers' own Jinja environment (the same options).
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.tokenizer import Tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def hf_tokenizer_files(tok: Tokenizer, model_max_length: int) -> dict[str, str]:
    """File name -> text of the three files for `tok` (nothing written)."""
    from tokenizers import processors

    backend = tok._tok.__class__.from_str(tok._tok.to_str())  # a copy: the engine's object is left alone
    bos = tok.bos_token if tok.add_bos and tok.bos_token_id is not None else None
    if bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tok.bos_token_id)])
    else:
        backend.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    special = {k: v for k, v in (("bos_token", tok.bos_token), ("eos_token", tok.eos_token)) if v}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": bool(bos),
              "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": int(model_max_length)}
    if tok.chat_template is not None:
        config["chat_template"] = tok.chat_template
    return {"tokenizer.json": backend.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False) + "\n"}


def write_hf_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int, force: bool = False) -> list[Path]:
    """Write the files into `out_dir` (created if missing); each lands whole (written beside, renamed in).
    A directory already holding one of them is refused unless `force`: FileExistsError naming it."""
    from msa_common.atomic import atomic_write_text

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} is a file: give a directory for the tokenizer files")
    present = [n for n in FILES if (out_dir / n).exists()]
    if present and not force:
        raise FileExistsError(f"{out_dir} already holds {', '.join(present)}: pass --force to replace them")
    texts = hf_tokenizer_files(tok, model_max_length)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        atomic_write_text(out_dir / name, text)
    return [out_dir / n for n in FILES]
