"""`python -m msa_eval` == `msa-eval`."""
from msa_eval.cli import main

main()
