"""openinfer-qwen35: the Qwen3.5 hybrid model line (Gated DeltaNet + full attention)."""
