#!/usr/bin/env bash
# One hash of every package's source files, by content (the same on this machine and the GPU
# machine, which gets a copy of the tree without git): prepare.sh stores it with the wheels,
# gpu_check.sh compares.
cd "$(dirname "$0")/../.."
find packages -path '*/src/*' -type f \( -name '*.py' -o -name '*.json' -o -name '*.jinja' \) \
  -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16
