"""`--load-format dummy` for DeepSeek-V4: random tensors at DeepSeek's names and shapes, made on
the device. With `formats`, in the checkpoint's own formats (spec §10.1): the FP8 linears as
e4m3 codes with E8M0 block scales, the routed experts as packed e2m1 codes with per-32 scales,
so that V4-Flash's memory and kernels are what a real checkpoint gives. Values depend only on
the name (and the seed), like `RandomCheckpoint`'s."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator, Mapping

import torch

from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.deepseek_names import deepseek_shapes, keeps_fp32

# Which weights DeepSeek ships in FP8 (the rest of the matrices are bf16) and in FP4.
_FP8 = re.compile(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)\.weight$"
                  r"|\.shared_experts\.w[123]\.weight$")
_FP4 = re.compile(r"\.experts\.\d+\.w[123]\.weight$")
_E2M1_STD = math.sqrt(sum(v * v for v in (0, .5, 1, 1.5, 2, 3, 4, 6)) / 8)  # uniform codes


class DummyTensors(Mapping[str, torch.Tensor]):
    """Random tensors (`RandomCheckpoint`) for every name DeepSeek-V4 reads; the hash layers'
    token -> experts tables spread the tokens over the experts."""

    def __init__(self, ckpt: RandomCheckpoint, cfg: DeepseekV4Config, dtype: torch.dtype,
                 device: torch.device, *, formats: bool = False) -> None:
        self._ckpt, self._cfg, self._dtype, self._device = ckpt, cfg, dtype, device
        self._shapes = deepseek_shapes(cfg)
        self._names = list(self._shapes)
        if formats:
            self._names += [n.removesuffix(".weight") + ".scale" for n in self._shapes
                            if _FP8.search(n) or _FP4.search(n)]
        self._formats = formats

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._formats and name.endswith(".scale"):
            return self._scale(name.removesuffix(".scale") + ".weight")
        shape = self._shapes[name]
        if name.endswith("tid2eid"):
            cfg = self._cfg
            tokens = torch.arange(cfg.vocab_size, device=self._device)[:, None]
            spread = torch.arange(cfg.top_k, device=self._device) * (cfg.num_experts // cfg.top_k)
            return (tokens + spread) % cfg.num_experts
        if self._formats and _FP8.search(name):
            # N(0, std / 2^e) in e4m3 (its normal range covers it) times 2^e: N(0, std)
            values = self._ckpt.get(name, shape=shape, dtype=torch.float32, device=self._device)
            return (values * 2.0 ** -self._exponent(name)).to(torch.float8_e4m3fn)
        if self._formats and _FP4.search(name):
            gen = torch.Generator(device=self._device)
            gen.manual_seed(zlib.crc32(name.encode()) ^ self._ckpt.seed)
            return torch.randint(-128, 128, (shape[0], shape[1] // 2), generator=gen,
                                 dtype=torch.int8, device=self._device)
        dtype = torch.float32 if keeps_fp32(name) else self._dtype
        return self._ckpt.get(name, shape=shape, dtype=dtype, device=self._device)

    def _exponent(self, weight: str) -> int:
        """The power of two of every scale of `weight`: its values' std is the checkpoint's."""
        spread = 1.0 if _FP8.search(weight) else _E2M1_STD
        return math.floor(math.log2(self._ckpt.std / spread))

    def _scale(self, weight: str) -> torch.Tensor:
        return torch.full(self.shape(weight.removesuffix(".weight") + ".scale"),
                          127 + self._exponent(weight), dtype=torch.uint8, device=self._device)

    def shape(self, name: str) -> tuple[int, ...]:
        """As stored: FP4 codes two per byte, scales per block (no tensor made)."""
        if self._formats and name.endswith(".scale"):
            rows, cols = self._shapes[name.removesuffix(".scale") + ".weight"]
            fp8 = _FP8.search(name.removesuffix(".scale") + ".weight")
            return (-(-rows // 128), -(-cols // 128)) if fp8 else (rows, cols // 32)
        shape = self._shapes[name]
        return (shape[0], shape[1] // 2) if self._formats and _FP4.search(name) else shape

    def __contains__(self, name: object) -> bool:
        return name in self._shapes or (self._formats and name in self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
