"""Plugins: entry-point discovery, the allowlist, every hook, and the toy third-party line."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import httpx
import pytest
import sample_plugin
from engine_helpers import engine_block_bytes

from openinfer_core import (
    LLM,
    Engine,
    EngineConfig,
    GenerateRequest,
    SamplingParams,
    Scheduled,
    hookspecs,
    plugins,
)
from openinfer_core.engine.async_engine import AsyncEngine
from openinfer_core.errors import ModelConfigError, PluginError, UnsupportedModelError
from openinfer_core.interfaces.kernel_compiler import KernelCompiler
from openinfer_core.plugins import PluginManager
from openinfer_core.registry import Registry
from openinfer_core.startup.kernel_compilers import KernelCompilers, start_compile_workers
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.chat_output import ChatParsers
from openinfer_toy import plugin as toy_plugin
from openinfer_toy.model import write_toy_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
ROOT = Path(__file__).resolve().parents[1]


def test_installed_packages_are_discovered_through_entry_points() -> None:
    pm = PluginManager(autoload=True)
    assert {"core", "kernels", "qwen3", "toy"} <= set(pm.plugin_names())
    regs = pm.registries
    assert regs.models.get("qwen3").plugin == "qwen3"
    assert regs.models.get("toy-counter").plugin == "toy"
    assert regs.schedulers.get("fcfs").plugin == "core"
    assert regs.attention_backends.get("torch").plugin == "kernels"


def test_allowlist_limits_what_loads() -> None:
    pm = PluginManager(autoload=True, allowlist={"core", "kernels", "toy"})
    assert set(pm.plugin_names()) == {"core", "kernels", "toy"}
    assert pm.registries.models.names() == ["toy-counter"]


def test_allowlist_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENINFER_PLUGINS", "core, kernels")
    plugins.reset_plugin_manager()
    try:
        pm = plugins.get_plugin_manager()
        assert pm is plugins.get_plugin_manager()  # loaded once per process
        assert set(pm.plugin_names()) == {"core", "kernels"}
    finally:
        plugins.reset_plugin_manager()


def test_toy_plugin_model_line_is_served(tmp_path: Path) -> None:
    path = write_toy_checkpoint(tmp_path / "toy", vocab_size=50, step=3, eos_token_id=15)
    llm = LLM(path, device="cpu")
    out = llm.generate([[1, 2, 3], [40]], SamplingParams(temperature=0.0, max_tokens=5))
    assert out[0].outputs[0].token_ids == [6, 9, 12]  # 15 is the end-of-sequence id
    assert out[0].outputs[0].finish_reason == "stop"
    assert out[0].outputs[0].stop_reason == 15
    assert out[1].outputs[0].token_ids == [43, 46, 49, 2, 5]
    assert out[1].outputs[0].finish_reason == "length"


def test_unknown_architecture_is_refused_listing_installed_lines(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["MysteryForCausalLM"], "model_type": "mystery"}))
    with pytest.raises(UnsupportedModelError) as err:
        Engine(EngineConfig(model=str(tmp_path), device="cpu"))
    message = str(err.value)
    assert "MysteryForCausalLM" in message
    assert "qwen3 (Qwen3ForCausalLM)" in message
    assert "toy-counter (ToyCounterForCausalLM)" in message


def test_discovery_imports_neither_torch_nor_model_code() -> None:
    code = (
        "import sys\n"
        "from openinfer_core.plugins import get_plugin_manager\n"
        "regs = get_plugin_manager().registries\n"
        "assert 'qwen3' in regs.models and 'torch' in regs.attention_backends\n"
        "leaked = [m for m in ('torch', 'openinfer_qwen3.model', 'openinfer_toy.model')"
        " if m in sys.modules]\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scheduler_hook_adds_a_policy(tmp_path: Path) -> None:
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    path = write_toy_checkpoint(tmp_path / "toy")
    engine = Engine(EngineConfig(model=str(path), device="cpu", scheduler="lifo",
                                 max_num_seqs=1), pm)
    for i in range(3):
        engine.add_request(GenerateRequest(f"r{i}", (i,), GREEDY))
    order = []
    while engine.has_work():
        order += [e.request_id for e in engine.step() if isinstance(e, Scheduled)]
    assert order == ["r2", "r1", "r0"]
    with pytest.raises(PluginError, match="unknown scheduler 'nope'; known: fcfs, lifo, priority"):
        Engine(EngineConfig(model=str(path), device="cpu", scheduler="nope"), pm)


def test_attention_backend_hook_is_used_by_default_when_preferred(qwen3_dir: Path) -> None:
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    assert pm.registries.default_attention_backend("cpu") == "counting"
    assert pm.registries.default_attention_backend("cuda") == "triton"
    sample_plugin.CountingAttention.calls = 0
    ours = LLM(qwen3_dir, device="cpu", plugins=pm).generate([[5, 6, 7]], GREEDY)
    base = LLM(qwen3_dir, device="cpu").generate([[5, 6, 7]], GREEDY)
    assert sample_plugin.CountingAttention.calls > 0
    assert ours[0].outputs[0].token_ids == base[0].outputs[0].token_ids


def test_the_environment_names_the_attention_backend_when_the_config_does_not(
        qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    monkeypatch.setenv("OPENINFER_ATTENTION_BACKEND", "torch")
    sample_plugin.CountingAttention.calls = 0
    LLM(qwen3_dir, device="cpu", plugins=pm).generate([[5, 6, 7]], GREEDY)
    assert sample_plugin.CountingAttention.calls == 0  # not the default "counting"
    LLM(qwen3_dir, device="cpu", plugins=pm, attention_backend="counting").generate(
        [[5, 6, 7]], GREEDY)
    assert sample_plugin.CountingAttention.calls > 0  # the config wins
    monkeypatch.setenv("OPENINFER_ATTENTION_BACKEND", "nope")
    with pytest.raises(PluginError, match="nope"):
        LLM(qwen3_dir, device="cpu", plugins=pm)


def test_offload_tier_hook_adds_a_store_the_engine_restores_from(qwen3_dir: Path) -> None:
    """A third-party store beneath the built-in host tier: with a host pool of six blocks
    (a prompt has four), re-sent prompts come back from the plugin's store."""
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    assert pm.registries.offload_tiers.get("memory").plugin == "sample_plugin"
    block = engine_block_bytes(qwen3_dir)
    sample_plugin.MemoryStore.instances.clear()
    llm = LLM(qwen3_dir, device="cpu", plugins=pm, num_kv_blocks=12,
              kv_offload=("host", "memory"), kv_offload_host_gib=6 * block / (1 << 30))
    prompts = [[(7 * i + j) % 300 + 1 for j in range(70)] for i in range(3)]
    first = llm.generate(prompts, GREEDY)
    again = llm.generate(prompts, GREEDY)
    store = sample_plugin.MemoryStore.instances[-1]
    assert store.reads > 0
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    assert any(o.num_cached_tokens > 0 for o in again)
    with pytest.raises(ModelConfigError, match="can only be below the first tier"):
        LLM(qwen3_dir, device="cpu", plugins=pm, kv_offload=("memory",))


