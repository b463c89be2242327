#!/usr/bin/env bash
# Run HERE before a device call that needs FlashInfer (the GPU image lacks it): puts into .fi/ a
# trimmed flashinfer-python (its Python package and the headers and sources its attention,
# sampling and all-reduce JIT builds read; the 62 MB wheel does not fit a call beside the repo),
# the apache-tvm-ffi wheel it binds with, and in .fi/extra the wheels flashinfer.comm imports.
# Carry `.fi` too; gpu_check.sh installs them. A user installs
# `pip install 'openinfer-kernels[flashinfer]'` instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
rm -rf .fi /tmp/fi-pack && mkdir -p .fi /tmp/fi-pack/site
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
  -d /tmp/fi-pack "flashinfer-python==$VERSION" "apache-tvm-ffi>=0.1.11,<0.2" \
  2> >(grep -v "^WARNING: Location" >&2)
mv /tmp/fi-pack/apache_tvm_ffi-*.whl .fi/
# What flashinfer.comm imports (the fused all-reduce + norm), installed there only where the
# image lacks it.
mkdir -p .fi/extra
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
  -d .fi/extra nvidia-ml-py "cuda-bindings>=13,<14" cuda-pathfinder \
  2> >(grep -v "^WARNING: Location" >&2)
python3 -m pip install -q --no-deps --no-compile --target /tmp/fi-pack/site /tmp/fi-pack/flashinfer_python-*.whl
cd /tmp/fi-pack/site
keep=(flashinfer/data/include flashinfer/data/spdlog/include flashinfer/data/cutlass/include
      flashinfer/data/cutlass/tools/util/include flashinfer/data/cccl/cub
      flashinfer/data/cccl/libcudacxx/include flashinfer/data/cccl/thrust)
# Python code and dist-info whole; of data/, the headers above and csrc's top-level sources.
{ find flashinfer flashinfer_python-*.dist-info -path flashinfer/data -prune -o -type f -print
  find flashinfer/data -maxdepth 1 -type f
  find flashinfer/data/csrc -maxdepth 1 -type f
  find "${keep[@]}" -type f; } | tar -cf - -T - | xz -T0 -6 > "$OLDPWD/.fi/flashinfer.tar.xz"
cd "$OLDPWD" && rm -rf /tmp/fi-pack && ls -la .fi
