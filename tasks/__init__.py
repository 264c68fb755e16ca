"""tasks package of msa-eval."""
