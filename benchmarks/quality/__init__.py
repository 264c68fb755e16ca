"""`python -m benchmarks.quality.run --preset NAME` (see run.py)."""
