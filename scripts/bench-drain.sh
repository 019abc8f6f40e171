#!/usr/bin/env bash
# Drain throughput of `seckill worker`: orders/s from the stream to committed
# MySQL rows, for 1 and 3 workers at default flags (batches of 256 growing to
# 2048 while a backlog lasts) and at fixed batch sizes 1, 64, 256, 1024
# (--max-batch = --batch), side by side with the ceiling of the same table —
# a bulk load of the same rows with large multi-row INSERTs. Then the peak
# RSS of one worker (default flags) over a long drain.
#
#   scripts/bench-drain.sh [orders] [rss_orders]
#
# orders (default 50000) per case; batch size 1 drains a tenth of them.
# Times are wall clock from starting the workers to the last one exiting
# (--until-idle), so startup and the idle check are included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

orders=${1:-50000}
rss_orders=${2:-100000}

scripts/services.sh up
eval "$(scripts/services.sh env)"
port=${SECKILL_MYSQL_PORT:-13306}
export SECKILL_PREFIX=benchdrain
export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:${port}/seckill_bench"
command -v /usr/bin/time >/dev/null || { [ "$(id -u)" -eq 0 ] && apt-get install -y -qq time >/dev/null; }
cargo build --release --quiet --locked
seckill=target/release/seckill
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -N seckill_bench "$@"; }

mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -e "DROP DATABASE IF EXISTS seckill_bench"
$seckill init >/dev/null
redis_port=$(port_of "$SECKILL_REDIS_URL")
cleanup() {
  drop_keys "$redis_port" 'benchdrain:*'
}
trap cleanup EXIT

fill() { # voucher orders: a preloaded voucher with that many admitted orders in its stream
  $seckill voucher add --id "$1" --stock "$2" --end +2h --title drain >/dev/null
  $seckill preload --voucher "$1" >/dev/null
  $seckill bench --voucher "$1" --users "$2" --attempts "$2" --concurrency 256 --connections 8 --format json >/dev/null
}

now() { date +%s.%N; }

drain() { # voucher workers batch orders -> orders/s (batch "default": the default flags)
  local voucher=$1 workers=$2 batch=$3 n=$4 start end pids=() flags=()
  [ "$batch" = default ] || flags=(--batch "$batch" --max-batch "$batch")
  fill "$voucher" "$n"
  start=$(now)
  for _ in $(seq 1 "$workers"); do
    $seckill -q worker --until-idle "${flags[@]}" --block 200ms >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  end=$(now)
  local stored
  stored=$(sql -e "SELECT COUNT(*) FROM seckill_order WHERE voucher_id = $voucher")
  [ "$stored" = "$n" ] || { echo "voucher $voucher: $stored orders stored, $n expected" >&2; exit 1; }
  awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", n / (e - s) }'
}

ceiling() { # rows -> rows/s of multi-row INSERTs (10,000 rows each) into a copy of seckill_order
  local n=$1 file
  file=$(mktemp)
  sql -e "DROP TABLE IF EXISTS bulk_ceiling; CREATE TABLE bulk_ceiling LIKE seckill_order"
  python3 - "$n" >"$file" <<'PY'
import sys, time
n = int(sys.argv[1]); chunk = 10000; base = int(time.time() * 1000)
for start in range(0, n, chunk):
    rows = ",".join(
        f"({900000000000 + i},{i + 1},424242,0,FROM_UNIXTIME({(base + i) // 1000}.{(base + i) % 1000:03d}))"
        for i in range(start, min(n, start + chunk)))
    print(f"INSERT INTO bulk_ceiling (id, user_id, voucher_id, status, create_time) VALUES {rows};")
PY
  local start end
  start=$(now)
  sql <"$file"
  end=$(now)
  rm -f "$file"
  sql -e "DROP TABLE bulk_ceiling"
  awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", n / (e - s) }'
}

ceil=$(ceiling "$orders")
voucher=0
printf '%-8s %-8s %8s %12s %16s %8s\n' workers batch orders "orders/s" "bulk-load rows/s" ratio
for batch in default 1 64 256 1024; do
  n=$orders
  [ "$batch" = 1 ] && n=$((orders / 10))
  for workers in 1 3; do
    voucher=$((voucher + 1))
    rate=$(drain "$voucher" "$workers" "$batch" "$n")
    printf '%-8s %-8s %8s %12s %16s %7s%%\n' "$workers" "$batch" "$n" "$rate" "$ceil" \
      "$(awk -v r="$rate" -v c="$ceil" 'BEGIN { printf "%.0f", 100 * r / c }')"
  done
done

fill $((voucher + 1)) "$rss_orders"
rss=$( { /usr/bin/time -f '%M' $seckill -q worker --until-idle --block 200ms >/dev/null; } 2>&1 | tail -n 1)
echo "peak RSS of one worker draining $rss_orders orders (default flags): ${rss} KiB"
