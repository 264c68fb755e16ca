"""`LLM`: the offline API. Load a model (built-in name, HF directory or .gguf), pick the
attention (`engine.attention.AttentionKind`: `dense`, `msa`, `msa-ref`) and, on a CPU, the weight
mode (`weights`: "fp32" exact, the default; "bf16"; "q4" = the GGUF's 4-bit codes;
`engine.cpu_weights`). `generate` for prompts, chats or token ids; `stream` + `finish` for one
request step by step; `prompt_logprobs` scores token ids (a score-only engine request).
A request the engine ended with an error raises that error from `generate` / `finish` (the other
requests of a `generate` call are aborted: the offline caller owns them all).
`msa_telemetry=True` (or an `engine.msa.telemetry.TelemetryConfig`) records what MSA's indexer chose per
request in `metrics["msa_telemetry"]` (decode then runs eagerly: a quality run, not a speed run).
`kv_cache_dtype`: "auto" (the model dtype; bf16 K/V for the CPU reduced-precision weight modes), "bf16", or
"fp8" (e4m3 K/V with a fp32 scale per token and KV head, `engine.kv_fp8`; on a GPU it needs compute capability
>= 8.9); `kv_dtype_name` says what the cache holds.
`tensor_parallel_size=N` runs the model over N processes this one launches (`engine.parallel`: KV heads,
MLP rows and M3's experts split; CUDA graphs off); `close()` stops them.
Settings come in as arguments: the CLI and the server config read the environment, never this class."""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Any

import torch

from engine.attention import AttentionKind, check_kind, make_attention, uses_indexer
from engine.cpu_weights import WEIGHT_MODES, attach_cpu_weights
from engine.errors import EngineError
from engine.kv_cache import CacheConfig, KVCache, bytes_per_token, index_key_dtype, tokens_for_free_memory
from engine.kv_fp8 import KV_CACHE_DTYPES, check_rotation, kv_dtype_name, resolve_kv_dtype, rotates_k
from engine.llm_engine import LLMEngine
from engine.loader import load, model_family
from engine.model import CausalLM
from engine.msa.telemetry import TelemetryConfig
from engine.requests import Request, RequestOutput, StepOutput
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.scoring import LogprobRow

DEFAULT_PAGE_SIZE = 128


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _telemetry(asked: bool | TelemetryConfig, attention: AttentionKind, tensor_parallel_size: int
               ) -> TelemetryConfig | None:
    """The selection telemetry config (`engine.msa.telemetry`) of `msa_telemetry`, or None when it is off."""
    if not asked:
        return None
    if not uses_indexer(attention):
        raise EngineError("msa_telemetry measures MSA's block selection: use attention msa, msa-ref or msa-oracle "
                          "(or leave msa_telemetry off)")
    if tensor_parallel_size != 1:
        raise EngineError("msa_telemetry runs in one process: leave tensor_parallel_size at 1 (or turn it off)")
    return asked if isinstance(asked, TelemetryConfig) else TelemetryConfig()


