"""`python -m benchmarks.engine_gpu.run --preset NAME` (see run.py)."""
