"""MSA indexer: token score, block max-pool and top-k block selection (see README.md)."""
