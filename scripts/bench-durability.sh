#!/usr/bin/env bash
# What a durable success costs at the gate, side by side with the default in
# the same run (rounds alternate so a noisy neighbour hits all alike):
#   - the single node with `appendfsync always` (every admission fsynced
#     before its reply) against `everysec` (the default here);
#   - the local cluster, one voucher, with `bench --wait-replicas 1` (Redis
#     WAIT for the master's replica after each success) against no wait.
# seckill bench, success path, fresh voucher per figure.
#
#   scripts/bench-durability.sh [attempts] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

attempts=${1:-50000}
rounds=${2:-3}
concurrency=${BENCH_CONCURRENCY:-800}
connections=${BENCH_CONNECTIONS:-8}
prefix=benchdur

scripts/services.sh up
scripts/services.sh up cluster
eval "$(scripts/services.sh env)"
node_url=$SECKILL_REDIS_URL
node_port=$(port_of "$node_url")
cluster_url=$SECKILL_CLUSTER_URL
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_bench"
cargo build --release --quiet --locked
seckill="target/release/seckill --prefix $prefix"
$seckill init >/dev/null

base_id=$(( $(date +%s) * 100 + 70000 ))
fresh_voucher() { # url id: a new voucher of `attempts` units, preloaded there
  $seckill voucher add --id "$2" --stock "$attempts" --end +2h --title bench >/dev/null
  SECKILL_REDIS_URL=$1 $seckill preload --voucher "$2" >/dev/null
}

# What the server ran with before (scripts/services.sh: always), put back
# after each round and at the end.
fsync_before=$(redis-cli -p "$node_port" config get appendfsync | tail -n 1)
cleanup() {
  redis-cli -p "$node_port" config set appendfsync "$fsync_before" >/dev/null
  drop_bench_keys
}
trap cleanup EXIT

echo "attempts: $attempts, concurrency $concurrency over $connections connections"
printf '| round | node everysec | node always | ratio | cluster no wait | cluster WAIT 1 | ratio |\n'
printf '|---|---|---|---|---|---|---|\n'
for r in $(seq 1 "$rounds"); do
  v=$((base_id + r * 10))
  fresh_voucher "$node_url" $((v + 1))
  fresh_voucher "$node_url" $((v + 2))
  fresh_voucher "$cluster_url" $((v + 3))
  fresh_voucher "$cluster_url" $((v + 4))
  redis-cli -p "$node_port" config set appendfsync everysec >/dev/null
  everysec=$(bench_rate "$node_url" $((v + 1)))
  redis-cli -p "$node_port" config set appendfsync always >/dev/null
  always=$(bench_rate "$node_url" $((v + 2)))
  redis-cli -p "$node_port" config set appendfsync "$fsync_before" >/dev/null
  nowait=$(bench_rate "$cluster_url" $((v + 3)))
  wait1=$(bench_rate "$cluster_url" $((v + 4)) --wait-replicas 1)
  printf '| %s | %s | %s | %s%% | %s | %s | %s%% |\n' "$r" "$everysec" "$always" \
    $((always * 100 / everysec)) "$nowait" "$wait1" $((wait1 * 100 / nowait))
done
