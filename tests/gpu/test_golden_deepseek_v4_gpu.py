"""GPU golden gate for DeepSeek-V4 (DESIGN §7's method): V4-Flash's real widths cut to 3 layers
(a window, a CSA and an HCA layer; the first hash-routed), dummy weights in the checkpoint's own
formats (FP8 linears, FP4 routed experts), against transformers' `DeepseekV4ForCausalLM` in bf16
holding the same weights dequantized. Teacher-forced over sequences whose prompts reach past
the window (128), many HCA entries (ratio 128) and more CSA entries than the indexer keeps
(512 of ratio 4: past 2048 tokens).

Per compared position: regret of our pick <= 0.20 nat; |Δ logprob| over our top 8: mean <=
0.06, p99 <= 0.20 (the Qwen3 gate's bounds). Cases: batch 1 (every prompt position of one
prefill, then decodes), and a mixed batch of chunked prefills beside decodes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from dsv4_transformers import transformers_config, transformers_model
from forced import Picks, check_gate, each_alone, random_sequences, reference_logprobs, run_forced

pytestmark = pytest.mark.gpu

PROMPT_LENS = [1, 7, 100, 129, 300, 700, 1500, 2200, 2600]
DECODES = 8
LAYERS = int(os.environ.get("OPENINFER_DSV4_GOLDEN_LAYERS", "3"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

    out = tmp_path_factory.mktemp("dsv4-golden")
    config = json.loads(transformers_config(LAYERS).to_json_string())
    config["architectures"] = ["DeepseekV4ForCausalLM"]
    (out / "config.json").write_text(json.dumps(config))
    return write_tokenizer_files(out)


@pytest.fixture(scope="module")
def engine(folder: Path):  # type: ignore[no-untyped-def]
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    return Engine(EngineConfig(model=str(folder), device="cuda", load_format="dummy",
                               max_model_len=4096, max_num_seqs=16, num_kv_blocks=2048))


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return random_sequences(5, PROMPT_LENS, DECODES, vocab=128000)


@pytest.fixture(scope="module")
def reference(engine, sequences: list[list[int]]) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """transformers' logprobs (bf16 forward, fp32 log-softmax) at every position, on the host."""
    from openinfer_deepseek_v4.config import DeepseekV4Config

    cfg: DeepseekV4Config = engine.model.cfg
    return reference_logprobs(
        transformers_model(transformers_config(LAYERS), engine.model.w, cfg), sequences)


def _compare(name: str, picks: list[Picks], reference: list[torch.Tensor],
             which: list[int]) -> None:
    check_gate(f"dsv4-{LAYERS}layers-{name}", picks, reference, which)


def _staggered(sequences: list[list[int]], chunk: int):  # type: ignore[no-untyped-def]
    """A run_forced plan: sequence i arrives at step i % 4, its prompt in chunks of `chunk`
    tokens, then a token a step."""
    def plan(step: int, i: int, done: int) -> int:
        if step < i % 4:
            return 0
        n = len(sequences[i]) - DECODES
        return min(chunk, n - done) if done < n else 1
    return plan


def test_weights_stay_in_their_formats(engine) -> None:  # type: ignore[no-untyped-def]
    from openinfer_deepseek_v4.quantized import Fp4Experts, Fp8Linear

    layer = engine.model.w.layers[1]
    assert isinstance(layer.attention.q_b, Fp8Linear)
    assert isinstance(layer.moe.gate_up, Fp4Experts)


def test_batch1(engine, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    picks = each_alone(engine, sequences, DECODES)
    _compare("batch1", picks, reference, list(range(len(sequences))))


def test_mixed_batch_with_chunked_prefill(engine, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    which = list(range(len(sequences)))
    picks = run_forced(engine, [sequences[i] for i in which], _staggered(sequences, 512),
                       use_graphs=False)
    _compare("mixed-chunked-512", picks, reference, which)


def test_decodes_in_cuda_graphs(engine, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    """Each prompt in one eager prefill, then every sequence's decodes together, replayed
    from the engine's captured graphs (widths from max_model_len, padding rows)."""
    assert engine.graphs is not None, "the model should be captured in CUDA graphs"
    which = list(range(len(sequences)))
    before = engine.graphs.replays["decode"]
    picks = run_forced(engine, sequences,
                       lambda step, i, done: len(sequences[i]) - DECODES if step == 0 else 1,
                       use_graphs=True)
    assert engine.graphs.replays["decode"] - before == DECODES - 1
    _compare("decode-cuda-graphs", picks, reference, which)


def test_side_stream_gives_the_same_bits(folder, engine, sequences) -> None:  # type: ignore[no-untyped-def]
    """The side stream's branches (side_branches.py) move launches onto a second stream and
    nothing else: decodes replayed from CUDA graphs (the fork and join captured), and eager
    ones, give the same logprobs to the bit with them on and off (the same dummy weights:
    they are made from the tensor names)."""
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine
    from openinfer_deepseek_v4.side_branches import SIDE_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SIDE_ENV, "0" if engine.model._side else "1")
        other = Engine(EngineConfig(model=str(folder), device="cuda", load_format="dummy",
                                    max_model_len=4096, max_num_seqs=16, num_kv_blocks=2048))
    assert not engine.model._side or not other.model._side
    assert engine.model._side or other.model._side
    for use_graphs in (True, False):
        picks = [run_forced(e, sequences, lambda step, i, done: len(sequences[i]) - DECODES
                            if step == 0 else 1, use_graphs=use_graphs)
                 for e in (engine, other)]
        for a, b in zip(*picks, strict=True):
            assert a.positions == b.positions
            assert torch.equal(a.top_ids, b.top_ids)
            assert torch.equal(a.top_logprobs, b.top_logprobs)


def test_mixed_batches_in_cuda_graphs(folder, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    """With mixed steps captured (`OPENINFER_DSV4_GRAPH_TOKENS`, opt-in): staggered prompt
    chunks of 96 tokens beside decodes, every step of at most 512 tokens replayed from a
    mixed-step graph, within the same gate."""
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENINFER_DSV4_GRAPH_TOKENS", "512")
        mixed = Engine(EngineConfig(model=str(folder), device="cuda", load_format="dummy",
                                    max_model_len=4096, max_num_seqs=16, num_kv_blocks=2048))
    assert mixed.graphs is not None and mixed.graphs.mixed[-1] == 512
    which = list(range(len(sequences)))
    before = dict(mixed.graphs.replays)
    picks = run_forced(mixed, [sequences[i] for i in which], _staggered(sequences, 96),
                       use_graphs=True)
    assert mixed.graphs.replays["mixed"] > before["mixed"] + 10
    _compare("mixed-cuda-graphs-96", picks, reference, which)
