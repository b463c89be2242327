"""GPU golden gate for the Qwen3.5 hybrid line: a random-weight checkpoint at Qwen3.5-4B's
widths cut to 8 layers (two groups of three Gated DeltaNet layers and one full-attention layer)
in bf16 against transformers in bf16 (which runs flash-linear-attention's kernels on the GPU
where fla imports, as ours do), teacher-forced over 32 sequences with prompts of 1-512 tokens.

The gate's numbers are Qwen3's (test_golden_qwen3_gpu.py): per compared position, regret of
our pick <= 0.20 nat; |our logprob - transformers'| over our top 8: mean <= 0.06, p99 <= 0.20.
Cases: batch 1 eager (every prompt position, then eager decodes); batch 1 decoding from CUDA
graphs (prompts eager: the chunked delta rule plans on the host, so no mixed-step graphs);
a mixed batch of chunked prefills beside decodes, each request carrying its state slot across
chunks; graph buckets entered from below (5 rows in the 8-bucket, 9 in the 16-bucket: the
padding rows on the padding state slot must leave the real rows' states alone)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from forced import (
    Picks,
    check_gate,
    each_alone,
    gate_engine,
    random_sequences,
    reference_logprobs,
    run_forced,
)

pytestmark = pytest.mark.gpu

LAYERS = 8
PROMPT_LENS = [1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129,
               160, 200, 255, 256, 257, 300, 333, 384, 400, 450, 511, 512]
DECODES = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3.5-4B's language model, first 8 layers, as a `Qwen3_5ForCausalLM` checkpoint
    (the text-only form, which transformers and openinfer both load) with random bf16
    weights at the config's initializer range."""
    from openinfer_qwen35.config import Qwen35Config
    from openinfer_qwen35.random_weights import write_weights
    from openinfer_qwen35.shapes import reduced_depth, write_config_folder

    folder = write_config_folder("Qwen3.5-4B", tmp_path_factory.mktemp("qwen35-4b"),
                                 layers=LAYERS)
    text = reduced_depth("Qwen3.5-4B", LAYERS)["text_config"]
    config = {"architectures": ["Qwen3_5ForCausalLM"], **text}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    cfg = Qwen35Config.from_dict(config)
    assert len(cfg.full_layers) == 2 and len(cfg.linear_layers) == 6
    write_weights(cfg, folder, std=float(text["initializer_range"]), dtype=torch.bfloat16)
    return folder


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return random_sequences(35, PROMPT_LENS, DECODES, vocab=151643)


@pytest.fixture(scope="module")
def reference(checkpoint: Path, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logprobs (its bf16 forward, fp32 log-softmax) at every position of every
    sequence, kept in host memory (about 6 GB)."""
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).cuda().eval()
    return reference_logprobs(hf, sequences)


@pytest.fixture(scope="module")
def engine(checkpoint: Path, reference: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    return gate_engine(checkpoint)  # after `reference`, which frees its GPU memory


def _compare(name: str, picks: list[Picks], reference: list[torch.Tensor],
             which: list[int]) -> None:
    check_gate(f"qwen35-{name}", picks, reference, which)


def _slots_free(engine) -> None:  # type: ignore[no-untyped-def]
    assert [u.used for u in engine.kv.group_usage()] == [0, 0]


def test_batch1_eager(engine, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    picks = each_alone(engine, sequences, DECODES)
    _compare("batch1-eager", picks, reference, list(range(len(sequences))))
    _slots_free(engine)


def test_batch1_cuda_graph(engine, sequences, reference) -> None:  # type: ignore[no-untyped-def]
    assert engine.graphs is not None
    before = engine.graphs.replays["decode"]
    picks = each_alone(engine, sequences[::3], DECODES, use_graphs=True)
    assert engine.graphs.replays["decode"] >= before + len(sequences[::3]) * (DECODES - 1)
    _compare("batch1-graph", picks, reference, list(range(len(sequences)))[::3])


@pytest.mark.parametrize("chunk", [96, 24])
def test_mixed_batch_with_chunked_prefill(engine, sequences,  # type: ignore[no-untyped-def]
                                          reference, chunk: int) -> None:
    which = list(range(0, 32, 2))

    def plan(step: int, i: int, done: int) -> int:
        start = i % 5  # staggered arrivals
        if step < start:
            return 0
        n = len(sequences[which[i]]) - DECODES
        return min(chunk, n - done) if done < n else 1  # chunks, then decode

    picks = run_forced(engine, [sequences[i] for i in which], plan, use_graphs=False)
    _compare(f"mixed-chunked-{chunk}", picks, reference, which)
    _slots_free(engine)


@pytest.mark.parametrize("rows", [5, 9])
def test_graph_bucket_entered_from_below(engine, sequences,  # type: ignore[no-untyped-def]
                                         reference, rows: int) -> None:
    assert engine.graphs is not None
    which = list(range(1, 32, 3))[:rows]
    prompts = [len(sequences[i]) - DECODES for i in which]
    picks = run_forced(engine, [sequences[i] for i in which],
                       lambda step, i, done: prompts[i] if step == 0 else 1, use_graphs=True)
    _compare(f"graph-{rows}-rows", picks, reference, which)
    _slots_free(engine)
