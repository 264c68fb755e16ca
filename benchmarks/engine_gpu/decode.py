"""Decode speed of the engine on one GPU: the 8B-shape bandwidth roofline at batch 1, and our engine
against HF transformers in the same process, HF in its default mode (dynamic cache, eager) and its
fastest (static cache with its decode step compiled by torch.compile)."""
from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import dataclass

import torch

from benchmarks.engine_gpu.stacks import (
    copy_bandwidth,
    fake_prefill,
    free,
    kv_bytes_per_token,
    random_prompt,
    stack_engine,
    sync,
    timed_steps,
    weight_bytes_per_token,
)


@dataclass(frozen=True)
class Roofline:
    """8B shape, batch 1, dense: median step time against the copy-bandwidth roofline (bytes/token =
    weights read per step + K/V of `ctx` tokens), measured copy bandwidth first."""

    ctx: int = 4096
    steps: int = 64
    graphs: tuple[bool, ...] = (True, False)
    name = "roofline"

    def run(self, opts) -> list[dict]:
        bw = copy_bandwidth()
        rows = [{"bench": "copy_bandwidth", "bytes_per_s": bw}]
        print(rows[-1], flush=True)
        for graphs in self.graphs:
            eng, model = stack_engine("llama-3.1-8b", "dense", kv_tokens=self.ctx + 2 * self.steps + 256,
                                      max_num_seqs=1, max_model_len=self.ctx + 2 * self.steps + 128,
                                      cuda_graphs=graphs)
            fake_prefill(eng, 1, self.ctx, max_tokens=self.steps + 8)
            t = statistics.median(timed_steps(eng, self.steps))
            need = weight_bytes_per_token(model) + kv_bytes_per_token(model.cfg, self.ctx)
            rows.append({"bench": "roofline", "shape": "llama-3.1-8b", "batch": 1, "ctx": self.ctx, "graphs": graphs,
                         "step_ms": t * 1e3, "tok_s": 1 / t, "bytes_per_token": need,
                         "roofline_tok_s": bw / need, "frac_roofline": (need / t) / bw})
            print(rows[-1], flush=True)
            del eng, model
            free()
        return rows


def ours_decode(eng, batch: int, prompt: int, new: int, vocab: int) -> float:
    """Decode tokens/s of our engine: `batch` prompts of `prompt` tokens, `new` tokens each; the decode
    tokens are those the steps after the prefill step return (one-step-late decode returns a step's
    tokens at the next call, so counting calls would not count tokens)."""
    from engine.sampling import SamplingParams

    for i in range(batch):
        eng.add_request(f"b{batch}-{i}-{time.time_ns()}", random_prompt(prompt, vocab, i),
                        SamplingParams(max_tokens=new, ignore_eos=True))
    eng.step()  # the whole batch prefills in one step and samples its first tokens
    sync()
    t0, tokens = time.perf_counter(), 0
    while eng.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in eng.step())
    assert tokens == batch * (new - 1), (tokens, batch, new)
    return tokens / (time.perf_counter() - t0)


def hf_decode(hf, batch: int, prompt: int, new: int, vocab: int, compiled: bool = False,
              repeats: int = 1) -> tuple[list[float], float | None]:
    """HF `generate` decode tokens/s = batch x (new - 1) / (time of `new` tokens - time of 1 token), after
    warm-up. `compiled`: HF's fastest mode, a static cache (`cache_implementation="static"`), with
    which `generate` compiles its decode step (`torch.compile`, HF's default CompileConfig: inductor,
    mode "reduce-overhead" = CUDA graphs); dynamo is reset first so this batch size compiles with
    static shapes. Returns (tokens/s of each of `repeats` timings, compile seconds: first warm-up minus
    a warm run; None eager)."""
    ids = torch.tensor([random_prompt(prompt, vocab, i) for i in range(batch)], device=hf.device)
    kw: dict = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    if compiled:
        kw["cache_implementation"] = "static"

    def run(n: int) -> float:
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync()
        assert out.shape[1] == prompt + n
        return time.perf_counter() - t

    compile_s = None
    if compiled:
        torch._dynamo.reset()
        if hasattr(hf, "_compiled_call"):
            del hf._compiled_call
        first = run(new)  # compiles the decode step
        warm = run(new)  # records the CUDA graphs of the compiled step
        compile_s = first - warm
        print(f"HF compiled (batch {batch}): compiled call {hasattr(hf, '_compiled_call')}, first warm-up "
              f"{first:.1f} s, warm {warm:.2f} s", flush=True)
    else:
        run(4)  # warm-up
    rates = []
    for _ in range(repeats):
        t1, tn = run(1), run(new)
        rates.append(batch * (new - 1) / (tn - t1))
    return rates, compile_s


