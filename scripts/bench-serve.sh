#!/usr/bin/env bash
# Purchases/s through `seckill serve` (HTTP, driven by wrk, a load generator
# nobody here wrote) side by side with `seckill bench` (the gate straight
# from Rust) on the same set-up, same Redis, same run; p50/p90/p99/p99.9;
# CPU seconds of serve, Redis and wrk during the HTTP run, and serve's CPU
# per request. Every request is a new user, so every purchase succeeds
# (the gate's full path: checks, DECR, SADD, XADD). Rounds alternate the two.
# Then a round of attempts before a sale opens: their rate, and every
# command Redis ran meanwhile (INFO commandstats), which should be the
# cached window's reads and the node-id lease's renewal alone. Then
# purchases with an Idempotency-Key against purchases without, same run,
# on the success and the sold-out path: rates, Redis's and serve's CPU per
# request, and the memory of one key's record.
#
#   scripts/bench-serve.sh [seconds] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh

seconds=${1:-10}
rounds=${2:-2}
connections=${BENCH_CONNECTIONS:-64}
threads=${BENCH_THREADS:-2}
prefix=benchserve
port=${BENCH_SERVE_PORT:-18181}

scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
command -v wrk >/dev/null || { echo "bench-serve: installing wrk" >&2; apt-get install -y -qq wrk >/dev/null; }
redis_port=$(port_of "$SECKILL_REDIS_URL")
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_bench"
cargo build --release --quiet --locked
seckill="target/release/seckill --prefix $prefix"
$seckill init >/dev/null
drop_keys "$redis_port" "$prefix:*"

lua=$(mktemp --suffix .lua)
keyed_lua=$(mktemp --suffix .lua)
trap 'rm -f "$lua" "$keyed_lua"; kill "$serve_pid" 2>/dev/null || true; drop_keys "$redis_port" "$prefix:*"' EXIT
# Each wrk thread numbers its own users, so no two requests share one.
cat >"$lua" <<'LUA'
local counter, base = 0, 0
local threads = 0
function setup(thread)
  thread:set("base", threads * 1000000000 + 1)
  threads = threads + 1
end
function init(args)
  base = tonumber(wrk.thread:get("base")) or 1
end
function request()
  counter = counter + 1
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json"},
    '{"user": ' .. (base + counter) .. '}')
end
-- wrk --latency stops at p99: the tail, in microseconds.
function done(summary, latency, requests)
  io.write(string.format("P999 %d\n", latency:percentile(99.9)))
end
LUA

cpu_of() { # pid -> CPU seconds so far
  awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"
}

first_voucher=$(( $(date +%s) * 100 ))
fresh_voucher() { # id: a new voucher of 10,000,000 units, preloaded
  $seckill voucher add --id "$1" --stock 10000000 --end +2h --title bench >/dev/null
  $seckill preload --voucher "$1" >/dev/null
}

$seckill serve --listen "127.0.0.1:$port" --max-in-flight 100000 2>/tmp/bench-serve.log &
serve_pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
redis_pid=$(redis-cli -p "$redis_port" info server | sed -n 's/^process_id:\([0-9]*\).*/\1/p' | tr -d '\r')

