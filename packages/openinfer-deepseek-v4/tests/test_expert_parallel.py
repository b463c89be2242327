"""Expert parallelism (`expert_parallel.py`) on two gloo ranks against one rank's
`reference.moe`: steps whose tokens' experts all live on the other rank, steps with no token
whose experts all live on one, a one-token step, hash and score routing; and the local routes
and the shard arithmetic alone."""

from __future__ import annotations

import multiprocessing
import tempfile

import pytest
import torch
from ep_workers import CASES, case_inputs, moe_config, moe_weights, run_rank

from openinfer_core.distributed.tp_model import check_expert_parallel
from openinfer_core.errors import ModelConfigError
from openinfer_deepseek_v4.expert_parallel import local_routes
from openinfer_deepseek_v4.model_line import DeepseekV4ModelLine
from openinfer_deepseek_v4.reference import moe
from openinfer_deepseek_v4.shard import DeepseekV4Shard


@pytest.fixture(scope="module")
def two_ranks() -> dict[tuple[str, bool], list[torch.Tensor]]:
    """{(case, hash routing): [rank 0's output, rank 1's]}."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        pipes, processes = [], []
        for rank in range(2):
            parent, child = context.Pipe()
            process = context.Process(target=run_rank, args=(rank, f"{folder}/store", child),
                                      daemon=True)
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        try:
            outs = [pipe.recv() if pipe.poll(120) else {} for pipe in pipes]
        finally:
            for process in processes:
                process.join(10)
                if process.is_alive():
                    process.kill()
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
    return {key: [torch.from_numpy(out[key]) for out in outs] for key in outs[0]}


@pytest.mark.parametrize("hashed", [True, False], ids=["hash-routed", "score-routed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_give_one_ranks_moe(two_ranks: dict[tuple[str, bool], list[torch.Tensor]],
                                      case: str, hashed: bool) -> None:
    cfg = moe_config()
    x, token_ids = case_inputs(CASES[case])
    want = moe(x, token_ids, moe_weights(hashed), cfg)
    got = two_ranks[case, hashed]
    assert torch.equal(got[0], got[1]), "the ranks disagree"
    # fp32: each rank sums its experts and its shared slice, then the ranks are summed.
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)


def test_local_routes_keep_the_ranks_experts_renumbered() -> None:
    ids = torch.tensor([[7, 0], [3, 4], [1, 6]])
    weights = torch.tensor([[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]])
    local, kept = local_routes(ids, weights, range(3, 5))  # the middle rank of 3, 2 and 3
    assert local.tolist() == [[-1, -1], [0, 1], [-1, -1]]
    assert kept.tolist() == [[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]
    local, kept = local_routes(ids, weights, range(0, 3))
    assert local.tolist() == [[-1, 0], [-1, -1], [1, -1]]
    assert kept.tolist() == [[0.0, 0.25], [0.0, 0.0], [3.0, 0.0]]


def test_shards_split_heads_by_group_and_experts_whole() -> None:
    cfg = moe_config()  # 2 heads, 2 groups, 8 experts of width 8
    ranks = [DeepseekV4Shard.of(cfg, r, 2, expert_parallel=True) for r in range(2)]
    assert [s.experts for s in ranks] == [range(0, 4), range(4, 8)]
    assert all(s.intermediate == range(8) and len(s.heads) == 1 for s in ranks)
    assert [s.shared for s in ranks] == [range(0, 4), range(4, 8)]  # by width, as without EP
    tp = [DeepseekV4Shard.of(cfg, r, 2) for r in range(2)]
    assert [s.experts for s in tp] == [range(8), range(8)]
    assert [s.intermediate for s in tp] == [range(0, 4), range(4, 8)]
    with pytest.raises(ModelConfigError, match="o_groups"):
        DeepseekV4Shard.of(cfg, 0, 3)


def test_expert_parallel_is_refused_for_lines_without_experts() -> None:
    class Dense:
        name = "dense"
        supports_tensor_parallel = True

    with pytest.raises(ModelConfigError, match="no routed experts"):
        check_expert_parallel(Dense, True)
    check_expert_parallel(Dense, False)
    check_expert_parallel(DeepseekV4ModelLine, True)

