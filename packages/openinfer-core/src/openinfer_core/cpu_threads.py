"""How many intra-op threads torch runs in a process that computes on the CPU.

torch starts as many threads as the machine has cores in every process. When several processes
compute at once (the engine, its tensor-parallel ranks, data-parallel replicas, the API
servers that tokenize and stream), each of them spinning up a thread per core makes them
preempt one another: on a loaded 2-core machine the demo decoded at ~4 tokens/s with torch's
default and ~24 tokens/s with one thread per process. So the cores this process may run on are
shared out among the processes that compute; an explicit OMP_NUM_THREADS wins."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("openinfer")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and `taskset`
    narrow), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def explicit_threads() -> int | None:
    """OMP_NUM_THREADS when it is set to a positive integer, else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def threads_per_process(processes: int) -> int:
    """Intra-op threads for each of `processes` processes computing at once."""
    return explicit_threads() or max(1, usable_cores() // max(1, processes))


def share_cores(processes: int) -> int:
    """Set this process's torch intra-op threads to its share; returns the count."""
    import torch

    threads = threads_per_process(processes)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    log.info("CPU: %d intra-op thread(s) per process (%s)", threads,
             "OMP_NUM_THREADS" if explicit_threads() else
             f"{usable_cores()} cores shared by {processes} processes")
    return threads
