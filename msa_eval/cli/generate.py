"""`msa-eval generate --model M [--chat] PROMPT`: stream tokens from the local engine."""
from __future__ import annotations

import click

from msa_eval import display
from msa_eval.cli.options import attention_option, engine_kwargs, engine_options

SEED_MAX = 2**63 - 1  # torch generators take a signed 64-bit seed


@click.command()
@click.argument("prompt")
@click.option("--model", default="smollm2-135m", show_default=True, help="Built-in name, HF directory or .gguf path.")
@attention_option()
@click.option("--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--seed", default=None, type=click.IntRange(0, SEED_MAX), help="Sampling seed, 0..2**63-1.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available).")
@engine_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming.")
def generate(prompt, model, attention, chat, max_tokens, temperature, top_p, top_k, seed, stop, device, weights,
             kv_cache_tokens, no_dequant_cache, tensor_parallel_size, kv_cache_dtype, as_json):
    """Generate a completion for PROMPT."""
    from msa_eval.errors import MsaEvalError

    if not prompt:
        raise MsaEvalError('PROMPT is empty: give the text to continue, e.g. msa-eval generate "Once upon a time"')
    if any(s == "" for s in stop):
        raise MsaEvalError("--stop got an empty string (it would stop before the first token): "
                           "give a non-empty stop string")
    from engine import LLM, SamplingParams
    from engine.textstream import IncrementalText

    try:  # checked before the model loads
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, stop=list(stop))
    except ValueError as e:
        raise MsaEvalError(f"bad sampling option: {e}") from None
    llm = LLM(model, attention=attention, device=device,
              **engine_kwargs(weights, kv_cache_tokens, no_dequant_cache, tensor_parallel_size, kv_cache_dtype))
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    ids = llm.tokenizer.encode(text, add_special_tokens=not chat)
    shown = IncrementalText(llm.tokenizer, params.stop)  # never prints past a stop string
    for step in llm.stream(ids, params):
        if not as_json:
            display.stream_text(shown.add(step.new_token_ids))
    out = llm.finish(step.request_id)
    if as_json:
        display.print_json({"model": llm.model_id, "attention": attention, "weights": llm.weights, "text": out.text,
                            "prompt_tokens": len(ids), "completion_tokens": len(out.token_ids),
                            "finish_reason": out.finish_reason, "metrics": out.metrics})
    else:
        display.stream_text(shown.flush() + "\n")
