"""openinfer-qwen3: the Qwen3 dense model line."""
