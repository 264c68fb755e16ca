"""agents package of msa-eval."""
