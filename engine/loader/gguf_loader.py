"""Load a GGUF checkpoint: config from metadata, weights dequantized with the `gguf`
package (F32/F16/BF16/Q4_0/Q4_1/Q5_x/Q8_0/K-quants), tokenizer rebuilt from its fields.

llama.cpp stores Llama-arch Q and K projections with rows permuted for its interleaved
RoPE; they are permuted back here so the model uses the HF rotate-half convention.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.config import ModelConfig, RopeScaling
from engine.errors import ModelIntegrityError, UnsupportedModelError
from engine.tokenizer import Tokenizer
from msa_common.atomic import atomic_path

_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freq_factors",
}


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _reader(path: Path):
    import gguf

    class Reader(gguf.GGUFReader):
        # the reader slices its np.memmap twice per string (the default model has 98K tokenizer
        # strings) and each memmap slice runs numpy.memmap.__array_finalize__ in Python: over a plain
        # ndarray view of the same mapping the default model's header parses about 4x faster
        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = value.view(np.ndarray)

    try:
        return Reader(str(path))
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError/struct errors/memmap errors on damage
        raise ModelIntegrityError(
            f"{path} is not a readable GGUF file ({type(e).__name__}: {str(e)[:120]}): "
            "it is truncated or corrupt; download it again") from None


def gguf_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3", "mistral"):
        raise UnsupportedModelError(
            f"GGUF architecture '{arch}' is not supported: msa-eval runs llama, mistral, qwen2 and "
            "qwen3 GGUF files")
    g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731 - a one-line local helper
    hidden = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    kv = g("attention.head_count_kv", heads)
    head_dim = int(g("attention.key_length", hidden // heads))
    max_pos = int(g("context_length", 4096))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(g("vocab_size", len(tokens) if tokens is not None else 0))
    scaling = RopeScaling()
    stype = g("rope.scaling.type")
    if stype in ("linear", "yarn"):
        scaling = RopeScaling(kind=stype, factor=float(g("rope.scaling.factor", 1.0)),
                              original_max_position=int(g("rope.scaling.original_context_length", max_pos)))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(int(x) for x in (eos, eot) if x is not None)
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        arch=arch, vocab_size=vocab, hidden_size=hidden, num_layers=int(g("block_count")),
        num_heads=heads, num_kv_heads=int(kv), head_dim=head_dim,
        intermediate_size=int(g("feed_forward_length")), max_position=max_pos,
        rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)), rope_scaling=scaling,
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names, qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"), eos_token_ids=eos_ids,
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"),
    or None for tensors the engine does not load."""
    if gguf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[gguf_name]
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        if rest in _LAYER_MAP:
            return f"model.layers.{idx}.{_LAYER_MAP[rest]}"
    return None


def permuted_heads(gguf_name: str, cfg: ModelConfig) -> int | None:
    """Head count to undo llama.cpp's interleaved-RoPE row permutation with (`_unpermute`) for a
    Llama/Mistral Q or K weight; None for every other tensor."""
    if cfg.arch in ("llama", "mistral") and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        return cfg.num_heads if "attn_q" in gguf_name else cfg.num_kv_heads
    return None


def gguf_weights(reader, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            continue
        shape = tuple(int(x) for x in reversed(t.shape))
        try:
            if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                arr = np.asarray(t.data, dtype=np.float32)
            else:
                arr = dequantize(t.data, t.tensor_type)
            arr = arr.reshape(shape)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"GGUF tensor type {t.tensor_type.name} of {t.name} cannot be dequantized by the gguf "
                "package: convert the model to Q8_0/Q4_K/F16 or use its HF directory") from None
        heads = permuted_heads(t.name, cfg)
        if heads:
            arr = _unpermute(arr, heads)
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))
    return out


def gguf_tokenizer(reader, cfg: ModelConfig) -> Tokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model '{kind}' is not supported (only byte-level BPE 'gpt2'): pass the "
            "model's HF directory instead of the .gguf")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                 fuse_unk=False, byte_fallback=False))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    elif pre in ("default", "gpt-2", "gpt2"):
        tok.pre_tokenizer = bl
    elif pre in ("llama-bpe", "llama3", "qwen2", "deepseek-llm"):
        pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
        if pre == "qwen2":
            pat = pat.replace(r"\p{N}{1,3}", r"\p{N}")
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer '{pre}' is not known: pass the model's HF directory instead")
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types, strict=True) if ty in (3, 4)]
    tok.add_special_tokens(special)
    bos_id, eos_id = _field(reader, "tokenizer.ggml.bos_token_id"), _field(reader, "tokenizer.ggml.eos_token_id")
    return Tokenizer(
        tok, chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else None,
        eos_token=tokens[eos_id] if eos_id is not None else None,
        eos_token_ids=set(cfg.eos_token_ids), add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)))


def load_gguf(path: Path, cache_dir: Path | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Config, float32 weights and tokenizer. With `cache_dir`, the dequantized weights are
    kept there as safetensors (written atomically) and memory-mapped on later loads."""
    from safetensors.torch import load_file, save_file

    reader = _reader(path)
    cfg = gguf_config(reader)
    tok = gguf_tokenizer(reader, cfg)
    cached = cache_dir / "weights.safetensors" if cache_dir else None
    if cached is not None and cached.is_file():
        try:
            return cfg, load_file(str(cached)), tok
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt, never trusted
            cached.unlink(missing_ok=True)
    weights = gguf_weights(reader, cfg)
    if cached is not None:
        try:
            with atomic_path(cached) as tmp:
                save_file(weights, str(tmp))
        except OSError:  # a read-only or full cache only costs speed
            pass
    return cfg, weights, tok
