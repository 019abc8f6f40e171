#!/usr/bin/env bash
# Redis's own cost of one admission attempt, with no policy and with a user
# rate: redis-benchmark sends EVALSHA of lua/seckill.lua (a fresh user per
# attempt, the success path) and Redis's INFO commandstats gives the
# microseconds of server time per call. The figure to quote is the ratio:
# what the rate limiter adds to every attempt, client-side costs aside.
# A third row is a bot: one user attempting without pause, so that all but
# 100 attempts a second are refused (rate_limited); a refusal should cost
# no more than an admission. A fourth row carries an idempotency key the
# way `seckill serve` sends one to a single Redis (KEYS[9] and KEYS[10]:
# the key's reservation taken, the admission made and its reply recorded
# in one run): Redis's share of what a key costs a purchase, the ceiling
# of scripts/bench-serve.sh's keyed-against-unkeyed ratio. INFO
# commandstats is reset on the project's Redis for each row.
# (Tokens cannot be benchmarked this way: redis-benchmark cannot make the
# token key match the random user; scripts/bench-admission.sh covers them.)
#
#   scripts/admission-cost.sh [attempts] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

attempts=${1:-200000}
rounds=${2:-3}
prefix=benchcost
# Another version of the script, to compare (e.g. git show REV:lua/seckill.lua).
script=${ADMISSION_SCRIPT:-lua/seckill.lua}

scripts/services.sh up >&2
eval "$(scripts/services.sh env)"
port=$(port_of "$SECKILL_REDIS_URL")
sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
trap 'drop_keys "$port" "$prefix:*"' EXIT

one() { # voucher user_rate user [keyed] -> "attempts/s usec_per_call"
  local v=$1 rate=$2 user=$3 keyed=${4:-} k="$prefix:{$1}"
  # A gate as preload leaves it, open for an hour, stock for every attempt.
  local now_ms=$(($(date +%s) * 1000))
  redis-cli -p "$port" hset "$k:meta" total "$attempts" begin_ms $((now_ms - 1000)) \
    end_ms $((now_ms + 3600000)) pay_timeout_ms 900000 user_rate "$rate" require_token 0 >/dev/null
  redis-cli -p "$port" set "$k:stock" "$attempts" >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  local rps usec
  local call=(EVALSHA "$sha" 7 "$k:meta" "$k:stock" "$k:buyers" "$k:waitlist" "$k:orders"
    "$k:token:1" "$k:rate" "$user" 2__rand_int__ "$v" "")
  if [ -n "$keyed" ]; then
    # A fresh key per attempt (its reservation a new key, as a new
    # Idempotency-Key makes), a lifetime of 24 h, a SHA-256-long fingerprint.
    call=(EVALSHA "$sha" 10 "$k:meta" "$k:stock" "$k:buyers" "$k:waitlist" "$k:orders"
      "$k:token:1" "$k:rate" "$k:waitlist_quantity" "$k:idem:n__rand_int__"
      "$prefix:idem:{shared:__rand_int__}" "$user" 2__rand_int__ "$v" "" "" 86400000
      "$(printf 'f%.0s' $(seq 64))" "")
  fi
  rps=$(redis-benchmark -p "$port" -n "$attempts" -c 50 -P 16 -r 1000000000 --csv \
    "${call[@]}" 2>/dev/null | tail -n 1 | cut -d, -f2 | tr -d '"')
  usec=$(redis-cli -p "$port" info commandstats |
    sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  drop_keys "$port" "$k:*"
  drop_keys "$port" "$prefix:idem:*"
  echo "$rps $usec"
}

printf '%-10s %5s %12s %14s %8s\n' policy round "attempts/s" "Redis µs/call" "vs off"
v=$(($(date +%s) % 100000 * 10))
ratio() { awk -v o="$1" -v r="$2" 'BEGIN { printf "%.0f", 100 * o / r }'; }
for r in $(seq 1 "$rounds"); do
  read -r off_rps off_us <<<"$(one $((v += 1)) 0 1__rand_int__)"
  read -r rate_rps rate_us <<<"$(one $((v += 1)) 100 1__rand_int__)"
  read -r bot_rps bot_us <<<"$(one $((v += 1)) 100 42)"
  read -r key_rps key_us <<<"$(one $((v += 1)) 0 1__rand_int__ keyed)"
  printf '%-10s %5s %12.0f %14s %7s%%\n' off "$r" "$off_rps" "$off_us" 100
  printf '%-10s %5s %12.0f %14s %7s%%\n' user-rate "$r" "$rate_rps" "$rate_us" "$(ratio "$off_us" "$rate_us")"
  printf '%-10s %5s %12.0f %14s %7s%%\n' bot "$r" "$bot_rps" "$bot_us" "$(ratio "$off_us" "$bot_us")"
  printf '%-10s %5s %12.0f %14s %7s%%  (attempts/s %s%% of off)\n' keyed "$r" "$key_rps" "$key_us" \
    "$(ratio "$off_us" "$key_us")" "$(ratio "$key_rps" "$off_rps")"
done
echo "(redis-benchmark -c 50 -P 16, $attempts attempts each; off and user-rate: a new user per attempt; bot: user 42 only, refused but for 100 a second; keyed: off with a new idempotency key per attempt; vs off = Redis time per call, off / row)"
