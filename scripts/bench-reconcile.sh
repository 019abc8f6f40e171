#!/usr/bin/env bash
# Reconciliation read cost: `seckill reconcile --dry-run` over many vouchers,
# and over one voucher as its orders grow, each both ways: the quick look
# (counts and digests) and --deep (every order, buyer, release and deadline
# read). The data is loaded in bulk (scripts/lib/bench_data.py: SQL
# multi-row INSERTs, redis-cli --pipe) into a database and key prefix of its
# own, as a consistent gate would hold it. Then what the big voucher's gate
# costs Redis: MEMORY USAGE of its buyers set and deadlines per member.
#
#   scripts/bench-reconcile.sh [vouchers] [orders ...]
#                              (default: 10000, then 1000000 10000000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

vouchers=${1:-10000}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1000000 10000000)

bench_setup seckill_bench_rec benchrec
export BIG_VOUCHER_NOW
BIG_VOUCHER_NOW=$(date +%s)
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill seckill_bench_rec; }
data() { python3 scripts/lib/bench_data.py "$@"; }
cleanup() {
  drop_keys "$redis_port" 'benchrec:*'
}
trap cleanup EXIT
cleanup

# [reconcile flags...] -> the fastest of three runs, as timed prints one
quick() {
  local runs
  runs=$(for _ in 1 2 3; do timed "$@"; done | sort -n)
  echo "$runs" | head -n 1
}

# [reconcile flags...] -> "<seconds> s (exit <code>, consistent <c>, read <kinds>)"
timed() {
  local start end code=0
  start=$(date +%s.%N)
  $seckill reconcile --dry-run --format json "$@" >/tmp/bench-reconcile.json || code=$?
  end=$(date +%s.%N)
  python3 - "$start" "$end" "$code" <<'PY'
import json, sys
start, end, code = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
r = json.load(open("/tmp/bench-reconcile.json"))
kinds = sorted({v["read"] for v in r["vouchers"]})
print(f"{end - start:7.2f} s (exit {code}, consistent {r['consistent']}, read {'/'.join(kinds)})")
PY
}

data many-sql "$vouchers" | sql
data many-redis "$vouchers" benchrec | redis-cli -p "$redis_port" --pipe >/dev/null
printf '%-34s %-52s %s\n' "" "quick look (fastest of 3)" "--deep"
printf '%-34s %-52s %s\n' "$vouchers vouchers of 5 orders" "$(quick)" "$(timed --deep)"

big=$((vouchers + 1))
loaded=0
for n in "${sizes[@]}"; do
  data big-sql "$big" "$loaded" "$n" | sql
  data big-redis "$big" "$loaded" "$n" benchrec | redis-cli -p "$redis_port" --pipe >/dev/null
  loaded=$n
  printf '%-34s %-52s %s\n' "1 voucher of $n orders" "$(quick --voucher "$big")" "$(timed --voucher "$big" --deep)"
done

# Redis's memory for the big gate, per member (SAMPLES 0: every element).
for key in buyers timeouts; do
  bytes=$(redis-cli -p "$redis_port" memory usage "benchrec:{$big}:$key" samples 0)
  case $key in
    buyers) members=$(redis-cli -p "$redis_port" scard "benchrec:{$big}:$key") ;;
    *) members=$(redis-cli -p "$redis_port" zcard "benchrec:{$big}:$key") ;;
  esac
  awk -v k="$key" -v b="$bytes" -v m="$members" \
    'BEGIN { printf "redis %-8s %10d members %12d bytes %6.1f bytes each\n", k, m, b, b / m }'
done
