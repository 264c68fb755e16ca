"""The MiniMax-M3 slice on one GPU: full width (hidden 6144, 64 q / 4 KV heads, 128 experts), 4 layers
(layer 0 full attention + dense MLP, layers 1-3 MSA + MoE), random bf16 weights allocated on the GPU the
way the checkpoint loader allocates them (`engine.testing.random_model`: no checkpoint file), run by our
engine (`LLMEngine` over the slice, `engine.testing.random_engine`) with `--attention msa` (its own index
branch on layers 1-3) and `dense` (every layer full attention).

Rows: TTFT per context (chunked prefill, `chunk` tokens per step; `repeats` runs, the last reported: a first
run at a new length compiles kernel shapes) with per-layer GPU times (CUDA events around each layer and its
MLP, of the last run); decode step per (context, batch) with the same split (eager: the per-layer
events need eager steps; CUDA graphs when the MoE runs the Triton kernels and `graphs` is on); cache bytes
per token; and the FLOP / byte bounds of the MSA-over-dense ratio (`bounds`): both arms pay the same
projections and MoE, so the whole-layer ratio is bounded by what attention's share can save.
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.engine_gpu.msa import ttft
from benchmarks.engine_gpu.stacks import fake_prefill, free, peak_gib, random_prompt, sync, timed_steps


class LayerTimer:
    """CUDA events around every decoder layer and its MLP (forward hooks; eager forwards only)."""

    def __init__(self, model):
        self.events: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []
        self.handles = []
        for i, layer in enumerate(model.layers):
            for part, mod in (("layer", layer), ("mlp", layer.mlp)):
                self.handles.append(mod.register_forward_pre_hook(self._pre(i, part)))
                self.handles.append(mod.register_forward_hook(self._post()))
        self._open: list = []

    def _pre(self, i: int, part: str):
        def hook(mod, args):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._open.append((i, part, e))
        return hook

    def _post(self):
        def hook(mod, args, out):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            i, part, s = self._open.pop()
            self.events.append((i, part, s, e))
        return hook

    def reset(self) -> None:
        self.events = []

    def totals_ms(self) -> dict[str, float]:
        """{"L0": ms, "L0.mlp": ms, "L0.attn": ms (layer - mlp), ...} summed over the recorded forwards."""
        sync()
        out: dict[str, float] = {}
        for i, part, s, e in self.events:
            key = f"L{i}" if part == "layer" else f"L{i}.mlp"
            out[key] = out.get(key, 0.0) + s.elapsed_time(e)
        for k in [k for k in out if "." not in k]:
            out[f"{k}.attn"] = out[k] - out.get(f"{k}.mlp", 0.0)
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _engine(model, kind: str, kv_tokens: int, max_num_seqs: int, max_batched: int, max_model_len: int,
            graphs: bool, telemetry=None, kv_dtype: torch.dtype | None = None):
    from engine.attention import make_attention
    from engine.testing import random_engine

    cfg = model.cfg
    indexer = model.indexer() if kind == "msa" else None
    attn = make_attention(kind, "cuda", cfg, indexer)
    return random_engine(model, attn, "cuda", kv_tokens, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_batched, max_model_len=max_model_len,
                         cuda_graphs=graphs and model.supports_cuda_graphs,
                         index_dim=indexer.config.d_idx if indexer else 0,
                         index_layers=indexer.layers if indexer else (), telemetry=telemetry, kv_dtype=kv_dtype)


def bounds(cfg, ctx: int, batch: int) -> dict:
    """FLOPs of a prefill to `ctx` and bytes of one decode step at `ctx` x `batch`, per arm, over the slice:
    projections + MLP/MoE (the same in both arms: routed experts active per token, the weights every step
    reads) plus attention (dense: causal over all keys; MSA: top-k blocks of keys, index scores over all)."""
    m3 = cfg.m3
    H, d, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    proj = 2 * H * (hq * d + 2 * hkv * d) + 2 * hq * d * H
    idx = 2 * H * (m3.index_heads + 1) * m3.index_head_dim
    moe_tok = 2 * 3 * H * m3.moe_intermediate_size * m3.experts_per_token + 2 * 3 * H * m3.shared_intermediate_size \
        + 2 * H * m3.num_experts
    dense_tok = 2 * 3 * H * m3.dense_intermediate_size
    keep = m3.index_topk * m3.index_block_size
    dense_keys = ctx * (ctx + 1) / 2  # summed over queries
    msa_keys = sum(min(keep, p + 1) for p in range(0, ctx, 64)) * 64
    fl = {"dense": 0.0, "msa": 0.0}
    layer_bound = 0.0  # one MSA + MoE layer alone
    for i in range(cfg.num_layers):
        common = ctx * (proj + (moe_tok if m3.mlp_layer_types[i] == "sparse" else dense_tok))
        sparse = m3.layer_types[i] == "minimax_m3_sparse"
        dense_l = common + 4 * hq * d * dense_keys
        msa_l = common + (4 * hq * d * msa_keys + ctx * idx + 2 * m3.index_heads * m3.index_head_dim * dense_keys
                          if sparse else 4 * hq * d * dense_keys)
        fl["dense"] += dense_l
        fl["msa"] += msa_l
        if sparse:
            layer_bound = dense_l / msa_l
    # decode bytes: weights read once per step (the experts the batch routes to: all once batch * k >= E),
    # then K/V (+ index keys) per sequence
    experts_read = min(m3.num_experts, batch * m3.experts_per_token)
    w_attn = 2 * (H * (hq * d + 2 * hkv * d) + hq * d * H)
    w_moe = 2 * (3 * H * m3.moe_intermediate_size * experts_read + 3 * H * m3.shared_intermediate_size)
    w_dense = 2 * 3 * H * m3.dense_intermediate_size
    kv_tok = 2 * 2 * hkv * d
    by = {"dense": 0.0, "msa": 0.0}
    layer_byte_bound = attn_byte_bound = 0.0
    for i in range(cfg.num_layers):
        w = w_attn + (w_moe if m3.mlp_layer_types[i] == "sparse" else w_dense)
        sparse = m3.layer_types[i] == "minimax_m3_sparse"
        kv_dense = batch * ctx * kv_tok
        kv_msa = batch * ((min(keep, ctx) * kv_tok + ctx * 2 * m3.index_head_dim) if sparse else ctx * kv_tok)
        by["dense"] += w + kv_dense
        by["msa"] += w + kv_msa
        if sparse:
            layer_byte_bound, attn_byte_bound = (w + kv_dense) / (w + kv_msa), kv_dense / kv_msa
    return {"flop_dense": fl["dense"], "flop_msa": fl["msa"], "flop_bound": fl["dense"] / fl["msa"],
            "flop_bound_msa_layer": layer_bound, "bytes_dense": by["dense"], "bytes_msa": by["msa"],
            "byte_bound": by["dense"] / by["msa"], "byte_bound_msa_layer": layer_byte_bound,
            "byte_bound_attention": attn_byte_bound}


@dataclass(frozen=True)
class M3Slice:
    prefill: tuple[int, ...] = (32768, 131072, 524288, 1048576)
    dense_prefill: tuple[int, ...] = (32768, 131072, 524288)
    decode_contexts: tuple[int, ...] = (32768, 131072)
    batches: tuple[int, ...] = (1, 8, 64)
    layers: int = 4
    experts: int = 128
    chunk: int = 131072
    steps: int = 8
    repeats: int = 2  # TTFT runs per (arm, length), the last one reported: the first compiles new kernel shapes
    graphs: bool = True
    kv_caches: tuple[str, ...] = ("bf16",)  # decode rows per cache: bf16 | fp8 (e4m3 K/V, int8 index keys)
    name = "m3_slice"

    def run(self, opts) -> list[dict]:
        from engine.kv_cache import bytes_per_token
        from engine.m3.testing import full_width_config
        from engine.testing import random_model

        top = max(self.prefill + self.dense_prefill + self.decode_contexts)
        cfg = full_width_config(self.layers, self.experts, max_position=top + 8192)
        free()
        t = time.perf_counter()
        model = random_model(cfg, "cuda")
        sync()
        rows = [{"bench": "m3_build", "layers": self.layers, "experts": self.experts,
                 "params_b": sum(p.numel() for p in model.parameters()) / 1e9, "build_s": time.perf_counter() - t,
                 "weights_gib": torch.cuda.memory_allocated() / 2**30, "moe_impl": model.layers[-1].mlp.impl,
                 "cache_bytes_per_token_msa": bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                              torch.bfloat16, 128, len(cfg.m3.sparse_layers)),
                 "cache_bytes_per_token_dense": bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                                torch.bfloat16)}]
        print(rows[-1], flush=True)
        timer = LayerTimer(model)
        try:
            rows += self._prefill(model, timer)
            rows += self._decode(model, timer)
        finally:
            timer.close()
        return rows

    def _prefill(self, model, timer: LayerTimer) -> list[dict]:
        rows = []
        for kind, lengths in (("msa", self.prefill), ("dense", self.dense_prefill)):
            if not lengths:
                continue
            top = max(lengths)
            eng = _engine(model, kind, top + 8192, 1, self.chunk, top + 4096, graphs=False)
            ttft(eng, 4096, 0)  # warm-up: compiles the kernels
            for n in lengths:
                runs = []
                for r in range(self.repeats):
                    torch.cuda.reset_peak_memory_stats()
                    timer.reset()
                    runs.append(ttft(eng, n, 1 + r))
                t = runs[-1]
                row = {"bench": "m3_prefill", "attention": kind, "ctx": n, "chunk": min(self.chunk, n), "ttft_s": t,
                       "runs_s": runs,
                       "peak_gib": peak_gib(), "layer_ms": timer.totals_ms(), **bounds(model.cfg, n, 1)}
                rows.append(row)
                print({k: v for k, v in row.items() if k != "layer_ms"}, row["layer_ms"], flush=True)
            del eng
            free()
        return rows

    def _decode(self, model, timer: LayerTimer) -> list[dict]:
        rows = []
        for ctx, batch, kv, kind in itertools.product(self.decode_contexts, self.batches, self.kv_caches,
                                                      ("msa", "dense")):
            free()
            eng = _engine(model, kind, batch * (ctx + 2 * self.steps + 256), batch, 8192, ctx + 2 * self.steps + 128,
                          graphs=self.graphs, kv_dtype=torch.float8_e4m3fn if kv == "fp8" else None)
            fake_prefill(eng, batch, ctx, max_tokens=2 * self.steps + 8)
            graphs_on = eng.use_cuda_graphs
            timer.reset()
            t = statistics.median(timed_steps(eng, self.steps))
            layer_ms = {k: v / (self.steps + 2) for k, v in timer.totals_ms().items()} if not graphs_on else {}
            row = {"bench": "m3_decode", "attention": kind, "kv_cache": kv, "ctx": ctx, "batch": batch,
                   "graphs": graphs_on, "step_ms": t * 1e3, "tok_s": batch / t, "cache_gib": eng.cache.bytes() / 2**30,
                   "peak_gib": peak_gib(), "layer_ms": layer_ms, **bounds(model.cfg, ctx, batch)}
            rows.append(row)
            print({k: v for k, v in row.items() if k != "layer_ms"}, layer_ms, flush=True)
            del eng
        return rows


@dataclass(frozen=True)
class M3Telemetry:
    """The selection telemetry (`engine.msa.telemetry`) of the M3 slice at long context: one random-token prompt
    per length, `decode` tokens generated, every MSA layer's selection measured on the last 64 prompt positions
    and every decode token against the oracle (exact fp32 attention mass over the probe rows). Random weights:
    the rows show the telemetry's shape, cost and the keys-read fraction of a real M3 layout at 32K-1M, not how
    well a trained indexer chooses (a random indexer's recall is near chance)."""

    lengths: tuple[int, ...] = (32768, 131072, 524288, 1048576)
    layers: int = 4
    experts: int = 128
    chunk: int = 131072
    decode: int = 4
    name = "m3_telemetry"

    def run(self, opts) -> list[dict]:
        from engine.m3.testing import full_width_config
        from engine.msa.telemetry import TelemetryConfig
        from engine.sampling import SamplingParams
        from engine.testing import random_model

        top = max(self.lengths)
        cfg = full_width_config(self.layers, self.experts, max_position=top + 8192)
        free()
        model = random_model(cfg, "cuda")
        eng = _engine(model, "msa", top + 8192, 1, self.chunk, top + 4096, graphs=False, telemetry=TelemetryConfig())
        rows = []
        for n in self.lengths:
            rid = f"tel{n}"
            eng.add_request(rid, random_prompt(n, cfg.vocab_size, n), SamplingParams(max_tokens=self.decode))
            sync()
            t = time.perf_counter()
            while eng.has_unfinished():
                eng.step()
            sync()
            tel = eng.pop_finished(rid).metrics()["msa_telemetry"]
            rows.append({"bench": "m3_telemetry", "ctx": n, "weights": "random", "wall_s": time.perf_counter() - t,
                         "layers": tel["layers"], "decode_tokens": tel["decode_tokens"], **tel["mean"],
                         "keys_read_by_layer": [sum(g) / len(g) for g in tel["keys_read"]]})
            print(rows[-1], flush=True)
        del eng, model
        free()
        return rows


@dataclass(frozen=True)
class M3VersusHF:
    """TTFT of transformers' own `MiniMaxM3VLForCausalLM` (its Hopper path: sdpa, the sparse layers' selection
    expanded into a dense mask) against our engine (`--attention msa`, the prompt in one chunk) on the same
    full-width slice with `experts` experts per MoE layer (fewer than 128 so that transformers' activations
    fit beside the weights; both arms run the same shapes), random bf16 weights; per length the second of two
    runs is timed (after a 2048-token warm-up); an out-of-memory is a row."""

    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768)
    layers: int = 4
    experts: int = 16
    name = "m3_vs_hf"

    def run(self, opts) -> list[dict]:
        from engine.m3.testing import full_width_config
        from engine.testing import random_model

        cfg = full_width_config(self.layers, self.experts, max_position=max(self.lengths) + 8192)
        rows = []
        free()
        model = random_model(cfg, "cuda")
        eng = _engine(model, "msa", max(self.lengths) + 8192, 1, max(self.lengths), max(self.lengths) + 4096,
                      graphs=False)
        ttft(eng, 2048, 0)
        for n in self.lengths:
            ttft(eng, n, 2)  # a first run at a new length compiles kernel shapes
            torch.cuda.reset_peak_memory_stats()
            rows.append({"bench": "m3_vs_hf", "impl": "ours-msa", "ctx": n, "experts": self.experts,
                         "ttft_s": ttft(eng, n, 1), "peak_gib": peak_gib()})
            print(rows[-1], flush=True)
        del eng, model
        free()
        rows += self._hf(cfg)
        return rows

    def _hf(self, cfg) -> list[dict]:
        import transformers
        from transformers import MiniMaxM3VLForCausalLM, MiniMaxM3VLTextConfig

        m3 = cfg.m3
        hc = MiniMaxM3VLTextConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=m3.moe_intermediate_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, dense_intermediate_size=m3.dense_intermediate_size,
            shared_intermediate_size=m3.shared_intermediate_size, num_local_experts=m3.num_experts,
            num_experts_per_tok=m3.experts_per_token, index_n_heads=m3.index_heads, index_head_dim=m3.index_head_dim,
            index_block_size=m3.index_block_size, index_topk_blocks=m3.index_topk, layer_types=list(m3.layer_types),
            mlp_layer_types=list(m3.mlp_layer_types), max_position_embeddings=cfg.max_position,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": 0.5})
        hc._attn_implementation = "sdpa"
        with torch.device("cuda"):
            model = MiniMaxM3VLForCausalLM(hc).to(torch.bfloat16).eval()
        rows = []

        def forward(model, n: int) -> float:
            ids = torch.tensor([random_prompt(n, cfg.vocab_size, 1)], device="cuda")
            sync()
            t = time.perf_counter()
            with torch.no_grad():
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
            sync()
            return time.perf_counter() - t

        forward(model, 2048)
        for n in self.lengths:
            try:
                forward(model, n)  # as ours: the timed run is the second at its length
            except torch.OutOfMemoryError:
                free()
            torch.cuda.reset_peak_memory_stats()
            row = {"bench": "m3_vs_hf", "impl": f"transformers-{transformers.__version__}-sdpa", "ctx": n,
                   "experts": self.experts}
            try:
                row.update(ttft_s=forward(model, n), peak_gib=peak_gib())
            except torch.OutOfMemoryError:
                row.update(error="out of memory", peak_gib=peak_gib())
                free()
            rows.append(row)
            print(row, flush=True)
        del model
        free()
        return rows