class LLM:
    def __init__(self, model: str = "smollm2-135m", attention: AttentionKind = "dense", device: str | None = None,
                 dtype: torch.dtype | str | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 16, max_num_batched_tokens: int = 2048, kv_cache_tokens: int | None = None,
                 page_size: int | None = None, progress: bool = True, msa_overrides: dict | None = None,
                 cuda_graphs: bool = True, gpu_memory_fraction: float = 0.9, weights: str | None = None,
                 dequant_cache: bool = True, tensor_parallel_size: int = 1,
                 msa_telemetry: bool | TelemetryConfig = False, kv_cache_dtype: str = "auto"):
        self.attention_kind = attention = check_kind(attention)
        if kv_cache_dtype not in KV_CACHE_DTYPES:  # fail before loading anything
            raise EngineError(f"unknown kv_cache_dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
        self.kv_cache_dtype = kv_cache_dtype
        if weights is not None and weights not in WEIGHT_MODES:  # fail before loading anything
            raise EngineError(f"unknown weights mode {weights!r}: use one of {', '.join(WEIGHT_MODES)}")
        self.telemetry = _telemetry(msa_telemetry, attention, tensor_parallel_size)
        self.device = torch.device(device) if device else default_device()
        if isinstance(dtype, str):
            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        try:  # an unknown choice, or FP8 on a GPU without FP8 tensor cores: one line before anything loads
            resolve_kv_dtype(kv_cache_dtype, self.device, self.dtype)
        except ValueError as e:
            raise EngineError(str(e)) from None
        self.parallel = None
        if tensor_parallel_size != 1:  # engine.parallel: this process is rank 0 (or a worker rank 0 launched)
            settings = dict(locals())  # the arguments (as checked so far): every rank builds the same LLM
            from engine.parallel import join

            self.parallel = join(tensor_parallel_size, self.device, settings)
            self.device = self.parallel.device
        from engine.msa.setup import split_model_adapter

        model, self.msa_adapter_path = split_model_adapter(model)  # `BASE+ADAPTER_DIR` for MSA
        if model_family(model) == "minimax_m3":
            self._init_m3(model, attention, max_model_len, max_num_seqs, max_num_batched_tokens, kv_cache_tokens,
                          page_size, msa_overrides or {}, cuda_graphs, gpu_memory_fraction, weights)
            return
        loaded = load(model, progress=progress, dequant_cache=dequant_cache)
        self.model_id, self.model_path, self.config = loaded.model_id, loaded.path, loaded.config
        self.model_sha256 = loaded.sha256
        self.tokenizer = loaded.tokenizer
        self.max_model_len = min(max_model_len or self.config.max_position, self.config.max_position)
        if self.parallel is None:
            self.model = CausalLM(self.config)
            self.model.load_weights(loaded.weights)
        else:  # this rank's shard
            self.model = self.parallel.llama(self.config, loaded.weights)
        self.model.to(device=self.device, dtype=self.dtype)
        self.model.setup_rope(self.device)
        self.weights, self.weight_counts = self._attach_weights(weights, loaded)
        self.msa = self.msa_adapter = indexer = None
        overrides = msa_overrides or {}
        if uses_indexer(attention):
            from engine.msa.setup import load_indexer

            indexer, self.msa_adapter = load_indexer(self.model_id, self.msa_adapter_path, self.config,
                                                     loaded.weights, self.device, self.dtype, page_size, overrides)
            self.msa = indexer.config
            if self.parallel is not None:
                indexer = self.parallel.indexer(indexer, self.config)
        del loaded
        self._finish_init(indexer, overrides, page_size, kv_cache_tokens, gpu_memory_fraction, max_num_seqs,
                          max_num_batched_tokens, cuda_graphs)

    def _init_m3(self, path: str, attention: AttentionKind, max_model_len, max_num_seqs, max_num_batched_tokens,
                 kv_cache_tokens, page_size, overrides: dict, cuda_graphs, gpu_memory_fraction, weights) -> None:
        """MiniMax-M3 (`engine.m3`): built on the device from its checkpoint; `msa` runs its own index branch,
        `dense` every layer as full attention (out of distribution for M3)."""
        from engine.loader import load_tokenizer
        from engine.m3.load import build_m3

        if weights not in (None, "fp32"):
            raise EngineError(f"weights={weights!r} is a Llama-family CPU mode: MiniMax-M3 runs its checkpoint's "
                              "weights in the given dtype (leave weights unset)")
        unknown = set(overrides) - {"topk", "track_recall"}
        if unknown:
            raise EngineError(f"msa_overrides {sorted(unknown)} do not apply to MiniMax-M3: use topk or track_recall")
        if self.msa_adapter_path:
            raise EngineError("MiniMax-M3 brings its own index branch: drop the +ADAPTER part of --model")
        tok = load_tokenizer(path)
        self.model_id, self.model_path, self.config, self.tokenizer = tok.model_id, tok.path, tok.config, tok.tokenizer
        self.model_sha256 = None
        self.max_model_len = min(max_model_len or self.config.max_position, self.config.max_position)
        if self.parallel is None:
            self.model = build_m3(self.model_path, self.config, self.device, self.dtype)
        else:  # this rank's shard
            self.model = self.parallel.m3(self.model_path, self.config, self.device, self.dtype)
        self.weights, self.weight_counts = "fp32", {}
        self.msa = self.msa_adapter = indexer = None
        if uses_indexer(attention):
            indexer = self.model.indexer(topk=overrides.get("topk"))
            self.msa = indexer.config
            if page_size is not None and page_size != indexer.config.block_size:
                raise EngineError(f"MSA block size {indexer.config.block_size} must equal the KV cache page size "
                                  f"{page_size}: pass page_size={indexer.config.block_size} (or leave it unset)")
        self._finish_init(indexer, overrides, page_size, kv_cache_tokens, gpu_memory_fraction, max_num_seqs,
                          max_num_batched_tokens, cuda_graphs and self.model.supports_cuda_graphs)

    def _finish_init(self, indexer, overrides: dict, page_size, kv_cache_tokens, gpu_memory_fraction, max_num_seqs,
                     max_num_batched_tokens, cuda_graphs) -> None:
        """The attention, the paged cache and the engine (both families)."""
        attention = self.attention_kind
        attn = make_attention(attention, self.device, self.config, indexer,
                              track_recall=bool(overrides.get("track_recall", False)))
        index_layers, index_dim = (indexer.layers, indexer.config.d_idx) if indexer else ((), 0)
        B = indexer.config.block_size if indexer else page_size or DEFAULT_PAGE_SIZE
        # the K/V storage dtype: "auto" = the model dtype, except that the CPU reduced-precision weight modes keep
        # dense K/V in bf16 (half the bytes every decode step reads); "bf16"; "fp8" (e4m3 + fp32 scales)
        auto = torch.bfloat16 if self.weights != "fp32" and not uses_indexer(attention) else self.dtype
        try:
            self.kv_dtype = resolve_kv_dtype(self.kv_cache_dtype, self.device, auto)
            check_rotation(self.kv_cache_dtype, self.config.head_dim)
        except ValueError as e:
            raise EngineError(str(e)) from None
        fp8 = self.kv_dtype == torch.float8_e4m3fn
        model_dtype = self.dtype if fp8 else None  # FP8: q stays in the model dtype, the index keys go int8
        self.kv_dtype_name = kv_dtype_name(self.kv_dtype, rotates_k(self.kv_cache_dtype))
        tokens = kv_cache_tokens
        if not tokens and self.device.type == "cuda":  # size the paged cache from free GPU memory
            per_token = bytes_per_token(self.config.num_layers, self.model.cfg.num_kv_heads, self.config.head_dim,
                                        self.kv_dtype, index_dim, len(index_layers),
                                        index_key_dtype(self.kv_dtype, model_dtype))
            tokens = tokens_for_free_memory(per_token, self.device, gpu_memory_fraction)
            if tokens < self.max_model_len:
                raise EngineError(f"free GPU memory holds a KV cache of {tokens} tokens, less than the context "
                                  f"{self.max_model_len}: lower max_model_len or free GPU memory")
        tokens = tokens or max(2 * self.max_model_len, 32768)
        cache_cfg = CacheConfig(page_size=B, num_pages=-(-tokens // B), dtype=self.kv_dtype,
                                model_dtype=model_dtype, rotate_k=rotates_k(self.kv_cache_dtype))
        self.cache = KVCache(self.config.num_layers, self.model.cfg.num_kv_heads, self.config.head_dim, cache_cfg,
                             self.device, index_dim=index_dim, index_layers=index_layers)
        self.engine = LLMEngine(self.model, self.tokenizer, attn, self.cache,
                                SchedulerConfig(max_num_seqs, max_num_batched_tokens), self.max_model_len, self.device,
                                cuda_graphs=cuda_graphs and self.parallel is None,  # eager under TP
                                telemetry=self.telemetry)
        self._ids = itertools.count()
        if self.parallel is not None:
            self.parallel.start(self)  # rank 0 launches the other ranks now (their cache: this one's pages)

    def _attach_weights(self, weights: str | None, loaded) -> tuple[str, dict[str, int]]:
        """CPU weight mode (`engine.cpu_weights`): `weights`, else "fp32"."""
        mode = weights or "fp32"
        if mode == "fp32":  # the model's own weights, untouched (exact; GPUs always)
            return mode, {}
        if self.device.type != "cpu":
            raise EngineError(f"weights={mode!r} is a CPU serving mode: on a GPU leave weights unset and pick dtype")
        if self.dtype != torch.float32:
            raise EngineError(f"weights={mode!r} needs dtype float32 (the CPU default), got {self.dtype}")
        q4 = None
        if mode == "q4" and loaded.path.suffix == ".gguf":
            from engine.loader.gguf_q4 import read_q4_blocks

            q4 = read_q4_blocks(loaded.path, self.config)
        return mode, attach_cpu_weights(self.model, mode, q4)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (done too when the LLM is collected or the process exits)."""
        if self.parallel is not None:
            self.parallel.close()

    # -- generation -----------------------------------------------------------------------
    def _to_ids(self, p: Any) -> list[int]:
        if isinstance(p, str):
            return self.tokenizer.encode(p, add_special_tokens=True)
        if isinstance(p, list) and p and isinstance(p[0], dict):
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(p), add_special_tokens=False)
        if isinstance(p, list) and all(isinstance(t, int) for t in p):
            return list(p)
        raise ValueError("a prompt must be a string, a chat (list of {'role','content'} dicts) or token ids")

    def _request(self, prompt: Any, params: SamplingParams) -> Request:
        return Request(f"gen-{next(self._ids)}", self._to_ids(prompt), params)

    def stream(self, prompt: Any, params: SamplingParams | None = None) -> Iterator[StepOutput]:
        """One request (text, chat or token ids), step by step: its outputs as the engine makes them; the
        last is finished (then `finish(out.request_id)`). Stopping early aborts the request."""
        return self.engine.stream([self._request(prompt, params or SamplingParams())])

    def finish(self, request_id: str) -> RequestOutput:
        """A finished request's result (text cut before a stop string, metrics); raises its error."""
        return self.engine.finish(request_id)

    def generate(self, prompts: Any, params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], (dict, int))):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        requests = [self._request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), desc="generate", unit="req")
        try:
            with contextlib.closing(self.engine.stream(requests)) as outs:  # closing aborts the unfinished
                for out in outs:
                    if out.error is not None:
                        self.finish(out.request_id)  # raises the request's error
                    if out.finished and bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [self.finish(r.request_id) for r in requests]

    def prompt_logprobs(self, token_ids: list[int], top_n: int = 0) -> list[LogprobRow]:
        """log p(t_i | t_<i) for every token (None for the first) and the top_n alternatives: one score-only
        engine request (max_tokens 0), prefilled in chunks like any other (`engine.scoring`)."""
        out = self.generate(list(token_ids), SamplingParams(max_tokens=0, prompt_logprobs=top_n))[0]
        return out.prompt_logprobs
