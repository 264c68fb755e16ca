"""MSA sparse prefill attention over the paged KV cache (see README.md)."""
