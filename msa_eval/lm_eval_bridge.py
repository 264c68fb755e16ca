"""lm-evaluation-harness bridge: the in-process engine as the lm_eval model `msa-local`.

    python -m msa_eval.lm_eval_bridge --model msa-local \
        --model_args model=smollm2-135m,attention=msa --tasks T [--include_path DIR] ...

runs lm_eval's own CLI with `msa-local` registered (lm_eval has no plugin discovery for
models, so a plain `lm_eval` process cannot see it); from Python, `import
msa_eval.lm_eval_bridge` and pass `model="msa-local"` to `lm_eval.simple_evaluate`.

- `loglikelihood` / `loglikelihood_rolling` score token ids with `LLM.prompt_logprobs`
  (log p(t_i | t_<i) under the chosen attention); contexts longer than the model's window
  are cut from the left, rolling windows follow lm_eval's `get_rolling_token_windows`.
- `generate_until` batches every request through `LLM.generate` (continuous batching),
  greedy unless `temperature` > 0, stopping at `until` strings; contexts are cut from the
  left to leave room for `max_gen_toks`.
Needs the optional extra `lm-eval` (`pip install 'msa-eval[lm-eval]'`).
"""
from __future__ import annotations

import sys
from typing import Any

import lm_eval.models  # noqa: F401 - registers lm-eval's own models first: registering ours before that hides them
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model


@register_model("msa-local")
class MsaLocalLM(TemplateLM):
    """lm_eval LM over `engine.LLM`; model_args: model, attention, max_length, max_gen_toks,
    device, dtype, max_num_seqs."""

    def __init__(self, model: str = "smollm2-135m", attention: str = "dense",
                 max_length: int | None = None, max_gen_toks: int = 256, device: str | None = None,
                 dtype: str | None = None, max_num_seqs: int = 8, batch_size: Any = None,
                 **_ignored: Any) -> None:
        super().__init__()
        import torch

        from engine import LLM

        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            device = None  # lm_eval's CLI passes --device cuda by default; fall back to auto
        self.llm = LLM(model=str(model), attention=str(attention), device=device, dtype=dtype,
                       max_model_len=int(max_length) if max_length else None,
                       max_num_seqs=int(max_num_seqs), progress=False)
        self.tokenizer = self.llm.tokenizer
        self._max_length = self.llm.max_model_len
        self.max_gen_toks = int(max_gen_toks)
        self.attention = str(attention)

    # -- TemplateLM plumbing ---------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token
        tid = self.tokenizer.token_to_id(eos) if eos else None
        return tid if tid is not None else min(self.tokenizer.eos_token_ids)

    @property
    def prefix_token_id(self) -> int:
        """The token a rolling window starts from: BOS when the tokenizer has one, else EOS -- the rule of
        lm-eval's HF and API models, so `loglikelihood_rolling` here equals theirs on the same model."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return f"{self.llm.model_id}:{self.tokenizer.fingerprint()[:16]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw: Any) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    # -- scoring ----------------------------------------------------------------------------
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Sum of log p(continuation | context) and whether every token was the argmax."""
        if not continuation:
            return 0.0, True
        ids = (context + continuation)[-self._max_length:]
        lps = self.llm.prompt_logprobs(ids, top_n=1)
        total, greedy = 0.0, True
        for pos in range(len(ids) - len(continuation), len(ids)):
            lp, top = lps[pos]
            total += lp
            greedy = greedy and bool(top) and max(top, key=top.get) == ids[pos]
        return total, greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kw: Any):
        out = []
        for key, ctx, cont in requests:
            res = self._score(list(ctx), list(cont))
            self.cache_hook.add_partial("loglikelihood", key, res)
            out.append(res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [r.args for r in requests]:
            windows = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self._max_length, context_len=1))
            total = sum(self._score(list(c), list(t))[0] for c, t in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    # -- generation -------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from engine import SamplingParams

        prompts, params = [], []
        for context, gen_kwargs in [r.args for r in requests]:
            kw = dict(gen_kwargs or {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kw.pop("temperature", 0.0) or 0.0)
            if not kw.pop("do_sample", temperature > 0):
                temperature = 0.0
            ids = self.tok_encode(context)[-max(1, self._max_length - max_new):]
            prompts.append(ids)
            params.append(SamplingParams(max_tokens=max_new, temperature=temperature,
                                         top_p=float(kw.pop("top_p", 1.0) or 1.0), stop=until))
        outs = self.llm.generate(prompts, params) if prompts else []
        texts = []
        for (context, gen_kwargs), o in zip([r.args for r in requests], outs, strict=True):
            texts.append(o.text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), o.text)
        return texts


def main(argv: list[str] | None = None) -> None:
    """lm_eval's CLI with `msa-local` registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
