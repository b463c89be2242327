#!/usr/bin/env bash
# The one GPU script: on the device machine, from the repo root, after benchmarks/device/prepare.sh
# ran here. Usage: bash benchmarks/device/gpu_check.sh [STAGE ...] (default: `stages` below).
# Each stage is a function stage_NAME in benchmarks/device/stages/*.sh, whose heads say what
# they measure (`grep -h '^stage_' benchmarks/device/stages/*.sh` lists them); ORDER is the
# order they run in. API_SERVERS=N serves with --api-server-count N. Logs and JSON results go
# to $OUT; a short table prints last.
set -uo pipefail
OUT=${OUT:-/tmp/openinfer-out}
mkdir -p "$OUT"
# The order stages run in, whatever order they are named in.
ORDER="tests basetests gate allreduce tpfused tptriton tp tplatency tpprofile tp32 tpgate tpserve dsv4 dsv4gates dsv4official dsv4mhc dsv4moe dsv4moeprefill dsv4attnprefill dsv4prefill dsv4indexer dsv4model dsv4full qwen35 qwen35long qwen35tiles fp8 fp8ttft fp8fused fp8kv fp8serve tpunfused latency ab prefillattn fusion verify sampling tiles tptiles gemm pdl preload
       prefetch ttft flashinfer attention ops throughput serve dp deferred stream1 timeline prefix qps
       interference structured offload startup embed"
stages=${*:-tests latency throughput serve stream1 timeline prefix qps interference structured offload startup}
API_SERVERS=${API_SERVERS:-1}
# lib.sh first: the helpers the stage files use.
source benchmarks/device/stages/lib.sh
for file in benchmarks/device/stages/*.sh; do
  [ "$file" = benchmarks/device/stages/lib.sh ] || source "$file"
done
for name in $stages; do
  declare -F "stage_$name" >/dev/null \
    || { echo "unknown stage: $name (stages: $(echo $ORDER))"; exit 2; }
  [[ " $(echo $ORDER) " == *" $name "* ]] || { echo "stage_$name is missing from ORDER"; exit 2; }
done

[ "$(cat .whl/SOURCES 2>/dev/null)" = "$(bash benchmarks/device/source_hash.sh)" ] \
  || { echo "the wheels in .whl/ are not of these sources: run benchmarks/device/prepare.sh"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# PYTHONFAULTHANDLER: a python that `timeout -s ABRT` stops prints where each thread was.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OPENINFER_GPU_RESULTS=$OUT PYTHONFAULTHANDLER=1
# FlashInfer, when benchmarks/device/flashinfer_pack.sh made .fi/ and the call carries it. Its
# JIT builds go to $FLASHINFER_WORKSPACE_BASE/.cache; a previous call's (the fi-jit.tgz.part-*
# files the `flashinfer` stage returns, copied into .fi/) saves compiling them again.
if [ -f .fi/flashinfer.tar.xz ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fi/*.whl \
    && tar -xJf .fi/flashinfer.tar.xz -C /tmp/site || exit 1
  # flashinfer.comm's imports (pynvml, cuda-python), where the image lacks them.
  for pair in pynvml:nvidia_ml_py cuda.bindings.driver:cuda_bindings cuda.pathfinder:cuda_pathfinder; do
    python3 -c "import ${pair%%:*}" 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
      --no-compile --target /tmp/site .fi/extra/${pair##*:}-*.whl || exit 1
  done
  # pip dates what it installs now, newer than a carried JIT build's objects: ninja would then
  # rebuild every module that includes tvm_ffi's headers (minutes each, inside the first
  # engine start). Dated back, the carried builds are up to date.
  find /tmp/site/tvm_ffi /tmp/site/flashinfer -exec touch -h -d 2000-01-01 {} +
  export FLASHINFER_WORKSPACE_BASE=/tmp/fi-jit FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
  if ls .fi/fi-jit.tgz.part-* >/dev/null 2>&1; then
    mkdir -p /tmp/fi-jit && cat .fi/fi-jit.tgz.part-* | tar -xzf - -C /tmp/fi-jit
  fi
fi
export OPENINFER_CACHE_DIR=/tmp/openinfer-cache
M4=/tmp/qwen3-4b M8=/tmp/qwen3-8b
python3 - <<'PY'
from openinfer_qwen3.shapes import write_config_folder
write_config_folder("Qwen3-4B", "/tmp/qwen3-4b")
write_config_folder("Qwen3-8B", "/tmp/qwen3-8b")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

for name in $ORDER; do
  if has "$name"; then "stage_$name"; fi
done

stage "summary"
python3 benchmarks/device/summary.py "$OUT"
pack_results  # stages/lib.sh
