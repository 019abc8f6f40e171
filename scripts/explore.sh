#!/usr/bin/env bash
# The fault explorer (tests/explore/): seeded sales, workloads and fault
# schedules played against the real binary and real servers, each checked
# by an oracle once every fault healed.
#
#   scripts/explore.sh --seed N              one seed (a replay)
#   scripts/explore.sh --seed N --count K    seeds N .. N+K-1
#   scripts/explore.sh --minutes M           fresh random seeds for M minutes
#   scripts/explore.sh --seeds 14,23,42      these seeds, in this order
#   scripts/explore.sh --seed N --faults 0,2 seed N with only those faults
#   --no-shrink                              report a violation unshrunk
#   --until-caught                           stop at the first violation (measuring a defect)
#   --report                                 the history of every seed, not only of violations
#
# Exit 0 when no invariant was violated, 1 otherwise, 2 on bad usage. The
# last line sums up: `explore: K seeds, F faults, V violations, S s`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
number() {
  [[ "$2" =~ ^[0-9]+$ ]] || { echo "explore.sh: $1 needs a number, not '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) number "$1" "${2:-}"; export SECKILL_EXPLORE_SEED="$2"; shift 2 ;;
    --count) number "$1" "${2:-}"; export SECKILL_EXPLORE_COUNT="$2"; shift 2 ;;
    --minutes) number "$1" "${2:-}"; export SECKILL_EXPLORE_MINUTES="$2"; shift 2 ;;
    --seeds)
      [[ "${2:-}" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "explore.sh: --seeds needs seeds like 14,23, not '${2:-}'" >&2; exit 2; }
      export SECKILL_EXPLORE_SEEDS="$2"; shift 2 ;;
    --faults)
      [[ "${2:-}" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "explore.sh: --faults needs indices like 0,2, not '${2:-}'" >&2; exit 2; }
      export SECKILL_EXPLORE_FAULTS="$2"; shift 2 ;;
    --no-shrink) export SECKILL_EXPLORE_SHRINK=0; shift ;;
    --until-caught) export SECKILL_EXPLORE_UNTIL_CAUGHT=1; shift ;;
    --report) export SECKILL_EXPLORE_REPORT=1; shift ;;
    -h|--help) usage ;;
    *) echo "explore.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
# Only what a run uses (the binary and this test): every other test target
# would be built again for each defect explore-defect.sh puts back.
cargo build --locked --quiet --bin seckill --test explore
exec cargo test --locked --quiet --test explore -- --ignored --exact explore --nocapture
