"""`python -m benchmarks.agents.run --preset NAME` (see run.py)."""
