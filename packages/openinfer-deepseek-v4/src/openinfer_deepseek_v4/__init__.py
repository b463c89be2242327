"""openinfer's DeepSeek-V4-Flash model line: config, weights in DeepSeek's and transformers'
names, the whole-sequence reference (`reference.py`) and the engine's forward over the paged
cache (`model.py`, `paged_attention.py`, `kv_cache.py`), registered as the `deepseek-v4` line.
Its own device ops are in `kernels/` (a Triton kernel beside each plain-torch reference)."""
