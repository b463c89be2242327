"""The rounding DeepSeek-V4 applies inside its own forward, as its official inference code does
(spec: shared deepseek-v4.md §10.3, §5.5, §5.6): the model was trained with it, so it is part
of the model's math.

- FP8: each raw entry's and each main compressed entry's non-rotary dims, per block of 64
  values with a power-of-two scale (`ue8m0`), rounded to e4m3 and back.
- FP4: the indexer's queries and compressed keys, first rotated by a normalized
  Walsh-Hadamard transform, then per block of 32 values with a power-of-two scale, rounded to
  e2m1 and back.

Whether a model applies it (`DeepseekV4Config.quant_sim`): `OPENINFER_DSV4_QUANT_SIM=on|off`,
or `auto` (the default), on for checkpoints in DeepSeek's quantized release format (a
`quantization_config` in config.json), off for plain bf16 ones (transformers' DeepSeek-V4,
which leaves it out, writes those). The values stay in the model's dtype: this is rounding,
not storage in FP8. The ops are in `kernels/quant_sim/`."""

from __future__ import annotations

import os
from typing import Any

QUANT_SIM_ENV = "OPENINFER_DSV4_QUANT_SIM"  # auto (default) | on | off


def quant_sim_for(config: dict[str, Any]) -> bool:
    """Whether a model of this config.json applies the rounding (`QUANT_SIM_ENV`)."""
    mode = os.environ.get(QUANT_SIM_ENV, "auto")
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"{QUANT_SIM_ENV}={mode!r}: use auto, on or off")
    return mode == "on" or (mode == "auto" and "quantization_config" in config)
