"""The engine's GPU hot path: fused small ops (`ops`), CUDA-graph decode (`graph_runner`) over packed
per-step inputs (`step_buffers`), one-step-late greedy decode (`async_decode`), batched sampling
(`sampler`), MSA decode inside graphs (`msa_graph`) and an opt-in fused norm + matmul layer forward
(`fused_decode`). Every piece runs its torch reference on the CPU, so the CPU engine stays the
correctness baseline."""
