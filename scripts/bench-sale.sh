#!/usr/bin/env bash
# A whole sale, twice on the same services in one run: admission alone (no
# worker), then the same sale with one worker (default flags) started
# before it. Prints how long admission took, how long until the last
# admitted order was durable in MySQL, their ratio, and the CPU seconds
# each process spent during the second sale (Redis, MariaDB, the worker,
# the bench). Checks that exactly the admitted orders are in MySQL.
#
#   scripts/bench-sale.sh ATTEMPTS UNITS USERS
#
# e.g. scripts/bench-sale.sh 200000 200000 200000  (every attempt wins)
#      scripts/bench-sale.sh 1000000 100000 500000
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

attempts=${1:?ATTEMPTS}
units=${2:?UNITS}
users=${3:?USERS}
concurrency=${BENCH_CONCURRENCY:-800}
connections=${BENCH_CONNECTIONS:-8}

scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
port=${SECKILL_MYSQL_PORT:-13306}
export SECKILL_PREFIX=benchsale
export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:${port}/seckill_bench"
command -v /usr/bin/time >/dev/null || { [ "$(id -u)" -eq 0 ] && apt-get install -y -qq time >/dev/null; }
cargo build --release --quiet --locked
seckill=target/release/seckill
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -N seckill_bench -e "$1"; }
redis_port=$(port_of "$SECKILL_REDIS_URL")
worker_pid=
cleanup() {
  [ -z "$worker_pid" ] || kill "$worker_pid" 2>/dev/null || true
  drop_keys "$redis_port" 'benchsale:*'
}
trap cleanup EXIT
# A fresh database each run: a table grown by earlier runs makes MariaDB
# slower, and runs would not compare.
mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -e "DROP DATABASE IF EXISTS seckill_bench"
$seckill init >/dev/null

# CPU seconds (user + system) a process has used so far.
cpu() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
redis_pid=$(cat .services/redis/redis.pid)
mysql_pid=$(cat .services/mysql/mysqld.pid)

sale() { # voucher -> bench JSON on stdout, bench CPU seconds in $work/bench.cpu
  /usr/bin/time -f "%U %S" -o "$work/bench.cpu" $seckill bench --voucher "$1" --users "$users" \
    --attempts "$attempts" --concurrency "$concurrency" --connections "$connections" --format json
}
work=$(mktemp -d)
base=$(($(date +%s) * 100 + 50000))

# 1. Admission alone.
a=$((base + 1))
$seckill voucher add --id "$a" --stock "$units" --end +2h --title sale >/dev/null
$seckill preload --voucher "$a" >/dev/null
r0=$(cpu "$redis_pid")
alone=$(sale "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["elapsed_ms"])')
alone_redis=$(awk -v a="$r0" -v b="$(cpu "$redis_pid")" 'BEGIN { printf "%.2f", b - a }')
alone_bench=$(awk '{ printf "%.2f", $1 + $2 }' "$work/bench.cpu")

# Sale 1's orders are never persisted: its voucher goes before a worker
# could see it (left registered, the worker drained it during sale 2).
redis-cli -p "$redis_port" srem "$SECKILL_PREFIX:vouchers" "$a" >/dev/null
drop_keys "$redis_port" "$SECKILL_PREFIX:{$a}:*"

# 2. The same sale with a worker running from before it.
b=$((base + 2))
$seckill voucher add --id "$b" --stock "$units" --end +2h --title sale >/dev/null
$seckill preload --voucher "$b" >/dev/null
$seckill -q worker --consumer bench-sale >/dev/null 2>"$work/worker.log" &
worker_pid=$!
sleep 2 # the worker has found the voucher's stream
r0=$(cpu "$redis_pid"); m0=$(cpu "$mysql_pid"); w0=$(cpu "$worker_pid")
start=$(date +%s%N)
report=$(sale "$b")
won=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["outcomes"]["success"])')
admitted_ms=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["elapsed_ms"])')
# The worker takes MySQL's stock in the transaction that inserts the orders:
# polling one row by its key costs MariaDB nothing (a COUNT(*) every 20 ms
# over a growing table took whole CPU seconds from the sale it measured).
while [ "$(sql "SELECT stock FROM seckill_voucher WHERE voucher_id = $b")" -gt "$((units - won))" ]; do
  sleep 0.02
done
durable_ms=$((($(date +%s%N) - start) / 1000000))
r1=$(cpu "$redis_pid"); m1=$(cpu "$mysql_pid"); w1=$(cpu "$worker_pid")
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=

orders=$(sql "SELECT COUNT(*) FROM seckill_order WHERE voucher_id = $b")
distinct=$(sql "SELECT COUNT(DISTINCT user_id) FROM seckill_order WHERE voucher_id = $b")
[ "$orders" -eq "$won" ] && [ "$distinct" -eq "$won" ] ||
  { echo "MISMATCH: $won admitted, $orders orders ($distinct users) in MySQL" >&2; exit 1; }

echo "sale: $attempts attempts, $units units, $users users ($won won); one worker, default flags"
printf '| admission alone | last order durable (worker running) | ratio |\n|---|---|---|\n'
awk -v a="$alone" -v d="$durable_ms" -v b="$admitted_ms" \
  'BEGIN { printf "| %.2f s | %.2f s (its admission %.2f s) | %.2f |\n", a / 1000, d / 1000, b / 1000, d / a }'
printf '\nCPU seconds:\n| sale | redis | mariadb | worker | bench |\n|---|---|---|---|---|\n'
printf '| admission alone | %s | - | - | %s |\n' "$alone_redis" "$alone_bench"
awk -v r0="$r0" -v r1="$r1" -v m0="$m0" -v m1="$m1" -v w0="$w0" -v w1="$w1" -v b="$(awk '{ print $1 + $2 }' "$work/bench.cpu")" \
  'BEGIN { printf "| with the worker | %.2f | %.2f | %.2f | %.2f |\n", r1 - r0, m1 - m0, w1 - w0, b }'
echo "exactly the $won admitted orders are in MySQL"
rm -rf "$work"
