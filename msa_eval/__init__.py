"""msa-eval: MSA vs dense GQA vs hosted endpoints on long-context work."""

__version__ = "0.1.0"
