#!/usr/bin/env bash
# MySQL's work per gate-guard pass as one voucher's orders grow: MariaDB's
# CPU time (utime + stime of its process) per pass, for
#   - count:    the query the guard ran before schema 5, `SELECT voucher_id,
#               COUNT(*) ... GROUP BY voucher_id`, sent in a loop by one client;
#   - counters: the query it runs now (the voucher row's orders_total), the
#               same way;
#   - worker:   a real `seckill worker --gate-check 50ms` for 10 s, its passes
#               read from its metrics (all of the worker's MySQL work is
#               counted: an upper bound for its guard), less MariaDB's idle
#               CPU over the same time.
# The orders are bulk-loaded (scripts/lib/bench_data.py), growing from one
# size to the next, into a database and key prefix of their own.
#
#   scripts/bench-guard.sh [orders ...]     (default: 10000 1000000 10000000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10000 1000000 10000000)

bench_setup seckill_bench_guard benchguard
export BIG_VOUCHER_NOW
BIG_VOUCHER_NOW=$(date +%s)
client() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill "$@"; }
sql() { client seckill_bench_guard; }
metrics_port=19464
worker_pid=
cleanup() {
  [ -z "$worker_pid" ] || kill "$worker_pid" 2>/dev/null || true
  drop_keys "$redis_port" 'benchguard:*'
  client -e "DROP DATABASE IF EXISTS seckill_bench_guard" 2>/dev/null || true
}
trap cleanup EXIT
drop_keys "$redis_port" 'benchguard:*'

# MariaDB's own process: the one whose pid file the server names.
mysqld_pid=$(cat "$(client -N -e 'SELECT @@pid_file')")
ticks=$(getconf CLK_TCK)
cpu_ms() { awk -v t="$ticks" '{ printf "%d", ($14 + $15) * 1000 / t }' "/proc/$mysqld_pid/stat"; }

# query n -> ms of MariaDB CPU per query, the query sent n times by one client.
per_query() {
  local q=$1 n=$2 before after
  before=$(cpu_ms)
  for _ in $(seq "$n"); do echo "$q;"; done | sql >/dev/null
  after=$(cpu_ms)
  awk -v d="$((after - before))" -v n="$n" 'BEGIN { printf "%.3f", d / n }'
}

passes() {
  curl -s "http://127.0.0.1:$metrics_port/metrics" |
    awk '$1 == "seckill_gate_guard_passes_total" { print $2 }'
}

printf '%-12s %14s %14s %14s %10s %12s\n' orders "count ms/pass" "counters ms/q" "worker ms/pass" passes "count/worker"
loaded=0
for n in "${sizes[@]}"; do
  python3 scripts/lib/bench_data.py big-sql 1 "$loaded" "$n" | sql
  python3 scripts/lib/bench_data.py big-redis 1 "$loaded" "$n" benchguard |
    redis-cli -p "$redis_port" --pipe >/dev/null
  loaded=$n
  client seckill_bench_guard -e "ANALYZE TABLE seckill_order" >/dev/null
  # Fewer rounds of the old query where each one scans millions.
  rounds=$((2000000 / n))
  [ "$rounds" -ge 5 ] || rounds=5
  [ "$rounds" -le 200 ] || rounds=200
  count=$(per_query "SELECT voucher_id, COUNT(*) FROM seckill_order WHERE voucher_id IN (1) GROUP BY voucher_id" "$rounds")
  counters=$(per_query "SELECT voucher_id, orders_total FROM seckill_voucher WHERE voucher_id IN (1) AND orders_total > 0" 2000)

  idle_before=$(cpu_ms)
  sleep 10
  idle=$(($(cpu_ms) - idle_before))
  $seckill worker --gate-check 50ms --metrics-addr "127.0.0.1:$metrics_port" >/tmp/bench-guard-worker.log 2>&1 &
  worker_pid=$!
  until [ -n "$(passes 2>/dev/null)" ]; do sleep 0.2; done
  p0=$(passes)
  c0=$(cpu_ms)
  sleep 10
  c1=$(cpu_ms)
  p1=$(passes)
  kill "$worker_pid"
  wait "$worker_pid" || true
  worker_pid=
  if grep -q " WARN .*paus" /tmp/bench-guard-worker.log; then
    echo "the guard paused the gate: the load is not consistent (see /tmp/bench-guard-worker.log)" >&2
    exit 1
  fi
  worker=$(awk -v d="$((c1 - c0 - idle))" -v p="$((p1 - p0))" 'BEGIN { if (d < 0) d = 0; printf "%.3f", d / p }')
  ratio=$(awk -v a="$count" -v b="$worker" 'BEGIN { if (b > 0) printf "%.0fx", a / b; else print "-" }')
  printf '%-12s %14s %14s %14s %10s %12s\n' "$n" "$count" "$counters" "$worker" "$((p1 - p0))" "$ratio"
done
echo "(MariaDB CPU in ms; the machine is shared: compare within one run. A worker's pass also runs"
echo " its deadline sweep and the rest of its MySQL work, so 'worker' is an upper bound for the guard.)"
