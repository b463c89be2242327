"""The offline API end to end with the real Qwen tokenizer: text, chat, stop strings, logprobs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import hf_greedy
from qwen3_checkpoints import load_hf

from openinfer_core import LLM, SamplingParams
from openinfer_core.hookspecs import hookimpl
from openinfer_core.plugins import PluginManager


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> LLM:
    return LLM(qwen3_dir, device="cpu")


def test_text_prompt_matches_transformers(llm: LLM, qwen3_dir: Path) -> None:
    out = llm.generate("Hello, 世界! 🚀", SamplingParams(temperature=0, max_tokens=12,
                                                       ignore_eos=True))[0]
    ids = llm.tokenizer.encode("Hello, 世界! 🚀")
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == hf_greedy(load_hf(qwen3_dir), ids, 12)
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids,
                                                       skip_special_tokens=True)


def test_generation_config_gives_the_default_sampling_params(llm: LLM) -> None:
    # The tiny checkpoint's generation_config.json recommends Qwen3's sampling settings.
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.6, top_p=0.95,
                                                               top_k=20)


def test_stop_string_truncates_and_ends(llm: LLM) -> None:
    free = llm.generate([[9707, 11, 1879]], SamplingParams(temperature=0, max_tokens=16,
                                                          ignore_eos=True))[0].outputs[0]
    assert len(free.text) > 6
    stop = free.text[3:6]
    cut = llm.generate([[9707, 11, 1879]], SamplingParams(temperature=0, max_tokens=16,
                                                         ignore_eos=True, stop=[stop]))
    got = cut[0].outputs[0]
    assert got.text == free.text[: free.text.index(stop)]
    assert got.finish_reason == "stop" and got.stop_reason == stop
    assert llm.engine.kv.num_used_blocks == 0  # the aborted request gave its blocks back


def test_chat_applies_template_and_thinking_toggle(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    with_think = llm.tokenizer.apply_chat_template(messages)
    no_think = llm.tokenizer.apply_chat_template(messages, enable_thinking=False)
    assert with_think.endswith("<|im_start|>assistant\n")
    assert no_think == with_think + "<think>\n\n</think>\n\n"
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                   chat_template_kwargs={"enable_thinking": False})[0]
    assert out.prompt == no_think
    assert out.prompt_token_ids == llm.tokenizer.encode(no_think, add_special_tokens=False)
    assert out.prompt_token_ids[0] == 151644  # <|im_start|>, a single special token


def test_logprobs_are_the_model_distribution(llm: LLM, qwen3_dir: Path) -> None:
    prompt = [1, 2, 3, 4]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    entry = out.outputs[0].logprobs[0]
    token = out.outputs[0].token_ids[0]
    with torch.inference_mode():
        ref = torch.log_softmax(load_hf(qwen3_dir)(torch.tensor([prompt])).logits[0, -1], -1)
    top = ref.topk(5)
    assert set(entry) == set(top.indices.tolist()) | {token}
    for tid, lp in entry.items():
        assert math.isclose(lp, float(ref[tid]), abs_tol=1e-4)


class _EncodedQwen3:
    """A plugin registering the Qwen3 line with a chat encoder (the demo's toy)."""

    @hookimpl
    def openinfer_register_models(self, register: Any) -> None:
        register("encoded-qwen3", "openinfer_qwen3.model_line:Qwen3ModelLine",
                 architectures=("Qwen3ForCausalLM",),
                 chat_encoder="toy_encoder:PlainEncoder")


def test_chat_uses_the_model_lines_chat_encoder(qwen3_dir: Path) -> None:
    pm = PluginManager(autoload=True, plugins=[_EncodedQwen3()])
    llm = LLM(qwen3_dir, device="cpu", plugins=pm)
    out = llm.chat([{"role": "user", "content": "hi"}],
                   SamplingParams(max_tokens=2, temperature=0.0))
    assert out[0].prompt == "<user>hi</user>"
    assert out[0].prompt_token_ids == llm.tokenizer.encode("<user>hi</user>",
                                                           add_special_tokens=False)
