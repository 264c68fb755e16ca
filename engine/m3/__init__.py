"""MiniMax-M3 in the engine: settings (`settings`), checkpoint reading (`checkpoint`, `names`, `fp8`),
the decoder (`model`: Gemma-style norms, partial RoPE, the index branch, MoE)."""
