"""Run `msa-eval sparsify` where the rest of the CLI cannot be imported (the GPU box lacks
pydantic/fastapi): loads `msa_eval/cli/sparsify.py` by path, so the recorded command is the same.

    python benchmarks/msa_quality/sparsify_standalone.py sparsify --model smollm2-135m --out DIR ...
"""
import importlib.util
import sys
from pathlib import Path

import click

root = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sparsify_cli", root / "msa_eval" / "cli" / "sparsify.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
group = click.Group("msa-eval")
mod.register(group)
sys.argv[0] = "msa-eval"
group.main(standalone_mode=True)
