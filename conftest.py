"""Set up before any test directory is collected (pytest loads this file first)."""

from __future__ import annotations

import os

import torch

from openinfer_core.cpu_threads import explicit_threads, threads_per_process

if not torch.cuda.is_available():
    # Without a GPU, the kernel tests run the Triton kernels on CPU tensors under the Triton
    # interpreter. Triton reads this switch when it is imported (each @triton.jit, its own
    # library's included, picks interpreter or compiler then), and collecting the root tests
    # already imports the kernel modules: so it is set here, not in the kernels' own conftest.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The engine's rule for CPU threads (openinfer_core.cpu_threads), applied to the tests: a test
# process and the server or engine process it starts compute at once, so each takes half the
# cores (one each on 2 cores) unless OMP_NUM_THREADS says otherwise. Set in the environment,
# the processes the tests spawn take the same count.
os.environ["OMP_NUM_THREADS"] = str(explicit_threads() or threads_per_process(2))
torch.set_num_threads(threads_per_process(2))

