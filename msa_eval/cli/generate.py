"""`msa-eval generate --model M [--chat] PROMPT`: stream tokens from the local engine."""
from __future__ import annotations

import click

from msa_eval import display

SEED_MAX = 2**63 - 1  # torch generators take a signed 64-bit seed


@click.command()
@click.argument("prompt")
@click.option("--model", default="smollm2-135m", show_default=True, help="Built-in name, HF directory or .gguf path.")
@click.option("--attention", type=click.Choice(["dense", "msa", "msa-ref"]), default="dense", show_default=True)
@click.option("--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--seed", default=None, type=click.IntRange(0, SEED_MAX), help="Sampling seed, 0..2**63-1.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available).")
@click.option("--weights", type=click.Choice(["fp32", "bf16", "q4"]), default=None,
              help="CPU weight mode: fp32 (exact), bf16, or q4 (a GGUF's 4-bit codes; fastest). "
                   "Default: $MSA_EVAL_WEIGHTS, else fp32.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming.")
def generate(prompt, model, attention, chat, max_tokens, temperature, top_p, top_k, seed, stop, device, weights,
             as_json):
    """Generate a completion for PROMPT."""
    from msa_eval.errors import MsaEvalError

    if not prompt:
        raise MsaEvalError('PROMPT is empty: give the text to continue, e.g. msa-eval generate "Once upon a time"')
    if any(s == "" for s in stop):
        raise MsaEvalError("--stop got an empty string (it would stop before the first token): give a non-empty stop string")
    from engine import LLM, SamplingParams

    try:  # checked before the model loads
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, stop=list(stop))
    except ValueError as e:
        raise MsaEvalError(f"bad sampling option: {e}") from None
    llm = LLM(model, attention=attention, device=device, weights=weights)
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    ids = llm.tokenizer.encode(text, add_special_tokens=not chat)
    eng = llm.engine
    seq = eng.add_request("cli-0", ids, params)
    shown = ""
    while eng.has_unfinished():
        eng.step()
        if not as_json:
            now = llm.tokenizer.decode(seq.output_ids)
            for s in params.stop:  # never print past a stop string
                if s in now:
                    now = now[: now.find(s)]
            if now.startswith(shown) and len(now) > len(shown) and not now.endswith("\ufffd"):
                display.stream_text(now[len(shown):])
                shown = now
    out = llm._output(eng.pop_finished("cli-0"))
    if as_json:
        display.print_json({"model": llm.model_id, "attention": attention, "weights": llm.weights, "text": out.text,
                            "prompt_tokens": len(ids), "completion_tokens": len(out.token_ids),
                            "finish_reason": out.finish_reason, "metrics": out.metrics})
    else:
        if out.text.startswith(shown) and len(out.text) > len(shown):
            display.stream_text(out.text[len(shown):])
        display.stream_text("\n")
