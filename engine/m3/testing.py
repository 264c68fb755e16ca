"""Tiny random MiniMax-M3 checkpoints for tests: transformers' own `MiniMaxM3SparseForConditionalGeneration`
built from a small config (mixed dense / MoE MLPs, full / sparse attention, a few experts, a tiny vision
tower so the directory has the real checkpoint's layout) and written with `save_pretrained`, plus a
byte-level tokenizer with MiniMax's special tokens and a chat template, so the directory loads like a
real one (`LLM(model=DIR)`, `msa-eval serve --model DIR`). Needs transformers (a dev dependency).
Outputs are meaningless text.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<s>", "</s>", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>",
                  "]~b]", "[e~[")
BOS, EOS = "<s>", "[e~["

# A MiniMax-style chat template: `]~b]role\n...[e~[` turns; tools described in a <tools> block; the
# assistant's tool calls in MiniMax's <minimax:tool_call> form; generation opens an assistant turn.
CHAT_TEMPLATE = """{{- bos_token -}}
{%- if tools -%}
]~b]system
You may call tools. Their schemas:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call them as <minimax:tool_call><invoke name="NAME"><parameter name="ARG">VALUE</parameter></invoke>
</minimax:tool_call>[e~[
{% endif -%}
{%- for m in messages -%}
]~b]{{ m['role'] + '\n' }}
{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}
<minimax:tool_call>
{%- for tc in m['tool_calls'] %}
<invoke name="{{ tc['function']['name'] }}">
{%- set args = tc['function']['arguments'] -%}
{%- if args is mapping %}{% for k, v in args.items() %}
<parameter name="{{ k }}">{{ v if v is string else v | tojson }}</parameter>
{%- endfor %}{% else %}
{{ args }}{% endif %}
</invoke>
{%- endfor %}
</minimax:tool_call>
{%- else -%}
{{ m['content'] if m['content'] is string else '' }}
{%- endif -%}
[e~[
{% endfor -%}
{%- if add_generation_prompt -%}
]~b]assistant
{% endif -%}"""


def text_config(num_layers: int = 4, *, layer_types: list[str] | None = None, mlp_layer_types: list[str] | None = None,
                hidden: int = 64, heads: int = 8, kv_heads: int = 2, head_dim: int = 64, experts: int = 4,
                top_experts: int = 2, topk_blocks: int = 4, block: int = 128, vocab: int = 320,
                max_position: int = 8192, **overrides: Any) -> dict[str, Any]:
    """A small `MiniMaxM3VLTextConfig` dict: layers alternate full / sparse attention (layer 0 full) and the
    first MLP is dense, the rest MoE, unless `layer_types` / `mlp_layer_types` say otherwise."""
    d = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=num_layers,
             num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
             dense_intermediate_size=96, shared_intermediate_size=48, rotary_dim=head_dim // 2,
             num_local_experts=experts, num_experts_per_tok=top_experts, index_n_heads=kv_heads,
             index_head_dim=head_dim, index_block_size=block, index_topk_blocks=topk_blocks,
             layer_types=layer_types or ["full_attention" if i % 2 == 0 else "minimax_m3_sparse"
                                         for i in range(num_layers)],
             mlp_layer_types=mlp_layer_types or ["dense"] + ["sparse"] * (num_layers - 1),
             max_position_embeddings=max_position, bos_token_id=0, eos_token_id=len(SPECIAL_TOKENS) - 1,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    d.update(overrides)
    return d


def build_reference(tc: dict[str, Any], seed: int = 0, bias_scale: float = 0.5):
    """transformers' `MiniMaxM3SparseForConditionalGeneration` (fp32, eval) of text config `tc` with random
    weights: N(0, 0.02) matrices (transformers' init), norm weights N(0, 0.1) around Gemma's zero and a
    random `e_score_correction_bias` (so the router's choose-with-bias / weight-without-bias split matters)."""
    import torch
    from transformers import MiniMaxM3SparseForConditionalGeneration, MiniMaxM3VLConfig

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  patch_size=14, spatial_merge_size=2)
    cfg = MiniMaxM3VLConfig(text_config=tc, vision_config=vision, projector_hidden_size=tc["hidden_size"])
    torch.manual_seed(seed)
    model = MiniMaxM3SparseForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "language_model" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * bias_scale)
    return model


def write_tokenizer(path: Path) -> None:
    """A byte-level tokenizer (256 byte tokens after the special ones), its config and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "chat_template": CHAT_TEMPLATE}, indent=1))


def write_checkpoint(path: Path | str, tc: dict[str, Any] | None = None, seed: int = 0, max_shard_size: str = "200KB"):
    """Save a tiny random M3 (text config `tc`, default `text_config()`) to `path` as transformers writes
    it (sharded safetensors + `model.safetensors.index.json`), with the tokenizer; returns the reference
    model (fp32, eval) for comparisons."""
    path = Path(path)
    tc = tc or text_config()
    if tc["vocab_size"] < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {tc['vocab_size']} < {len(SPECIAL_TOKENS) + 256}: the tokenizer needs them")
    model = build_reference(tc, seed)
    model.save_pretrained(str(path), max_shard_size=max_shard_size)
    write_tokenizer(path)
    return model


def full_width_config(num_layers: int = 4, experts: int = 128, max_position: int = 1 << 20):
    """The MiniMax-M3 text model's shapes (hidden 6144, 64 q / 4 KV heads of 128, rotary 64, 128 experts of
    3072, shared 3072, dense MLP 12288, 4 index heads x 128, block 128, top-16, vocab 200064) cut to
    `num_layers`: layer 0 full attention with the dense MLP, the rest sparse attention with MoE (the layout
    of M3's first layers after its dense ones). An `engine.config.ModelConfig`."""
    from engine.config import from_hf_config

    types = ["full_attention"] + ["minimax_m3_sparse"] * (num_layers - 1)
    return from_hf_config({
        "model_type": "minimax_m3_vl_text", "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072,
        "num_hidden_layers": num_layers, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "dense_intermediate_size": 12288, "shared_intermediate_size": 3072, "num_local_experts": experts,
        "num_experts_per_tok": 4, "index_n_heads": 4, "index_head_dim": 128, "index_block_size": 128,
        "index_topk_blocks": 16, "layer_types": types, "mlp_layer_types": ["dense"] + ["sparse"] * (num_layers - 1),
        "max_position_embeddings": max_position, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5}})