def test_parser_hooks_add_parsers_the_server_uses(qwen3_dir: Path) -> None:
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    regs = pm.registries
    assert regs.tool_parsers.get("echo").plugin == "sample_plugin"
    assert regs.tool_parsers.get("hermes").plugin == "core"
    assert regs.reasoning_parsers.names() == ["all-reasoning", "deepseek_r1", "qwen3"]
    engine = AsyncEngine(Engine(EngineConfig(model=str(qwen3_dir), device="cpu"), pm))
    tokenizer = Tokenizer.from_dir(qwen3_dir)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0.0, "ignore_eos": True}
    tools = [{"type": "function", "function": {"name": "echo"}}]

    def post(path: str, json: dict[str, Any], tool: str | None = None,
             reasoning: str | None = None) -> dict[str, Any]:
        app = build_app(engine, tokenizer, served_model_names=["m"],
                        parsers=ChatParsers.from_names(regs, tool, reasoning))

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                return await client.post(path, json=json)

        response = asyncio.run(go())
        assert response.status_code == 200, response.text
        choice: dict[str, Any] = response.json()["choices"][0]
        return choice

    def raw_text(**template: Any) -> str:  # the same prompt through /v1/completions
        prompt = tokenizer.apply_chat_template(body["messages"], **template)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        text: str = post("/v1/completions", {**body, "prompt": ids})["text"]
        return text

    try:
        called = post("/v1/chat/completions", {**body, "tools": tools}, tool="echo")["message"]
        assert called["content"] is None
        assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in called["tool_calls"]] == [
                    ("call_echo", "echo", {"text": raw_text(tools=tools)})]
        thought = post("/v1/chat/completions", body, reasoning="all-reasoning")["message"]
        assert (thought["reasoning_content"], thought["content"]) == (raw_text(), None)
    finally:
        engine.shutdown()


