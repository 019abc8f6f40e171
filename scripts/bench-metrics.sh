#!/usr/bin/env bash
# What a scrape of the worker's /metrics costs as vouchers grow: the page
# reads every registered voucher's gate and streams from Redis at each
# scrape. N vouchers are bulk-loaded (scripts/lib/bench_data.py, each with
# an order stream of one acknowledged-or-pending entry and the worker's
# group), a worker runs with --metrics-addr, and the page is fetched five
# times; the fastest and slowest are printed beside Prometheus's default
# scrape timeout (10 s).
#
#   scripts/bench-metrics.sh [vouchers ...]   (default: 1000 10000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000 10000)

bench_setup seckill_bench_metrics benchmet
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill seckill_bench_metrics; }
metrics_port=19466
worker_pid=
cleanup() {
  [ -z "$worker_pid" ] || kill "$worker_pid" 2>/dev/null || true
  drop_keys "$redis_port" 'benchmet:*'
}
trap cleanup EXIT

printf '| vouchers | fastest scrape | slowest | per voucher | page bytes |\n|---|---|---|---|---|\n'
for n in "${sizes[@]}"; do
  cleanup
  worker_pid=
  sql <<<"DELETE FROM seckill_order; DELETE FROM seckill_voucher;"
  python3 scripts/lib/bench_data.py many-sql "$n" | sql
  python3 scripts/lib/bench_data.py many-redis "$n" "$SECKILL_PREFIX" | redis-cli -p "$redis_port" --pipe >/dev/null
  python3 scripts/lib/bench_data.py many-streams "$n" "$SECKILL_PREFIX" | redis-cli -p "$redis_port" --pipe >/dev/null
  $seckill worker --metrics-addr "127.0.0.1:$metrics_port" -q >/dev/null &
  worker_pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$metrics_port/metrics" >/dev/null 2>&1 && break
    sleep 0.1
  done
  times=$(for _ in 1 2 3 4 5; do
    curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$metrics_port/metrics"
  done | sort -n)
  bytes=$(curl -s "http://127.0.0.1:$metrics_port/metrics" | wc -c)
  fastest=$(echo "$times" | head -n 1)
  slowest=$(echo "$times" | tail -n 1)
  per=$(python3 -c "print(f'{$fastest / $n * 1e6:.0f} us')")
  printf '| %s | %s s | %s s | %s | %s |\n' "$n" "$fastest" "$slowest" "$per" "$bytes"
  kill "$worker_pid" 2>/dev/null || true
  wait "$worker_pid" 2>/dev/null || true
  worker_pid=
done
