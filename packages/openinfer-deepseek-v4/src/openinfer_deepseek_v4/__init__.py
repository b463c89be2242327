"""openinfer's DeepSeek-V4-Flash model line (in progress: its config so far; the reference ops
it needs live in openinfer-kernels, `mhc/` and `moe/`). Not registered as a plugin until it can
load and run a checkpoint."""
