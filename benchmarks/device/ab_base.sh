#!/usr/bin/env bash
# Run HERE before a device call with gpu_check.sh's `ab` or `basetests` stage: puts into .ab-base/
# the openinfer wheels of COMMIT (default: main's), the baseline `ab` times this tree against, and
# COMMIT's test files (tree.tar), which `basetests` runs on those wheels.
set -euo pipefail
cd "$(dirname "$0")/../.."
commit=${1:-main}
tree=$(mktemp -d)
git worktree add -q --detach "$tree" "$commit"
rm -rf .ab-base && mkdir .ab-base
(cd "$tree" && uv build -q --all-packages --wheel -o "$OLDPWD/.ab-base")
git -C "$tree" archive -o "$OLDPWD/.ab-base/tree.tar" HEAD conftest.py pyproject.toml tests \
  $(cd "$tree" && ls -d packages/*/tests)
git worktree remove --force "$tree"
git rev-parse --short "$commit" > .ab-base/COMMIT
ls .ab-base
