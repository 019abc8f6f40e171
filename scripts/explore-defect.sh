#!/usr/bin/env bash
# A past defect put back, explored: design/defects/<ID>.patch (the fix
# reverted, or a mutation equivalent to it) applied to a scratch worktree
# of HEAD, built there, and scripts/explore.sh run on it with the rest of
# the arguments.
#
#   scripts/explore-defect.sh E29 --seed 10          does seed 10 catch E29?
#   scripts/explore-defect.sh E29 --minutes 10       fresh seeds for 10 minutes
#
# The worktree is /tmp/seckill-defect (removed at the end); it builds
# in target/defects (first made as a copy of target/debug). Exit as
# scripts/explore.sh does: 1 means the explorer caught the defect.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

id="${1:-}"
[ -n "$id" ] && [ -f "design/defects/$id.patch" ] || {
  echo "explore-defect.sh: name a defect with a patch in design/defects/ (e.g. E29), not '${id}'" >&2
  exit 2
}
shift
# One fixed place: a defect after another rebuilds only what its patch
# touches (run one at a time).
tree="/tmp/seckill-defect"
git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"
git worktree add --detach "$tree" HEAD >/dev/null
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$tree" apply "$PWD/design/defects/$id.patch"
echo "explore-defect.sh: $id put back in $tree" >&2
# The services are this checkout's (the worktree has no .services of its own).
scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
export SECKILL_SERVICES_DIR="${SECKILL_SERVICES_DIR:-$PWD/.services}"
# A target folder of its own (a build there must not replace this
# checkout's binary), started as a copy of this one's so only seckill
# itself is built again.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/defects}"
if [ ! -d "$CARGO_TARGET_DIR/debug" ] && [ -d target/debug ]; then
  mkdir -p "$CARGO_TARGET_DIR"
  cp -a --reflink=auto target/debug "$CARGO_TARGET_DIR/debug"
fi
cd "$tree"
set +e
scripts/explore.sh "$@"
rc=$?
set -e
exit $rc