def test_kernel_compiler_hook_adds_a_compiler_start_up_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pm = PluginManager(autoload=False, plugins=[sample_plugin])
    entry = pm.registries.kernel_compilers.get("recording")
    assert (entry.plugin, entry.meta) == ("sample_plugin", {"sources": ("sample_plugin",)})
    monkeypatch.setattr(sample_plugin.RecordingCompiler, "folder", tmp_path)
    monkeypatch.setattr(sample_plugin.RecordingCompiler, "calls", [])
    monkeypatch.delenv("OPENINFER_COMPILE_AHEAD", raising=False)
    compilers = KernelCompilers.from_plugins(pm)
    assert len(compilers.compilers) == 1  # two names, one target: built once
    assert isinstance(compilers.compilers[0], KernelCompiler)
    assert compilers.sources == ("openinfer_toy", "sample_plugin")
    assert not start_compile_workers("cpu", pm)
    assert start_compile_workers("cuda", pm)  # nothing marked compiled yet
    with compilers.compiling():
        pass
    compilers.mark_compiled()
    assert list(tmp_path.iterdir())  # the mark is in the compiler's own cache
    assert not start_compile_workers("cuda", pm)  # this install's kernels are compiled
    assert sample_plugin.RecordingCompiler.calls == ["start_workers", "compiling", "compiled"]
    # The mark names every registered package's sources: one more, another mark.
    alone = KernelCompilers(compilers.compilers, ("sample_plugin",))
    assert alone.fingerprint() != compilers.fingerprint() and not alone.compiled()


def test_every_hook_is_documented_and_tested() -> None:
    hooks = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
             if n.startswith("openinfer_")]
    assert len(hooks) == 7
    test_plugins = [sample_plugin, toy_plugin]  # the toy plugin provides the model hook
    test_source = "".join(Path(str(p.__file__)).read_text() for p in test_plugins)
    core_readme = (ROOT / "packages/openinfer-core/README.md").read_text()
    for name in hooks:
        assert len(inspect.getdoc(getattr(hookspecs, name)) or "") > 80, f"{name} undocumented"
        assert f"def {name}" in test_source, f"{name} has no test plugin"
        assert name in core_readme, f"{name} missing from openinfer-core/README.md"


def test_broken_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "no_such_module_xyz", "openinfer")
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken])
    with pytest.raises(PluginError, match="plugin 'broken'.*OPENINFER_PLUGINS"):
        PluginManager(autoload=True)


def test_registry_rejects_conflicts_and_bad_targets() -> None:
    reg: Registry[object] = Registry("scheduler")
    reg.add("a", "pkg.mod:A", plugin="one")
    reg.add("a", "pkg.mod:A", plugin="one")  # same registration again is harmless
    with pytest.raises(PluginError, match="registered twice"):
        reg.add("a", "pkg.mod:B", plugin="two")
    reg.add("bad", "no-colon-here")
    with pytest.raises(PluginError, match="must look like"):
        reg.resolve("bad")
    reg.add("missing", "no_such_module_xyz:Thing")
    with pytest.raises(PluginError, match="cannot import 'no_such_module_xyz'"):
        reg.resolve("missing")
