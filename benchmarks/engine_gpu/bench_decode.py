"""Decode speed of the engine on one GPU: the 8B-shape bandwidth roofline at batch 1 / 4K context,
and our engine against HF transformers (same GPU, same run) at batch 1 and 8 for the default model
and the 8B shape, HF in its default mode (dynamic cache, eager) and its fastest (static cache with
its decode step compiled by torch.compile).

    python3 benchmarks/engine_gpu/bench_decode.py --out $OUT --gguf /root/models/smollm2.gguf
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from benchmarks.engine_gpu.common import (run_sections, copy_bandwidth, env_info, fake_prefill, kv_bytes_per_token, random_prompt,
                                          stack_engine, timed_steps, weight_bytes_per_token)


def roofline(rows: list[dict], bw: float, ctx: int, steps: int, graph_modes: tuple[bool, ...] = (True, False)) -> None:
    for graphs in graph_modes:
        eng, model = stack_engine("llama-3.1-8b", "dense", kv_tokens=ctx + 2 * steps + 256, max_num_seqs=1,
                                  max_model_len=ctx + 2 * steps + 128, cuda_graphs=graphs)
        fake_prefill(eng, 1, ctx, max_tokens=steps + 8)
        t = statistics.median(timed_steps(eng, steps))
        need = weight_bytes_per_token(model) + kv_bytes_per_token(model.cfg, ctx)
        rows.append({"bench": "roofline", "shape": "llama-3.1-8b", "batch": 1, "ctx": ctx, "graphs": graphs,
                     "step_ms": t * 1e3, "tok_s": 1 / t, "bytes_per_token": need,
                     "roofline_tok_s": bw / need, "frac_roofline": (need / t) / bw})
        print(rows[-1], flush=True)
        del eng, model
        gc.collect()
        torch.cuda.empty_cache()


def ours_decode(eng, batch: int, prompt: int, new: int, vocab: int) -> float:
    """Decode tokens/s of our engine: `batch` prompts of `prompt` tokens, `new` tokens each; the decode
    tokens are those the steps after the prefill step return (one-step-late decode returns a step's
    tokens at the next call, so counting calls would not count tokens)."""
    from engine.sampling import SamplingParams

    for i in range(batch):
        eng.add_request(f"b{batch}-{i}-{time.time_ns()}", random_prompt(prompt, vocab, i),
                        SamplingParams(max_tokens=new, ignore_eos=True))
    eng.step()  # the whole batch prefills in one step and samples its first tokens
    torch.cuda.synchronize()
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
    static shapes. Returns (tokens/s of each of `repeats` timings, compile seconds: first warm-up minus a warm
    run; None eager)."""
    ids = torch.tensor([random_prompt(prompt, vocab, i) for i in range(batch)], device=hf.device)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    if compiled:
        kw["cache_implementation"] = "static"

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
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


def hf_from_config(cfg, weights=None):
    import transformers

    hc = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position, rms_norm_eps=cfg.rms_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings)
    hc._attn_implementation = "sdpa"
    with torch.device("cuda"):
        m = transformers.LlamaForCausalLM(hc).to(torch.bfloat16)
    if weights is not None:
        missing, unexpected = m.load_state_dict({k: v for k, v in weights.items() if k in m.state_dict()}, strict=False)
        assert not [k for k in missing if "lm_head" not in k], missing
    return m.eval()


