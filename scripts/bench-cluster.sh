#!/usr/bin/env bash
# Admission on one Redis node against the local 3-master cluster, the same
# client (`seckill bench`, success path) in the same run, rounds alternating:
#   - one voucher: on the node, then on the cluster (the cost of cluster
#     routing when one master does all the work);
#   - three vouchers, one per master, three benches at once: on the node
#     (three vouchers on the one server), then on the cluster.
# Replicas run too (as in production): on this 2-core machine the six
# cluster nodes, the benches and the node share the cores, so the three-
# voucher figure shows the routing and the spread, not added hardware.
#
#   scripts/bench-cluster.sh [attempts per voucher] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

attempts=${1:-100000}
rounds=${2:-3}
concurrency=${BENCH_CONCURRENCY:-800}
connections=${BENCH_CONNECTIONS:-8}
prefix=benchcl

scripts/services.sh up
scripts/services.sh up cluster
eval "$(scripts/services.sh env)"
node_url=$SECKILL_REDIS_URL
cluster_url=$SECKILL_CLUSTER_URL
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_bench"
cargo build --release --quiet --locked
seckill="target/release/seckill --prefix $prefix"
$seckill init >/dev/null

# Three voucher ids whose slots fall on the three masters (equal thirds of
# the 16384 slots, as `redis-cli --cluster create` splits them).
one_per_master() {
  local found=("" "" "") v=$1 slot third
  while [ -z "${found[0]}" ] || [ -z "${found[1]}" ] || [ -z "${found[2]}" ]; do
    slot=$(redis-cli -p 17001 cluster keyslot "{$v}")
    third=$((slot * 3 / 16384))
    [ -n "${found[$third]}" ] || found[$third]=$v
    v=$((v + 1))
  done
  echo "${found[@]}"
}

next_id=$(( $(date +%s) * 100 ))
fresh_voucher() { # url id: a voucher of `attempts` units (added once), preloaded there
  $seckill voucher list --voucher "$2" --format json 2>/dev/null | grep -q '"id"' ||
    $seckill voucher add --id "$2" --stock "$attempts" --end +2h --title bench >/dev/null
  SECKILL_REDIS_URL=$1 $seckill preload --voucher "$2" >/dev/null
}

bench_three() { # url v1 v2 v3 -> summed attempts/s of three benches at once
  local url=$1 out
  shift
  out=$(for v in "$@"; do bench_rate "$url" "$v" & done; wait)
  echo "$out" | awk '{ s += $1 } END { print s }'
}

# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
trap drop_bench_keys EXIT

echo "attempts per voucher: $attempts, concurrency $concurrency over $connections connections per bench"
printf '| round | 1 voucher: node | 1 voucher: cluster | ratio | 3 vouchers: node | 3 vouchers: cluster | ratio |\n'
printf '|---|---|---|---|---|---|---|\n'
for r in $(seq 1 "$rounds"); do
  read -r a b c <<<"$(one_per_master $((next_id + r * 1000)))"
  for v in "$a" "$b" "$c"; do fresh_voucher "$node_url" "$v"; fresh_voucher "$cluster_url" "$v"; done
  one_node=$(bench_rate "$node_url" "$a")
  one_cluster=$(bench_rate "$cluster_url" "$a")
  # Fresh vouchers for the three-voucher round (the first is sold out).
  read -r a b c <<<"$(one_per_master $((next_id + r * 1000 + 500)))"
  for v in "$a" "$b" "$c"; do fresh_voucher "$node_url" "$v"; fresh_voucher "$cluster_url" "$v"; done
  three_node=$(bench_three "$node_url" "$a" "$b" "$c")
  three_cluster=$(bench_three "$cluster_url" "$a" "$b" "$c")
  printf '| %s | %s | %s | %s%% | %s | %s | %s%% |\n' "$r" "$one_node" "$one_cluster" \
    $((one_cluster * 100 / one_node)) "$three_node" "$three_cluster" $((three_cluster * 100 / three_node))
done
