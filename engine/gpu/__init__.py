"""The engine's GPU hot path: fused small ops (`ops`), CUDA-graph decode (`graph_runner`) over packed
per-step inputs (`step_buffers`), one-step-late greedy decode (`async_decode`), batched sampling
(`sampler`) and MSA decode inside graphs (`msa_graph`). Every piece runs its torch reference on the
CPU, so the CPU engine stays the correctness baseline."""
