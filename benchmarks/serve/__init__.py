"""`python -m benchmarks.serve.run --preset NAME` (see run.py)."""
