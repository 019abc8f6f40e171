#!/usr/bin/env bash
# Admission throughput: `seckill bench` side by side with redis-benchmark
# sending EVALSHA of the same script to the same server (the ceiling), for
# the success path and the sold-out path. Rounds alternate the two so a
# noisy neighbour hits both alike; the figure to quote is the ratio.
# Then the admission policy: the success path with no policy, with a user
# rate (--user-rate 100: every attempt checked, none refused) and with
# tokens required (bench --tokens; issuing them is timed apart), in one run.
# Then quantities: 1 unit, 1-3 units, and the sold-out path with the
# waitlist full (read-only) beside the ordinary one.
#
#   scripts/bench-admission.sh [attempts] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

attempts=${1:-200000}
rounds=${2:-3}
clients=${BENCH_CLIENTS:-50}
pipeline=${BENCH_PIPELINE:-16}
concurrency=${BENCH_CONCURRENCY:-800}
connections=${BENCH_CONNECTIONS:-8}
prefix=benchadm

scripts/services.sh up
eval "$(scripts/services.sh env)"
port=$(port_of "$SECKILL_REDIS_URL")
# The bench's vouchers live in a database of their own, not the default one.
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_bench"
cargo build --release --quiet --locked
seckill="target/release/seckill --prefix $prefix"
$seckill init >/dev/null

sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/seckill.lua)")
next_id=$(( $(date +%s) * 100 ))

fresh_voucher() { # id stock [policy flags...]: a new voucher, preloaded
  local id=$1 stock=$2
  shift 2
  $seckill voucher add --id "$id" --stock "$stock" --end +2h --title bench "$@" >/dev/null
  $seckill preload --voucher "$id" >/dev/null
}

ceiling() { # voucher -> requests/s of redis-benchmark
  local v=$1 k="$prefix:{$1}"
  redis-benchmark -p "$port" -n "$attempts" -c "$clients" -P "$pipeline" -r 1000000000 --csv \
    EVALSHA "$sha" 5 "$k:meta" "$k:stock" "$k:buyers" "$k:waitlist" "$k:orders" \
    1__rand_int__ 2__rand_int__ "$v" 2>/dev/null | tail -n 1 | cut -d, -f2 | tr -d '"'
}

ours() { # voucher [bench flags...] -> attempts/s of seckill bench
  local v=$1
  shift
  $seckill bench --voucher "$v" --users "$attempts" --attempts "$attempts" \
    --concurrency "$concurrency" --connections "$connections" --format json "$@" |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["attempts_per_sec"]))'
}

cleanup() { # drop the bench's keys so repeated runs do not grow Redis
  drop_keys "$port" "$prefix:*"
}
trap cleanup EXIT

printf '%-9s %5s %14s %16s %7s\n' path round "seckill/s" "redis-bench/s" ratio
for path in success sold_out; do
  stock=0
  [ "$path" = success ] && stock=$((attempts * 2))
  for r in $(seq 1 "$rounds"); do
    fresh_voucher $((next_id += 1)) "$stock"
    c=$(ceiling "$next_id")
    fresh_voucher $((next_id += 1)) "$stock"
    o=$(ours "$next_id")
    printf '%-9s %5s %14s %16.0f %6s%%\n' "$path" "$r" "$o" "$c" "$(awk -v o="$o" -v c="$c" 'BEGIN { printf "%.0f", 100 * o / c }')"
    cleanup
  done
done
echo "(seckill bench: --concurrency $concurrency --connections $connections; redis-benchmark: -c $clients -P $pipeline; $attempts attempts each)"

echo
printf '%-14s %5s %14s %8s\n' policy round "seckill/s" "vs off"
for r in $(seq 1 "$rounds"); do
  fresh_voucher $((next_id += 1)) $((attempts * 2))
  off=$(ours "$next_id")
  fresh_voucher $((next_id += 1)) $((attempts * 2)) --user-rate 100
  rate=$(ours "$next_id")
  fresh_voucher $((next_id += 1)) $((attempts * 2)) --require-token
  tokens=$(ours "$next_id" --tokens)
  for row in "off $off" "user-rate $rate" "tokens $tokens"; do
    set -- $row
    printf '%-14s %5s %14s %7s%%\n' "$1" "$r" "$2" "$(awk -v o="$2" -v c="$off" 'BEGIN { printf "%.0f", 100 * o / c }')"
  done
  cleanup
done

# Quantities in the same run: the success path asking 1 unit (as above),
# asking 1-3 (a per-user limit of 3, a quantity drawn per attempt), and
# the losing path with the waitlist full (--waitlist-limit 0: read-only)
# beside the ordinary sold-out path (each loser joins the waitlist).
echo
printf '%-22s %5s %14s %8s\n' quantities round "seckill/s" "vs base"
for r in $(seq 1 "$rounds"); do
  fresh_voucher $((next_id += 1)) $((attempts * 2))
  one=$(ours "$next_id")
  fresh_voucher $((next_id += 1)) $((attempts * 4)) --per-user-limit 3
  mixed=$(ours "$next_id" --quantity 1-3)
  fresh_voucher $((next_id += 1)) 0
  waitlisted=$(ours "$next_id")
  fresh_voucher $((next_id += 1)) 0 --waitlist-limit 0
  full=$(ours "$next_id")
  for row in "quantity-1 $one $one" "quantity-1-3 $mixed $one" "sold-out-waitlisted $waitlisted $waitlisted" "sold-out-waitlist-full $full $waitlisted"; do
    set -- $row
    printf '%-22s %5s %14s %7s%%\n' "$1" "$r" "$2" "$(awk -v o="$2" -v c="$3" 'BEGIN { printf "%.0f", 100 * o / c }')"
  done
  cleanup
done
echo "(vs base: quantity rows against quantity-1, sold-out rows against sold-out-waitlisted, same round)"
