#!/usr/bin/env bash
# Where Redis spends a drain: one `seckill worker --until-idle` persisting N
# pre-admitted orders, with Redis's per-command counters reset just before
# (INFO commandstats: calls and microseconds, scripts' inner commands
# included). Deterministic call counts; times are for comparing runs.
#
#   scripts/redis-calls.sh [orders]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

n=${1:-50000}
scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
redis_port=$(port_of "$SECKILL_REDIS_URL")
export SECKILL_PREFIX=rediscalls
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_bench"
cargo build --release --quiet --locked
seckill=target/release/seckill
trap 'drop_keys "$redis_port" "rediscalls:*"' EXIT
$seckill init >/dev/null
v=$(($(date +%s) % 100000 + 7000000))
$seckill voucher add --id "$v" --stock "$n" --end +2h --title calls >/dev/null
$seckill preload --voucher "$v" >/dev/null
$seckill bench --voucher "$v" --users "$n" --attempts "$n" --concurrency 256 --connections 8 >/dev/null
redis-cli -p "$redis_port" config resetstat >/dev/null
start=$(date +%s%N)
$seckill -q worker --until-idle --gate-check 0s >/dev/null
echo "drained $n orders in $((($(date +%s%N) - start) / 1000000)) ms"
printf '| command | calls | calls per order | ms |\n|---|---|---|---|\n'
redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_\([a-z|]*\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2 \3/p' | sort -k3 -n -r |
  awk -v n="$n" '{ printf "| %s | %d | %.3f | %.1f |\n", $1, $2, $2 / n, $3 / 1000 }'
