"""`openinfer serve --node-rank N` (N > 0): a node that lends its GPUs to rank 0's engine and
serves nothing itself (`nodes.py` says how the nodes meet).

    connect to the store; read rank 0's WorkerSpec (waits until rank 0 publishes it)
    spawn this node's ranks, each on its local GPU
    loop: relay each rank's answers (ready, kv, error) into the store; beat the heartbeat
    until every rank has exited (0: rank 0 said stop) or the store is gone (rank 0 died)"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from openinfer_core.distributed.local_ranks import LocalRank, rank_device
from openinfer_core.distributed.nodes import BEAT_S, NodeLayout, open_store, publish, read
from openinfer_core.distributed.worker import WorkerSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger("openinfer")

STOP_GRACE_S = 10.0  # for the ranks to exit after rank 0 went away


def run_node(layout: NodeLayout, base: torch.device, timeout_s: float) -> int:
    """Run this node's ranks, on `base` and the devices after it, until the job ends; the
    process's exit code (0: rank 0 stopped them; 1: a rank failed or rank 0 went away)."""
    store = open_store(layout, timeout_s, host=False)
    spec: WorkerSpec = read(store, "spec")  # blocks (up to timeout_s) until rank 0 sets it
    ranks = layout.local_ranks(spec.size)
    log.info("node %d of %d: ranks %d..%d of %d, model %s", layout.node_rank, layout.nnodes,
             ranks.start, ranks.stop - 1, spec.size, spec.model_dir)
    workers = [LocalRank.spawn(dataclasses.replace(
        spec, rank=r, device=rank_device(base, r - ranks.start))) for r in ranks]
    failed = False
    open_pipes = {w.rank for w in workers}  # until each rank's pipe is read to its end
    try:
        while open_pipes:
            for w in workers:
                while w.rank in open_pipes and w.conn.poll():
                    try:
                        kind, payload = w.conn.recv()
                    except (EOFError, OSError):
                        open_pipes.discard(w.rank)
                        break
                    publish(store, f"rank{w.rank}/{kind}", payload)
                    failed |= kind == "error"
                failed |= _report_exit(store, w)
            store.add(f"node{layout.node_rank}/beat", 1)
            time.sleep(BEAT_S / 5)
        for w in workers:  # each pipe is closed: the process is exiting
            w.process.join(STOP_GRACE_S)
            failed |= _report_exit(store, w)
    except Exception as exc:  # the store is gone: rank 0 died or closed
        log.warning("node %d lost rank 0 (%s): stopping its ranks", layout.node_rank, exc)
        deadline = time.monotonic() + STOP_GRACE_S
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
        failed |= any(w.process.exitcode != 0 for w in workers)
    exit_codes = [w.process.exitcode for w in workers]
    log.info("node %d: ranks exited with %s", layout.node_rank, exit_codes)
    return 1 if failed or any(code != 0 for code in exit_codes) else 0


def _report_exit(store: Any, worker: LocalRank) -> bool:
    """Tell rank 0 that `worker` died with a non-zero code (unless it said why itself); whether
    it did."""
    code = worker.process.exitcode
    if code in (0, None):
        return False
    if not store.check([f"rank{worker.rank}/error"]):
        publish(store, f"rank{worker.rank}/error", f"exited with code {code}")
    return True
