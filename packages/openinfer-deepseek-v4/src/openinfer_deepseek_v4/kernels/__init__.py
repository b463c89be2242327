"""DeepSeek-V4's own device ops, one folder per op as in openinfer-kernels (`reference.py`,
`triton.py`, `__init__.py` exporting the op that dispatches on its input's device): the
hyper-connections (`mhc/`), the KV compressor (`compress/`), the lightning indexer
(`indexer/`), attention over gathered entries with sinks (`sparse_attention/`), the
interleaved rotary and its RMSNorm (`rotary/`), the MoE with FP4 experts (`moe/`), and the
FP8 / FP4 rounding inside the forward (`quant_sim/`). The ops
that other model lines share (norms, FP8 linears, paged attention, ...) are openinfer-kernels'."""
