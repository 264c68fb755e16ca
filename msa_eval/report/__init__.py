"""Side-by-side reports over one or more run directories: tables (Markdown, CSV, JSON),
paired bootstrap deltas MSA - dense, efficiency columns and PNG plots."""
from msa_eval.report.build import Report, build_report
from msa_eval.report.load import load_runs

__all__ = ["Report", "build_report", "load_runs"]
