"""kernels package of msa-eval."""
