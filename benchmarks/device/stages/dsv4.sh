# DeepSeek-V4: its kernels (`dsv4`) and the model at V4-Flash widths (`dsv4model`; `dsv4` runs
# both).

stage_dsv4() {
  stage "DeepSeek-V4 kernel tests (its own and the shared FP8 linear), compiled, every size"
  timeout 180 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-deepseek-v4/tests/kernels \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py 2>&1 \
    | tail -25 | tee "$OUT/dsv4_kernel_tests.log"
  stage "DeepSeek-V4 kernels against their read floors"
  timeout 60 python3 benchmarks/device/dsv4_gemm_bench.py 2>&1 | tee "$OUT/dsv4-gemm.log" | tail -30
  stage "DeepSeek-V4 FP4 experts at decode sizes: grouped vs decode path, candidate tiles"
  timeout 180 python3 benchmarks/device/dsv4_moe_sweep.py 2>&1 | tee "$OUT/dsv4-moe-sweep.log" | tail -22
  timeout 60 python3 benchmarks/device/dsv4_attention_bench.py --json "$OUT/dsv4-attention.json" 2>&1 | tail -20
  timeout 45 python3 benchmarks/device/dsv4_mhc_bench.py 2>&1 | tee "$OUT/dsv4-mhc.log" | tail -15
  has dsv4model || stage_dsv4model  # `dsv4 dsv4model` runs the model part once
}

stage_dsv4model() {
  stage "DeepSeek-V4 golden gate vs transformers (V4-Flash widths, 3 layers, FP8/FP4 weights, bf16)"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    tests/gpu/test_golden_deepseek_v4_gpu.py 2>&1 | tail -40 | tee "$OUT/dsv4_golden.log"
  stage "DeepSeek-V4 decode step, kernel by kernel (3 layers, batch 1 and 64)"
  timeout 150 python3 benchmarks/device/dsv4_profile.py --json "$OUT/dsv4-profile.json" 2>&1 \
    | tee "$OUT/dsv4-profile.log" | tail -70
  stage "DeepSeek-V4 launches per layer and decode time, eager and graphed (V4-Flash widths)"
  timeout 240 python3 benchmarks/device/dsv4_launches.py --batches 1,64 --json "$OUT/dsv4-launches.json" 2>&1 | tee "$OUT/dsv4-launches.log" | tail -25
  stage "DeepSeek-V4 decode time per layer, batch 1 and 64 (V4-Flash widths)"
  timeout 150 python3 benchmarks/device/dsv4_decode.py --layers ${DSV4_LAYERS:-6} \
    --json "$OUT/dsv4-decode.json" 2>&1 | tail -8
  # V4-Flash cut to DSV4_BENCH_LAYERS layers (all 43 need two H200s): the engine's own
  # batch-1 latency with CUDA graphs against the weight-read floor of the same layers.
  local d4=/tmp/dsv4-flash-cut
  python3 - "$d4" "${DSV4_BENCH_LAYERS:-12}" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "tests/gpu")
from dsv4_transformers import transformers_config
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
config = json.loads(transformers_config(int(sys.argv[2])).to_json_string())
config["architectures"] = ["DeepseekV4ForCausalLM"]
(out / "config.json").write_text(json.dumps(config))
write_tokenizer_files(out)
PY
  stage "DeepSeek-V4 batch-1 latency, ${DSV4_BENCH_LAYERS:-12} of V4-Flash's layers"
  timeout 240 python3 -m openinfer_server.cli bench latency $d4 --load-format dummy --max-num-seqs 4 \
    --max-model-len 4096 --input-len 128 2048 --output-len 64 --num-iters 3 \
    --result-file "$OUT/latency-dsv4-cut.json" 2>&1 | tail -12
  # The same with the official FP8 / FP4 rounding inside the forward (quant_sim.py; on by
  # default for DeepSeek's quantized release configs, off for this transformers-written one).
  stage "DeepSeek-V4 batch-1 latency, the same layers, OPENINFER_DSV4_QUANT_SIM=on"
  OPENINFER_DSV4_QUANT_SIM=on timeout 240 python3 -m openinfer_server.cli bench latency $d4 \
    --load-format dummy --max-num-seqs 4 --max-model-len 4096 --input-len 128 2048 \
    --output-len 64 --num-iters 3 --result-file "$OUT/latency-dsv4-cut-quantsim.json" 2>&1 | tail -12
}
