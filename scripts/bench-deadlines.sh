#!/usr/bin/env bash
# Payment deadlines at scale: N orders whose deadlines fall within a fraction
# of a second of each other, none paid. Reports how fast one worker cancels
# them and gives the units back (orders/s from the first deadline to the
# last cancellation) and the worst lateness (deadline -> cancellation commit).
#
#   scripts/bench-deadlines.sh [orders] [pay_timeout]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

orders=${1:-10000}
timeout=${2:-5s}

scripts/services.sh up
eval "$(scripts/services.sh env)"
port=${SECKILL_MYSQL_PORT:-13306}
export SECKILL_PREFIX=benchdl
export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:${port}/seckill_bench"
cargo build --release --quiet --locked
seckill=target/release/seckill
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -N seckill_bench -e "$1"; }
$seckill init >/dev/null
redis_port=$(port_of "$SECKILL_REDIS_URL")
summary=$(mktemp)
cleanup() {
  drop_keys "$redis_port" 'benchdl:*'
  rm -f "$summary"
}
trap cleanup EXIT

voucher=$(date +%s)
$seckill voucher add --id "$voucher" --stock "$orders" --end +1h --pay-timeout "$timeout" --title deadlines >/dev/null
$seckill preload --voucher "$voucher" >/dev/null
$seckill -q worker --batch 1024 --format json >"$summary" &
worker=$!
$seckill bench --voucher "$voucher" --users "$orders" --attempts "$orders" --concurrency 256 --connections 8 --format json >/dev/null
while [ "$(sql "SELECT COUNT(*) FROM seckill_order WHERE voucher_id = $voucher AND status = -1")" != "$orders" ]; do
  sleep 0.2
done
kill -TERM "$worker"
wait "$worker"

read -r spread span <<<"$(sql "SELECT
    TIMESTAMPDIFF(MICROSECOND, MIN(create_time), MAX(create_time)) / 1000,
    TIMESTAMPDIFF(MICROSECOND, MIN(create_time) + INTERVAL (SELECT pay_timeout_ms FROM seckill_voucher WHERE voucher_id = $voucher) * 1000 MICROSECOND, MAX(cancel_time)) / 1000
  FROM seckill_order WHERE voucher_id = $voucher")"
gate=$(redis-cli -p "$redis_port" get "benchdl:{$voucher}:stock")
python3 - "$summary" "$orders" "$spread" "$span" "$gate" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
n, spread, span, gate = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
print(f"orders expiring together        {n} (deadlines spread over {spread:.0f} ms)")
print(f"cancelled / units given back    {s['cancelled']} / {s['released']} (gate stock now {gate})")
print(f"first deadline -> last cancel   {span:.0f} ms")
print(f"releases per second             {n / max(span, 1) * 1000:.0f}")
print(f"worst lateness                  {s['max_lateness_ms']} ms (deadline -> cancellation commit)")
PY
