#!/usr/bin/env bash
# Reconciliation read cost: `seckill reconcile --dry-run` over many vouchers,
# and over one voucher with many orders. The data is loaded in bulk (SQL
# multi-row INSERTs, redis-cli --pipe) into a database and key prefix of its
# own, as a consistent gate would hold it.
#
#   scripts/bench-reconcile.sh [vouchers] [orders]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

vouchers=${1:-10000}
orders=${2:-1000000}

scripts/services.sh up
eval "$(scripts/services.sh env)"
port=${SECKILL_MYSQL_PORT:-13306}
redis_port=$(port_of "$SECKILL_REDIS_URL")
export SECKILL_PREFIX=benchrec
export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:${port}/seckill_bench_rec"
cargo build --release --quiet --locked
seckill=target/release/seckill
mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -e "DROP DATABASE IF EXISTS seckill_bench_rec"
$seckill init >/dev/null
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill seckill_bench_rec; }
cleanup() {
  drop_keys "$redis_port" 'benchrec:*'
}
trap cleanup EXIT
cleanup

# Many vouchers, each with 5 pending orders and a gate that matches.
python3 - "$vouchers" <<'PY' | sql
import sys, time
n = int(sys.argv[1]); now = int(time.time())
for start in range(1, n + 1, 2000):
    ids = range(start, min(n, start + 1999) + 1)
    print("INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time, pay_timeout_ms) VALUES "
          + ",".join(f"({v},'bench',10,5,FROM_UNIXTIME({now - 60}),FROM_UNIXTIME({now + 3600}),3600000)" for v in ids) + ";")
    print("INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES "
          + ",".join(f"({v * 10 + u},{u},{v},0,FROM_UNIXTIME({now - 120}))" for v in ids for u in range(1, 6)) + ";")
PY
python3 - "$vouchers" <<'PY' | redis-cli -p "$redis_port" --pipe >/dev/null
import sys, time
n = int(sys.argv[1]); now = int(time.time())
def cmd(*args):
    out = f"*{len(args)}\r\n"
    for a in args:
        a = str(a); out += f"${len(a.encode())}\r\n{a}\r\n"
    sys.stdout.write(out)
for v in range(1, n + 1):
    k = f"benchrec:{{{v}}}"
    cmd("HSET", f"{k}:meta", "total", 10, "begin_ms", (now - 60) * 1000, "end_ms", (now + 3600) * 1000, "pay_timeout_ms", 3600000)
    cmd("SET", f"{k}:stock", 5)
    cmd("SADD", f"{k}:buyers", 1, 2, 3, 4, 5)
    cmd("ZADD", f"{k}:timeouts", *[x for u in range(1, 6) for x in ((now - 120) * 1000 + 3600000, v * 10 + u)])
    cmd("SADD", "benchrec:vouchers", v)
PY
start=$(date +%s.%N)
code=0
$seckill reconcile --dry-run --format json >/tmp/bench-reconcile.json || code=$?
end=$(date +%s.%N)
consistent=$(python3 -c 'import json; print(json.load(open("/tmp/bench-reconcile.json"))["consistent"])')
echo "dry run over $vouchers vouchers: $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') s (exit $code, consistent $consistent)"

# One voucher with many orders (half pending, half paid), a matching gate.
big=$((vouchers + 1))
python3 - "$big" "$orders" <<'PY' | sql
import sys, time
v, n = int(sys.argv[1]), int(sys.argv[2]); now = int(time.time())
print(f"INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time, pay_timeout_ms) VALUES ({v},'big',{n},0,FROM_UNIXTIME({now - 60}),FROM_UNIXTIME({now + 3600}),3600000);")
for start in range(0, n, 10000):
    print("INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES "
          + ",".join(f"({10**12 + i},{i + 1},{v},{i % 2},FROM_UNIXTIME({now - 120}))" for i in range(start, min(n, start + 10000))) + ";")
PY
python3 - "$big" "$orders" <<'PY' | redis-cli -p "$redis_port" --pipe >/dev/null
import sys, time
v, n = int(sys.argv[1]), int(sys.argv[2]); now = int(time.time())
def cmd(*args):
    out = f"*{len(args)}\r\n"
    for a in args:
        a = str(a); out += f"${len(a.encode())}\r\n{a}\r\n"
    sys.stdout.write(out)
k = f"benchrec:{{{v}}}"
cmd("HSET", f"{k}:meta", "total", n, "begin_ms", (now - 60) * 1000, "end_ms", (now + 3600) * 1000, "pay_timeout_ms", 3600000)
cmd("SET", f"{k}:stock", 0)
for start in range(0, n, 1000):
    cmd("SADD", f"{k}:buyers", *range(start + 1, min(n, start + 1000) + 1))
    cmd("ZADD", f"{k}:timeouts", *[x for i in range(start, min(n, start + 1000)) if i % 2 == 0 for x in ((now - 120) * 1000 + 3600000, 10**12 + i)])
cmd("SADD", "benchrec:vouchers", v)
PY
start=$(date +%s.%N)
code=0
$seckill reconcile --dry-run --voucher "$big" --format json >/tmp/bench-reconcile.json || code=$?
end=$(date +%s.%N)
consistent=$(python3 -c 'import json; print(json.load(open("/tmp/bench-reconcile.json"))["consistent"])')
echo "dry run over 1 voucher with $orders orders: $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') s (exit $code, consistent $consistent)"
