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

bench_setup seckill_bench_rec benchrec
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
    print("INSERT INTO seckill_voucher (voucher_id, title, total_stock, stock, begin_time, end_time, pay_timeout_ms, orders_total, units_total) VALUES "
          + ",".join(f"({v},'bench',10,5,FROM_UNIXTIME({now - 60}),FROM_UNIXTIME({now + 3600}),3600000,5,5)" for v in ids) + ";")
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
python3 scripts/lib/big_voucher.py sql "$big" 0 "$orders" | sql
python3 scripts/lib/big_voucher.py redis "$big" 0 "$orders" benchrec | redis-cli -p "$redis_port" --pipe >/dev/null
start=$(date +%s.%N)
code=0
$seckill reconcile --dry-run --voucher "$big" --format json >/tmp/bench-reconcile.json || code=$?
end=$(date +%s.%N)
consistent=$(python3 -c 'import json; print(json.load(open("/tmp/bench-reconcile.json"))["consistent"])')
echo "dry run over 1 voucher with $orders orders: $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') s (exit $code, consistent $consistent)"
