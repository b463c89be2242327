"""Engine settings, with vLLM's names and defaults where they exist. Importing this module
imports no torch: the API process builds and checks an `EngineConfig` without it."""

from __future__ import annotations

import ctypes
import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openinfer_core.errors import InvalidParameterError
from openinfer_core.task import TASKS, resolve_task
from openinfer_core.weights.quantization import QUANTIZATION_METHODS

if TYPE_CHECKING:
    import torch

_DTYPES = {  # accepted names -> torch's
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}

LOAD_FORMATS = ("auto", "safetensors", "dummy")
# `--kv-cache-dtype`, vLLM's names: auto is the model's dtype; fp8 and fp8_e4m3 are
# float8_e4m3fn pages with per-tensor or per-head scales. (vLLM's fp8_e5m2 has no kernels here.)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


def kv_cache_dtype_error(value: str) -> str | None:
    """What is wrong with `value` as a `--kv-cache-dtype`, or None."""
    if value in KV_CACHE_DTYPES:
        return None
    accepted = ", ".join(KV_CACHE_DTYPES)
    if value == "fp8_e5m2":
        return (f"fp8_e5m2 is not supported (the attention kernels read e4m3 pages only): use "
                f"fp8 or fp8_e4m3, or auto for the model's dtype (accepted: {accepted})")
    return f"must be one of {accepted}, got {value!r}"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp32 on CPU, the checkpoint's dtype on GPU) | bfloat16 | ...
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from memory
    cpu_kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.90
    scheduler: str = "fcfs"
    attention_backend: str | None = None  # None: the best registered for the device
    seed: int = 0
    enforce_eager: bool = False  # True: no CUDA graphs for decode
    # auto | generate | embed (pooling requests only: openinfer_core.task); auto reads the
    # checkpoint's sentence-transformers modules.json.
    task: str = "auto"
    load_format: str = "auto"  # auto | safetensors | dummy (random weights, real shapes, no files)
    # `--quantization`: quantize an unquantized checkpoint's linears at load (fp8); None: as stored.
    quantization: str | None = None
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8 | fp8_e4m3 (KV_CACHE_DTYPES)
    enable_prefix_caching: bool = True  # reuse cached KV of shared prompt prefixes
    # Overlapped steps: schedule step N+1 while the device runs step N (engine/overlap.py).
    async_scheduling: bool = True
    # KV offload tiers below device memory, first to last (`--kv-offload host,disk`); empty: off.
    kv_offload: tuple[str, ...] = ()
    kv_offload_host_gib: float = 8.0  # pinned host memory, allocated at start
    kv_offload_disk_dir: str | None = None  # the disk tier's directory (kept across restarts)
    kv_offload_disk_gib: float = 64.0  # the disk tier's bound
    # Ranks the model is split over (`--tensor-parallel-size`): one process per GPU (CPU: all
    # on the CPU, gloo), started by the engine (openinfer_core.distributed).
    tensor_parallel_size: int = 1
    # Routed experts split whole over the tensor-parallel ranks (`--enable-expert-parallel`);
    # off: every expert's width is split. Lines with routed experts only; with one rank it
    # changes nothing.
    enable_expert_parallel: bool = False
    # Several nodes (`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`; torchrun's
    # variables give the defaults): tensor_parallel_size / nnodes ranks on each node; node 0
    # runs the engine, the others lend their GPUs (openinfer_core.distributed.nodes).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # Engine replicas behind one API (`--data-parallel-size`), each its own engine process on
    # its own GPU or tensor-parallel group (`replica`); the frontend routes requests between
    # them (openinfer_core.ipc.router). One node only. An engine itself runs one replica.
    data_parallel_size: int = 1
    # Processes of this node that compute beside this engine's ranks and replicas: the API
    # servers (`serve` sets it), and for a replica the other replicas' ranks. On the CPU they
    # all share the cores (openinfer_core.cpu_threads).
    other_processes: int = 0

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_num_batched_tokens", "block_size",
                    "tensor_parallel_size", "nnodes", "data_parallel_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(name, f"must be an integer >= 1, got {value!r}")
        if self.tensor_parallel_size % self.nnodes:
            raise InvalidParameterError(
                "tensor_parallel_size", f"{self.tensor_parallel_size} ranks do not split evenly "
                f"over {self.nnodes} nodes: give every node the same number of GPUs")
        if self.data_parallel_size > 1 and self.nnodes > 1:
            raise InvalidParameterError(
                "data_parallel_size", "replicas run on one node: use --nnodes 1 with "
                f"--data-parallel-size {self.data_parallel_size}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InvalidParameterError(
                "node_rank", f"must be in 0..{self.nnodes - 1} for {self.nnodes} node(s), got "
                f"{self.node_rank}")
        if not 0 < self.master_port < 65536:
            raise InvalidParameterError("master_port",
                                        f"must be a TCP port, got {self.master_port}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidParameterError("max_model_len", f"must be >= 2, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise InvalidParameterError(
                "num_kv_blocks", f"must be >= 2 (block 0 is padding), got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidParameterError(
                "gpu_memory_utilization",
                f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.task not in TASKS:
            raise InvalidParameterError(
                "task", f"must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.load_format not in LOAD_FORMATS:
            raise InvalidParameterError(
                "load_format",
                f"must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise InvalidParameterError(
                "quantization", f"{self.quantization!r} is not implemented (accepted: "
                f"{', '.join(QUANTIZATION_METHODS)}, or None: the checkpoint as stored)")
        kv_error = kv_cache_dtype_error(self.kv_cache_dtype)
        if kv_error is not None:
            raise InvalidParameterError("kv_cache_dtype", kv_error)
        for name in ("kv_offload_host_gib", "kv_offload_disk_gib"):
            if not getattr(self, name) > 0:
                raise InvalidParameterError(name, f"must be > 0, got {getattr(self, name)!r}")
        if len(set(self.kv_offload)) != len(self.kv_offload):
            raise InvalidParameterError(
                "kv_offload", f"names a tier twice: {','.join(self.kv_offload)}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise InvalidParameterError(
                "dtype", f"must be auto or one of {', '.join(sorted(_DTYPES))}, got {self.dtype!r}")

    def torch_kv_cache_dtype(self) -> torch.dtype | None:
        """`LoadOptions.kv_cache_dtype`: None (the model's dtype) for auto, else e4m3."""
        import torch

        return None if self.kv_cache_dtype == "auto" else torch.float8_e4m3fn

    def check_device(self) -> None:
        """`device` names a device this machine has, and enough GPUs follow it for every
        rank of every replica; checked without torch (through the CUDA driver for cuda).
        `torch_device` is what the engine process uses."""
        if self.device == "cpu":
            return
        if self.device == "auto":
            # Asking the driver costs start-up time: only for data-parallel replicas, which
            # take their GPUs from it (`replica`).
            if self.data_parallel_size == 1 or _cuda_device_count() == 0:
                return  # the engine picks its device, or all run on the CPU
        elif not re.fullmatch(r"cuda(:\d+)?", self.device):
            raise InvalidParameterError(
                "device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        index = self._first_gpu()
        count = _cuda_device_count()
        if count == 0:
            raise InvalidParameterError("device", "cuda was asked for but no GPU is visible")
        if index >= count:
            raise InvalidParameterError(
                "device", f"{self.device} was asked for but {count} GPU(s) are visible")
        needed = self.gpus_needed()
        if index + needed <= count:
            return
        local = self.tensor_parallel_size // self.nnodes
        if self.data_parallel_size == 1:
            raise InvalidParameterError(
                "tensor_parallel_size", f"{local} ranks on this node from {self.device} "
                f"need GPUs {index}..{index + local - 1}, but {count} GPU(s) are visible")
        raise InvalidParameterError(
            "data_parallel_size", f"{self.data_parallel_size} replicas of {local} GPU(s) each "
            f"from {self.device} need GPUs {index}..{index + needed - 1}, but {count} GPU(s) "
            "are visible: lower --data-parallel-size or --tensor-parallel-size")

    def gpus_needed(self) -> int:
        """GPUs this node's ranks take: every replica's tensor-parallel ranks."""
        return self.data_parallel_size * (self.tensor_parallel_size // self.nnodes)

    def replica(self, index: int) -> EngineConfig:
        """Data-parallel replica `index`'s engine: devices index * tensor_parallel_size ..
        after the configured first GPU, or the CPU, as one engine (data_parallel_size 1)."""
        if not 0 <= index < self.data_parallel_size:
            raise ValueError(f"replica {index} of {self.data_parallel_size}")
        device = self.device
        if device == "auto":
            device = "cuda" if _cuda_device_count() else "cpu"
        if device != "cpu":
            device = f"cuda:{self._first_gpu() + index * self.tensor_parallel_size}"
        others = self.other_processes + self._ranks_here() * (self.data_parallel_size - 1)
        return dataclasses.replace(self, device=device, data_parallel_size=1,
                                   other_processes=others)

    def serves_embeddings(self) -> bool:
        """Whether the engine serves pooling requests (`task`, or for auto the checkpoint's
        sentence-transformers files) rather than generation."""
        return resolve_task(self.task, self.model) == "embed"

    def cpu_processes(self) -> int:
        """The processes of this node that compute at once: every replica's ranks on this
        node, and the others (`other_processes`)."""
        return self._ranks_here() * self.data_parallel_size + self.other_processes

    def _ranks_here(self) -> int:
        return -(-self.tensor_parallel_size // self.nnodes)

    def _first_gpu(self) -> int:
        return int(self.device.partition(":")[2] or 0)

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.check_device()
        return torch.device(self.device)

    def torch_dtype(self, device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
        import torch

        if self.dtype != "auto":
            return getattr(torch, _DTYPES[self.dtype])
        if device.type == "cpu":
            return torch.float32  # exact tests, and CPUs are slow at bf16 matmuls anyway
        return getattr(torch, _DTYPES.get(str(checkpoint_dtype), "bfloat16"))


def _cuda_device_count() -> int:
    """GPUs the CUDA driver shows this process (CUDA_VISIBLE_DEVICES applies); 0 without a
    driver."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
