"""`python -m benchmarks.cpu_engine.run --preset NAME` (see run.py)."""