def versus_hf(rows: list[dict], gguf: str | None, prompt: int, new: int,
              hf_modes: tuple[str, ...] = ("eager", "compiled"), cases: tuple[str, ...] = ("default", "llama-3.1-8b"),
              repeats: int = 1, ours_fused: bool = False) -> None:
    """Ours and HF per case and batch; with `repeats` > 1 each rate is timed that many times (ours: whole
    generate runs; HF: the 1-token / `new`-token pair, after its warm-up and compile) and the median
    is the row's value, the runs listed beside it."""
    from engine import LLM

    for case in cases:
        if case == "default":
            if not gguf:
                continue
            from engine.loader import load

            llm = LLM(gguf, device="cuda", dtype="bfloat16", max_num_seqs=8, max_num_batched_tokens=8192,
                      kv_cache_tokens=65536, progress=False)
            eng, cfg = llm.engine, llm.config
            hf = hf_from_config(cfg, load(gguf, progress=False).weights)
        else:
            eng, model = stack_engine(case, "dense", kv_tokens=8 * (prompt + new) + 4096, max_num_seqs=8,
                                      max_model_len=4096)
            cfg = model.cfg
            hf = hf_from_config(cfg)
        for batch in (1, 8):
            ours_decode(eng, batch, prompt, 8, cfg.vocab_size)  # warm-up: graph capture for this size
            ours = [ours_decode(eng, batch, prompt, new, cfg.vocab_size) for _ in range(repeats)]
            a = statistics.median(ours)
            row = {"bench": "vs_hf", "model": case, "batch": batch, "prompt": prompt, "new": new, "ours_tok_s": a,
                   "ours_runs": ours}
            if ours_fused:  # the same engine with engine.gpu.fused_decode (graphs captured again), then without
                from benchmarks.engine_gpu.bench_step import set_fused

                set_fused(eng, True)
                ours_decode(eng, batch, prompt, 8, cfg.vocab_size)
                row["ours_fused_runs"] = [ours_decode(eng, batch, prompt, new, cfg.vocab_size) for _ in range(repeats)]
                row["ours_fused_tok_s"] = statistics.median(row["ours_fused_runs"])
                set_fused(eng, False)
                ours_decode(eng, batch, prompt, 8, cfg.vocab_size)
            if "eager" in hf_modes:
                b, _ = hf_decode(hf, batch, prompt, new, cfg.vocab_size, repeats=repeats)
                row.update(hf_tok_s=statistics.median(b), hf_runs=b, speedup=a / statistics.median(b))
            if "compiled" in hf_modes:
                try:
                    c, compile_s = hf_decode(hf, batch, prompt, new, cfg.vocab_size, compiled=True, repeats=repeats)
                    row.update(hf_compiled_tok_s=statistics.median(c), hf_compiled_runs=c, hf_compile_s=compile_s,
                               speedup_compiled=a / statistics.median(c), hf_compiled_call=hasattr(hf, "_compiled_call"))
                except Exception as e:  # keep the eager row
                    import traceback

                    traceback.print_exc()
                    row["hf_compiled_error"] = repr(e)
            rows.append(row)
            print(rows[-1], flush=True)
        del eng, hf
        gc.collect()
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--skip", default="", help="comma list of sections to skip: roofline, hf")
    ap.add_argument("--hf-modes", default="eager,compiled", help="HF generate modes: eager (dynamic cache), "
                    "compiled (static cache + torch.compile)")
    ap.add_argument("--cases", default="default,llama-3.1-8b", help="models against HF: default, llama-3.1-8b")
    ap.add_argument("--repeats", type=int, default=1, help="timings per rate against HF (median reported)")
    ap.add_argument("--ours-fused", action="store_true", help="also time ours with engine.gpu.fused_decode")
    ap.add_argument("--roofline-graphs", default="on,off", help="roofline rows: CUDA graphs on and/or off")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    args = ap.parse_args()
    rows: list[dict] = [{"bench": "env", **env_info()}]
    bw = copy_bandwidth()
    rows.append({"bench": "copy_bandwidth", "bytes_per_s": bw})
    print(rows, flush=True)
    graph_modes = tuple(m == "on" for m in args.roofline_graphs.split(","))
    sections = {"roofline": lambda: roofline(rows, bw, args.ctx, args.steps, graph_modes),
                "hf": lambda: versus_hf(rows, args.gguf, args.prompt, args.new, tuple(args.hf_modes.split(",")),
                                        tuple(args.cases.split(",")), args.repeats, args.ours_fused)}
    run_sections(sections, args.skip, rows, f"{args.out}/decode{args.tag}.json")


if __name__ == "__main__":
    main()