printf '%-6s %14s %14s %8s %9s %9s %9s %9s %12s %10s %10s %10s\n' round "serve req/s" "bench att/s" ratio "p50 ms" "p90 ms" "p99 ms" "p99.9 ms" "serve µs/req" "serve cpu" "redis cpu" "wrk cpu"
for round in $(seq "$rounds"); do
  v=$((first_voucher + 2 * round))
  fresh_voucher "$v"
  s0=$(cpu_of "$serve_pid"); r0=$(cpu_of "$redis_pid")
  out=$( { /usr/bin/time -f 'WRKCPU %U %S' wrk -t"$threads" -c"$connections" -d"${seconds}s" --latency -s "$lua" \
    "http://127.0.0.1:$port/v1/vouchers/$v/purchases"; } 2>&1)
  s1=$(cpu_of "$serve_pid"); r1=$(cpu_of "$redis_pid")
  rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%d", $2}')
  total=$(echo "$out" | awk '/requests in/ {print $1}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  lat() { echo "$out" | awk -v p="$1" '$1 == p {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.2f", v}'; }
  wrk_cpu=$(echo "$out" | awk '/WRKCPU/ {printf "%.2f", $2 + $3}')
  p999=$(echo "$out" | awk '/^P999/ {printf "%.2f", $2 / 1000}')
  v2=$((v + 1))
  fresh_voucher "$v2"
  bench=$($seckill bench --voucher "$v2" --users 200000 --attempts 200000 --concurrency "$connections" \
    --connections 4 --format json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["attempts_per_sec"]))')
  serve_cpu=$(awk -v a="$s1" -v b="$s0" 'BEGIN {printf "%.2f", a - b}')
  redis_cpu=$(awk -v a="$r1" -v b="$r0" 'BEGIN {printf "%.2f", a - b}')
  per_req=$(awk -v c="$serve_cpu" -v n="$total" 'BEGIN {printf "%.1f", c * 1000000 / n}')
  ratio=$(awk -v a="$rps" -v b="$bench" 'BEGIN {printf "%.2f", a / b}')
  printf '%-6s %14s %14s %8s %9s %9s %9s %9s %12s %10s %10s %10s\n' "$round" "$rps" "$bench" \
    "$ratio" "$(lat 50%)" "$(lat 90%)" "$(lat 99%)" "$p999" "$per_req" "$serve_cpu" "$redis_cpu" "$wrk_cpu"
  if [ -n "$non2xx" ]; then echo "  ($non2xx answers were not 2xx: see /tmp/bench-serve.log)"; fi
done
echo "(one 2-core machine: wrk, serve and Redis share it; quote the ratio)"

# Before the sale: answered from serve's cached window, no script run.
early=$((first_voucher + 2 * rounds + 2))
$seckill voucher add --id "$early" --stock 1000 --begin +1h --end +2h --title bench >/dev/null
$seckill preload --voucher "$early" >/dev/null
curl -fs -o /dev/null -X POST -H 'content-type: application/json' -d '{"user": 1}' \
  "http://127.0.0.1:$port/v1/vouchers/$early/purchases" || true
commands() { # Redis's commands so far: "name calls" per line
  redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\([^:]*\):calls=\([0-9]*\).*/\1 \2/p' | sort
}
before=$(commands)
out=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" -s "$lua" \
  "http://127.0.0.1:$port/v1/vouchers/$early/purchases" 2>&1)
after=$(commands)
rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%d", $2}')
total=$(echo "$out" | awk '/requests in/ {print $1}')
calls=$(join -a 2 -e 0 -o 0,1.2,2.2 <(echo "$before") <(echo "$after") |
  awk '$3 > $2 {printf "%s%s %d", sep, $1, $3 - $2; sep=", "}')
refused=$(echo "$out" | awk '/Non-2xx/ {print $5}')
echo "before the sale: $rps attempts/s through serve ($total in ${seconds} s, ${refused:-0} of them non-2xx: 425 not_started);" \
  "Redis ran meanwhile: ${calls:-nothing} (the cached window's reads are HMGET+GET+TIME a second; the node-id lease's renewal and this script's INFO are in it too)"

# With an Idempotency-Key (a new one per request) against without, each
# pair on fresh vouchers alike: the success path (10,000,000 units) and the
# sold-out path (1 unit: every later request waits on the waitlist).
# Keys are new in every round: the voucher's path is part of each (a key
# sent again for another voucher is a 422 that closes its connection).
sed 's/{\["Content-Type"\] = "application\/json"}/{["Content-Type"] = "application\/json", ["Idempotency-Key"] = "k" .. wrk.path .. ":" .. (base + counter)}/' \
  "$lua" >"$keyed_lua"
grep -q Idempotency-Key "$keyed_lua"
echo
printf '%-9s %-5s %12s %16s %16s\n' path key "req/s" "redis µs/req" "serve µs/req"
declare -A rate
next=$((early + 1))
for path in success sold_out; do
  for key in no yes; do
    for round in $(seq "$rounds"); do
      v=$next; next=$((next + 1))
      units=10000000; [ "$path" = sold_out ] && units=1
      $seckill voucher add --id "$v" --stock "$units" --end +2h --title bench >/dev/null
      $seckill preload --voucher "$v" >/dev/null
      script=$lua; [ "$key" = yes ] && script=$keyed_lua
      s0=$(cpu_of "$serve_pid"); r0=$(cpu_of "$redis_pid")
      out=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" -s "$script" \
        "http://127.0.0.1:$port/v1/vouchers/$v/purchases" 2>&1)
      s1=$(cpu_of "$serve_pid"); r1=$(cpu_of "$redis_pid")
      rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%d", $2}')
      total=$(echo "$out" | awk '/requests in/ {print $1}')
      non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
      # Every success-path answer is a 201: anything else is not the path
      # measured (a sold-out path's answers are all 410 but the first).
      if [ "$path" = success ] && [ -n "$non2xx" ]; then
        echo "bench-serve: $non2xx answers on the success path were not 201 (see /tmp/bench-serve.log)" >&2
      fi
      rate[$path.$key]=$(( ${rate[$path.$key]:-0} + rps ))
      printf '%-9s %-5s %12s %16s %16s\n' "$path" "$key" "$rps" \
        "$(awk -v a="$r1" -v b="$r0" -v n="$total" 'BEGIN {printf "%.1f", (a - b) * 1000000 / n}')" \
        "$(awk -v a="$s1" -v b="$s0" -v n="$total" 'BEGIN {printf "%.1f", (a - b) * 1000000 / n}')"
    done
  done
  echo "  $path: with a key $(awk -v a="${rate[$path.yes]}" -v b="${rate[$path.no]}" 'BEGIN {printf "%.2f", a / b}')x the rate without (the issue asks >= 0.9x)"
done
reservation=$(redis-cli -p "$redis_port" --scan --pattern "$prefix:idem:*" | awk 'NR == 1')
echo "one key's record: the reservation, $(redis-cli -p "$redis_port" memory usage "$reservation") bytes" \
  "(MEMORY USAGE; on one Redis it holds the admission's record too)"

# Held long polls: lookups of buyers who do not wait, each with ?wait=30s
# (held until the time runs out), opened at once; serve's resident memory
# before and while they are held. serve holds at most half its
# --max-in-flight (100000 here) per process.
held=${BENCH_HELD_POLLS:-1000}
polled=$((next + 1))
$seckill voucher add --id "$polled" --stock 10 --end +2h --title bench >/dev/null
$seckill preload --voucher "$polled" >/dev/null
rss_of() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
in_flight() { curl -fs "http://127.0.0.1:$port/metrics" | awk '/^seckill_http_requests_in_flight / {print $2}'; }
rss0=$(rss_of "$serve_pid")
python3 - "$port" "$polled" "$held" <<'PY' &
import socket, sys, time
port, voucher, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
held = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /v1/vouchers/{voucher}/purchases/{1000 + i}?wait=30s HTTP/1.1\r\nHost: b\r\n\r\n".encode())
    held.append(s)
time.sleep(40)
PY
polls_pid=$!
for _ in $(seq 600); do
  [ "$(in_flight)" -ge "$held" ] 2>/dev/null && break
  sleep 0.05
done
now_held=$(in_flight)
rss1=$(rss_of "$serve_pid")
kill "$polls_pid" 2>/dev/null || true
echo "held long polls: $now_held held at once; serve's resident memory ${rss0} kB before, ${rss1} kB while held:" \
  "$(( (rss1 - rss0) / (now_held > 0 ? now_held : 1) )) kB per held lookup (at most 50000 held here: half of --max-in-flight)"
