#!/usr/bin/env bash
# How long a voucher's gate stays open on a MySQL that lost its last
# commits, and how long it is paused while the worker restores them: a
# voucher sells N orders, MySQL is dumped, N more are sold and persisted,
# and MySQL is switched back to the dump in one step (every table swapped
# by one RENAME, as a failover to a replica switches). A running
# `seckill worker --gate-check G` pauses the gate, restores the N lost
# orders from the kept stream entries and reopens it; the times come from
# its log (its own clock) against the moment just before the RENAME was sent.
#
#   scripts/bench-mysql-loss.sh [orders ...]   (default: 1000 10000 100000)
#   GATE_CHECK=1s (the worker's default) unless set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000 10000 100000)
gate_check=${GATE_CHECK:-1s}
db=seckill_bench_loss
bench_setup "$db" benchloss
client() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill "$@"; }
worker_pid=
log=$(mktemp)
cleanup() {
  [ -z "$worker_pid" ] || kill "$worker_pid" 2>/dev/null || true
  drop_keys "$redis_port" 'benchloss:*'
  client -e "DROP DATABASE IF EXISTS $db; DROP DATABASE IF EXISTS ${db}_dump" 2>/dev/null || true
  rm -f "$log"
}
trap cleanup EXIT

orders() { client -N "$db" -e "SELECT COUNT(*) FROM seckill_order"; }
wait_orders() { until [ "$(orders)" -ge "$1" ]; do sleep 0.1; done; }
# The log line's time (RFC 3339, UTC) of the first line matching $1, in ms.
log_ms() {
  grep -m1 "$1" "$log" | cut -d' ' -f1 |
    python3 -c 'import sys,datetime; t=sys.stdin.read().strip(); print(int(datetime.datetime.fromisoformat(t.replace("Z","+00:00")).timestamp()*1000))'
}

printf '%-10s %12s %14s %14s %16s\n' "lost" "gate-check" "to pause ms" "to reopen ms" "paused for ms"
v=0
for n in "${sizes[@]}"; do
  v=$((v + 1))
  drop_keys "$redis_port" 'benchloss:*'
  client -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db"
  $seckill init >/dev/null
  $seckill voucher add --id "$v" --stock $((2 * n)) --pay-timeout 1h >/dev/null
  $seckill preload --voucher "$v" >/dev/null
  : >"$log"
  RUST_LOG=seckill=info NO_COLOR=1 $seckill worker --gate-check "$gate_check" 2>"$log" >/dev/null &
  worker_pid=$!
  $seckill bench --voucher "$v" --users "$n" --attempts "$n" >/dev/null
  wait_orders "$n"
  client -e "DROP DATABASE IF EXISTS ${db}_dump; CREATE DATABASE ${db}_dump"
  mariadb-dump --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill "$db" | client "${db}_dump"
  $seckill bench --voucher "$v" --users "$n" --user-offset "$n" --attempts "$n" >/dev/null
  wait_orders $((2 * n))
  swaps=$(client -N -e "SHOW TABLES FROM ${db}_dump" |
    awk -v a="$db" -v b="${db}_dump" '{ printf "%s%s.%s TO %s.%s_gone, %s.%s TO %s.%s, %s.%s_gone TO %s.%s", (NR > 1 ? ", " : ""), a, $1, b, $1, b, $1, a, $1, b, $1, b, $1 }')
  # Taken before the switch: the times below include the client's start.
  t0=$(python3 -c 'import time; print(int(time.time()*1000))')
  client -e "RENAME TABLE $swaps"
  until grep -q "reopened" "$log"; do sleep 0.05; done
  paused=$(log_ms "MySQL lost commits")
  reopened=$(log_ms "reopened")
  [ "$(orders)" -eq $((2 * n)) ] || { echo "orders not restored: $(orders)" >&2; exit 1; }
  kill "$worker_pid"
  wait "$worker_pid" 2>/dev/null || true
  worker_pid=
  printf '%-10s %12s %14d %14d %16d\n' "$n" "$gate_check" $((paused - t0)) $((reopened - t0)) $((reopened - paused))
done
echo "(to pause: up to one --gate-check after the switch, plus a pass; paused for: reading the kept entries, the restore's transaction, a fresh read)"
