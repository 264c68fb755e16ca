"""Tensor / expert parallelism: one model over N processes that msa-eval launches itself
(`LLM(..., tensor_parallel_size=N)`, `--tensor-parallel-size N`), NCCL on GPUs (rank r on cuda:r), gloo
on CPUs.

Rank 0 is the caller's process and owns everything it owns with one process (scheduler, block tables,
sampler, server); ranks 1..N-1 run the model forward only, on their shards, in lockstep: per forward rank
0 sends the token ids, positions and attention metadata, every rank runs `hidden_states` on its shard
and the layers all-reduce their partial outputs; logits are computed on rank 0 only. Every rank has its
own KV cache of its local KV heads (same pages) and its own attention object for its local head counts;
MSA's selection is per KV group, so it stays rank-local.

- `sharding`: how each family's weights split (the one place that decides it).
- `model`: a rank's shard (both families) and `ParallelModel`, what the engine drives.
- `step`, `collectives`: the per-forward message and the process group / all-reduce.
- `launch`: `join` (the LLM constructor's call), starting and stopping the ranks; `worker`: a rank > 0.

Under tensor parallelism CUDA graphs are off (eager decode steps), the CPU weight modes (bf16, q4) are
single-process only, and `track_recall` measures rank 0's heads only.
"""
from engine.parallel.launch import ParallelError, TensorParallel, join

__all__ = ["ParallelError", "TensorParallel", "join"]
