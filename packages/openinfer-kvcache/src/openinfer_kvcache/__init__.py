"""openinfer-kvcache: paged KV cache buffer, block pool and per-request block tables."""
