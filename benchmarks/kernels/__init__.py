"""Kernel benchmarks: `python -m benchmarks.kernels.run --op OP --preset NAME` (see run.py)."""
