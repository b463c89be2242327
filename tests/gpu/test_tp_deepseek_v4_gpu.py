"""DeepSeek-V4 over 2 GPUs (NCCL), dummy weights in the checkpoint's formats (FP8 linears, FP4
routed experts; a dummy tensor depends only on its name, so every rank's slices are one
model's):

- V4-Flash's widths cut to 3 layers (window, CSA, HCA; the first hash-routed), split over 2
  GPUs by heads and expert widths, or with expert parallelism, against the same model on one
  GPU, teacher-forced (prompts of 1-2200 tokens, then decodes): the golden gate's bounds
  (regret <= 0.20 nat, |Δ logprob| over the top 8: mean <= 0.06, p99 <= 0.20), since bf16
  all-reduces sum in another order than one GPU's GEMMs;
- V4-Flash at full size (43 layers, ~150 GB in FP8/FP4), which fits no one GPU, served on the
  two: every rank's weights fit, greedy requests finish, and the timings go to the results."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from forced import (
    Picks,
    assert_within,
    one_at_a_time,
    pick_distance,
    position_distance,
    random_sequences,
    record,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

PROMPT_LENS = [1, 7, 129, 300, 700, 2200]
DECODES = 8


def _folder(out: Path, config: dict[str, Any]) -> Path:
    from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

    (out / "config.json").write_text(json.dumps(config | {
        "architectures": ["DeepseekV4ForCausalLM"]}))
    return write_tokenizer_files(out)


def flash_config(layers: int) -> dict[str, Any]:
    """V4-Flash's config.json in DeepSeek's keys (spec §2), cut to `layers` layers: layers 0-1
    window-only, then CSA and HCA in turn; the first 3 hash-routed."""
    from dsv4_transformers import transformers_config

    config = json.loads(transformers_config(layers).to_json_string())
    for key in ("layer_types", "mlp_layer_types", "compress_rates"):
        config.pop(key, None)
    ratios = [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(layers)]
    return config | {"compress_ratios": [*ratios, 0], "num_hash_layers": min(3, layers)}


def _engine(folder: Path, tp: int, ep: bool, **kw: Any) -> Any:
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    return Engine(EngineConfig(model=str(folder), device="cuda", load_format="dummy",
                               enforce_eager=True, tensor_parallel_size=tp,
                               enable_expert_parallel=ep, **kw))


def _picks(folder: Path, sequences: list[list[int]], tp: int, ep: bool) -> list[Picks]:
    engine = _engine(folder, tp, ep, max_model_len=4096, num_kv_blocks=1024)
    return one_at_a_time(engine, sequences, DECODES)


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_tp2_matches_one_gpu(tmp_path: Path, ep: bool) -> None:
    folder = _folder(tmp_path, flash_config(3))
    sequences = random_sequences(8, PROMPT_LENS, DECODES, vocab=128000)
    one = _picks(folder, sequences, 1, False)
    two = _picks(folder, sequences, 2, ep)
    row = {"case": f"dsv4-3layers-{'tp2-ep' if ep else 'tp2'}-vs-tp1",
           **pick_distance(one, two)}
    record(row)
    assert_within(row)
    assert row["picks_outside_top8"] == 0, row


def test_post_pre_against_plain_tp2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`OPENINFER_DSV4_POST_PRE=1` against the same TP2 engine without it, position by
    position. The fused engine runs first: a process sets up symmetric memory for its first
    group only, so the second engine's all-reduces go through NCCL, which over two ranks sums
    the same two rows in the same bits, with hc_post apart (the pushed hc_post's bits). The
    fused launch runs at one-token steps only, so every position of a longer prompt step is
    the same bits (and stays so after the fused steps of the sequences before it); the
    one-token steps differ by the mix projection's fp32 summation order only, within the
    gate's bounds (on 2 x H200: the same bits). Each one-token position's largest
    |Δ logprob| (inf: no id of the two top 8s in common) and the worst positions go to the
    results."""
    from openinfer_deepseek_v4.model import POST_PRE_ENV

    folder = _folder(tmp_path, flash_config(3))
    sequences = random_sequences(8, PROMPT_LENS, DECODES, vocab=128000)
    runs = []
    for flag in ("1", "0"):
        monkeypatch.setenv(POST_PRE_ENV, flag)
        runs.append(_picks(folder, sequences, 2, False))
    fused, plain = runs
    rows, prompt_changed = [], 0
    for n, (pa, pb) in enumerate(zip(plain, fused, strict=True)):
        prompt_len = len(sequences[n]) - DECODES
        for k, pos in enumerate(pa.positions):
            one_token = pos >= prompt_len or prompt_len == 1  # a decode, or a 1-token prompt
            regret, shared, _ = position_distance(pa, pb, k)
            delta = max(shared, default=float("inf"))
            same = (torch.equal(pa.top_ids[k], pb.top_ids[k])
                    and torch.equal(pa.top_logprobs[k], pb.top_logprobs[k]))
            prompt_changed += not one_token and not same
            rows.append((regret, delta, n, pos, one_token, same))
    row = {"case": "dsv4-3layers-tp2-post-pre-vs-plain", **pick_distance(plain, fused),
           "prompt_positions_changed": prompt_changed,
           "one_token_positions": sum(r[4] for r in rows),
           "one_token_positions_same": sum(r[5] for r in rows if r[4]),
           "one_token_max_dlogprob": [round(r[1], 4) for r in rows if r[4]],
           "worst": [dict(zip(("regret", "max_dlogprob", "sequence", "position", "one_token"),
                              r[:5], strict=True)) for r in sorted(rows, reverse=True)[:6]]}
    record(row)
    assert prompt_changed == 0, row
    assert_within(row)
    assert row["picks_outside_top8"] == 0, row


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_v4_flash_full_size_serves_on_two_gpus(tmp_path: Path, ep: bool) -> None:
    from openinfer_core import GenerateRequest, SamplingParams
    from openinfer_core.events import Finished, Token
    from openinfer_deepseek_v4.quantized import Fp4Experts, Fp8Linear

    folder = _folder(tmp_path, flash_config(43))
    start = time.perf_counter()
    engine = _engine(folder, 2, ep, max_model_len=8192, max_num_seqs=32)
    loaded = time.perf_counter() - start
    try:
        layer = engine.model.local.w.layers[2]
        assert isinstance(layer.attention.q_b, Fp8Linear)
        assert isinstance(layer.moe.gate_up, Fp4Experts)
        per_rank = [torch.cuda.max_memory_allocated(0) / 2**30]
        rng = random.Random(9)
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        for i in range(16):
            prompt = tuple(rng.randrange(2, 128000) for _ in range(rng.randint(10, 2000)))
            engine.add_request(GenerateRequest(f"r{i}", prompt, params))
        start, finished, tokens = time.perf_counter(), 0, 0
        while engine.has_work():
            for ev in engine.step():
                finished += isinstance(ev, Finished)
                tokens += isinstance(ev, Token)
        seconds = time.perf_counter() - start
    finally:
        engine.close()
    record({"case": f"dsv4-flash-43layers-{'tp2-ep' if ep else 'tp2'}-serve",
             "load_s": loaded, "rank0_peak_gib": per_rank[0], "requests": 16,
             "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
    assert finished == 16
