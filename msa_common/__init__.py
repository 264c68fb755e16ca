"""The bottom package of msa-eval: what every other package may import (the base error, the
atomic file writes, the version). It imports nothing of the project."""

__version__ = "0.1.0"
