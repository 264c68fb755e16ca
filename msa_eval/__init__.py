"""msa-eval: MSA vs dense GQA vs hosted endpoints on long-context work."""

from msa_common import __version__  # noqa: F401 - the one version, read by the CLI
