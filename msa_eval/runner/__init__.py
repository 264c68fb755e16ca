"""The runner: expands a suite x lengths x backends into samples, generates through the
`Backend` interface, scores, and writes one JSONL record per sample with a manifest.
Resumable at sample granularity (see `store.py`)."""
from msa_eval.runner.config import BackendSpec, RunConfig, SuiteConfig, TaskEntry
from msa_eval.runner.run import RunResult, run_suite

__all__ = ["BackendSpec", "RunConfig", "RunResult", "SuiteConfig", "TaskEntry", "run_suite"]
