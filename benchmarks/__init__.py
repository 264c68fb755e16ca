"""Benchmark runners, one per area (`python -m benchmarks.<area>.run --preset NAME [--json OUT]`).

Not part of the product: nothing under msa_eval/, engine/, kernels/, tasks/, agents/ or tests/
imports it. See benchmarks/README.md."""
