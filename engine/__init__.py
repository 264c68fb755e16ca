"""engine package of msa-eval."""
