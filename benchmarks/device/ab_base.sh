#!/usr/bin/env bash
# Run HERE before a device call with gpu_check.sh's `ab` stage: puts into .ab-base/ the openinfer
# wheels of COMMIT (default: main's), the baseline that stage times this tree against.
set -euo pipefail
cd "$(dirname "$0")/../.."
commit=${1:-main}
tree=$(mktemp -d)
git worktree add -q --detach "$tree" "$commit"
rm -rf .ab-base && mkdir .ab-base
(cd "$tree" && uv build -q --all-packages --wheel -o "$OLDPWD/.ab-base")
git worktree remove --force "$tree"
git rev-parse --short "$commit" > .ab-base/COMMIT
ls .ab-base
