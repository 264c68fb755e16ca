"""`python -m msa_eval.cli` == `msa-eval`."""
from msa_eval.cli import main

main()
