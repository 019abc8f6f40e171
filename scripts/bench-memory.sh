#!/usr/bin/env bash
# What a big sale costs Redis: bytes per member of each per-voucher key that
# grows with the sale (MEMORY USAGE ... SAMPLES 0, every element counted),
# shaped as the scripts write them, and how long dropping such a key holds
# Redis: DEL (what an expiry or an overwrite does without lazy freeing)
# against UNLINK (freed in a background thread).
#
#   scripts/bench-memory.sh [members]   (default 1000000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

n=${1:-1000000}
scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
redis_port=$(port_of "$SECKILL_REDIS_URL")
cli() { redis-cli -p "$redis_port" "$@"; }
cleanup() { drop_keys "$redis_port" 'benchmem:*'; }
trap cleanup EXIT
cleanup

# kind -> the Redis protocol that fills benchmem:{1}:<kind> with n members
python3 - "$n" <<'PY' | cli --pipe >/dev/null
import sys, time
n = int(sys.argv[1])
now_us = int(time.time() * 1e6)
def cmd(*args):
    parts = [f"*{len(args)}\r\n"]
    for a in args:
        a = str(a); parts.append(f"${len(a.encode())}\r\n{a}\r\n")
    sys.stdout.write("".join(parts))
k = "benchmem:{1}"
for first in range(1, n + 1, 1000):
    users = range(first, min(n, first + 999) + 1)
    # buyers: user ids, as seckill.lua's SADD.
    cmd("SADD", f"{k}:buyers", *users)
    # waitlist: user -> first queued time in microseconds.
    cmd("ZADD", f"{k}:waitlist", *[x for u in users for x in (now_us + u, u)])
    # timeouts: snowflake-sized order id -> deadline in ms.
    cmd("ZADD", f"{k}:timeouts", *[x for u in users for x in (now_us // 1000 + 900000, 914906043543195648 + u)])
    # locks: user -> "<expires_ms> <count> <owner token>" (lua/lib/lease.lua).
    cmd("HSET", f"{k}:locks", *[x for u in users for x in (u, f"{now_us // 1000 + 30000} 1 vm-12345-7f3a9c2e41d05b66")])
    # rate: user -> one passing attempt (16-digit µs), a user rate of 1.
    cmd("HSET", f"{k}:rate", *[x for u in users for x in (u, now_us + u)])
    # released: cancelled order ids.
    cmd("SADD", f"{k}:released", *[914906043543195648 + u for u in users])
for u in range(1, n + 1):
    # orders: one entry per admission, as seckill.lua appends it.
    cmd("XADD", f"{k}:orders", "*", "user", u, "order", 914906043543195648 + u, "voucher", 1, "kind", "admit")
PY

slower_than=$(cli config get slowlog-log-slower-than | sed -n 2p)
printf '%-10s %10s %14s %12s %12s %12s\n' key members bytes "bytes each" "DEL ms" "UNLINK ms"
for key in buyers waitlist timeouts released locks rate orders; do
  full="benchmem:{1}:$key"
  bytes=$(cli memory usage "$full" samples 0)
  case $key in
    buyers | released) members=$(cli scard "$full") ;;
    waitlist | timeouts) members=$(cli zcard "$full") ;;
    locks | rate) members=$(cli hlen "$full") ;;
    orders) members=$(cli xlen "$full") ;;
  esac
  # Two copies: one dropped each way; the time is the command's own, from
  # SLOWLOG (microseconds Redis spent in it), not the client's round trip.
  cli copy "$full" "$full:del" >/dev/null
  cli copy "$full" "$full:unlink" >/dev/null
  cli config set slowlog-log-slower-than 0 >/dev/null
  cli slowlog reset >/dev/null
  cli del "$full:del" >/dev/null
  del_us=$(cli slowlog get 1 | sed -n 3p)
  cli slowlog reset >/dev/null
  cli unlink "$full:unlink" >/dev/null
  unlink_us=$(cli slowlog get 1 | sed -n 3p)
  cli config set slowlog-log-slower-than "$slower_than" >/dev/null
  awk -v k="$key" -v m="$members" -v b="$bytes" -v d="$del_us" -v u="$unlink_us" \
    'BEGIN { printf "%-10s %10d %14d %12.1f %12.1f %12.1f\n", k, m, b, b / m, d / 1000, u / 1000 }'
done
echo "(the stream's entries as seckill.lua appends them: the worker's --keep trims acknowledged ones)"