def hf_from_config(cfg, weights=None, device: str = "cuda"):
    """An HF `LlamaForCausalLM` (bf16, SDPA) of our config, with `weights` (HF names) or random."""
    import transformers

    hc = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position, rms_norm_eps=cfg.rms_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings)
    hc._attn_implementation = "sdpa"
    with torch.device(device):
        m = transformers.LlamaForCausalLM(hc).to(torch.bfloat16)
    if weights is not None:
        missing, _ = m.load_state_dict({k: v for k, v in weights.items() if k in m.state_dict()}, strict=False)
        assert not [k for k in missing if "lm_head" not in k], missing
    return m.eval()


@dataclass(frozen=True)
class VersusHF:
    """Ours against HF `generate` per model and batch: `prompt` random tokens, `new` new tokens, greedy.
    Each rate is timed `repeats` times (ours: whole runs after a warm-up run that captures the graphs;
    HF: the 1-token / `new`-token pair after its warm-up and compile); the row holds the median and
    the runs."""

    cases: tuple[str, ...] = ("default", "llama-3.1-8b")
    hf_modes: tuple[str, ...] = ("eager", "compiled")
    batches: tuple[int, ...] = (1, 8)
    prompt: int = 512
    new: int = 64
    repeats: int = 1
    name = "vs_hf"

    def run(self, opts) -> list[dict]:
        from engine import LLM

        rows = []
        for case in self.cases:
            if case == "default":  # the default model from its GGUF, weights shared with HF
                from engine.loader import load

                llm = LLM(opts.model, device="cuda", dtype="bfloat16", max_num_seqs=8, max_num_batched_tokens=8192,
                          kv_cache_tokens=65536, progress=False)
                eng, cfg = llm.engine, llm.config
                hf = hf_from_config(cfg, load(opts.model, progress=False).weights)
            else:
                eng, model = stack_engine(case, "dense", kv_tokens=8 * (self.prompt + self.new) + 4096, max_num_seqs=8,
                                          max_model_len=4096)
                cfg = model.cfg
                hf = hf_from_config(cfg)
            for batch in self.batches:
                rows.append(self._row(case, eng, hf, cfg, batch))
                print(rows[-1], flush=True)
            del eng, hf
            free()
        return rows

    def _row(self, case: str, eng, hf, cfg, batch: int) -> dict:
        ours_decode(eng, batch, self.prompt, 8, cfg.vocab_size)  # warm-up: graph capture for this size
        ours = [ours_decode(eng, batch, self.prompt, self.new, cfg.vocab_size) for _ in range(self.repeats)]
        a = statistics.median(ours)
        row = {"bench": "vs_hf", "model": case, "batch": batch, "prompt": self.prompt, "new": self.new,
               "ours_tok_s": a, "ours_runs": ours}
        if "eager" in self.hf_modes:
            b, _ = hf_decode(hf, batch, self.prompt, self.new, cfg.vocab_size, repeats=self.repeats)
            row.update(hf_tok_s=statistics.median(b), hf_runs=b, speedup=a / statistics.median(b))
        if "compiled" in self.hf_modes:
            try:
                c, compile_s = hf_decode(hf, batch, self.prompt, self.new, cfg.vocab_size, compiled=True,
                                         repeats=self.repeats)
                row.update(hf_compiled_tok_s=statistics.median(c), hf_compiled_runs=c, hf_compile_s=compile_s,
                           speedup_compiled=a / statistics.median(c), hf_compiled_call=hasattr(hf, "_compiled_call"))
            except Exception as e:  # noqa: BLE001 - keep ours and the eager numbers
                traceback.print_exc()
                row["hf_compiled_error"] = repr(e)
        return row
