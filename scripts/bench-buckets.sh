#!/usr/bin/env bash
# One hot voucher on the local 3-master cluster, split in N buckets (default
# 3) against the same voucher in one bucket, in one run. Demand exceeds
# supply (twice as many buyers as units) and a worker runs during the sale,
# as in production. For each run it prints, per master, its share of the
# voucher's admission calls (EVALSHA, INFO commandstats) and the Redis CPU
# (user + sys, INFO cpu) it spent, then the CPU µs per admission summed over
# the masters, the units the mover moved, and how long the buyers served by
# moved units waited (the `promoted` events' waited_ms). From those, the
# attempts/s one voucher could take on 3, 6 and 12 masters with a core each.
#
# This machine has 2 cores for six cluster nodes, the bench and the worker:
# the figures that matter are the shares and the CPU per admission (what
# makes N masters N times one), not the attempts/s of this run.
#
#   scripts/bench-buckets.sh [attempts] [buckets]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

attempts=${1:-100000}
buckets=${2:-3}
stock=$((attempts / 2))
concurrency=${BENCH_CONCURRENCY:-400}
connections=${BENCH_CONNECTIONS:-8}
prefix=benchbk

# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
bench_setup seckill_bench_buckets "$prefix"  # also the services' env
scripts/services.sh up cluster
node_url=$SECKILL_REDIS_URL
export SECKILL_REDIS_URL=$SECKILL_CLUSTER_URL
cluster_port=${SECKILL_CLUSTER_PORT:-17001}
masters=$(redis-cli -p "$cluster_port" cluster nodes | awk '$3 ~ /master/ { split($2, a, "[:@]"); print a[2] }' | sort)
trap drop_bench_keys EXIT

# port -> "evalsha_calls cpu_us" of that master now. CPU, not commandstats'
# usec: that is wall-clock time, which here (six nodes on two cores) counts
# the waits for a core too.
counters() {
  redis-cli -p "$1" info all | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_evalsha:/ { calls = $3 }
    /^used_cpu_sys:/ { sys = $2 } /^used_cpu_user:/ { user = $2 }
    END { printf "%d %d\n", calls, (sys + user) * 1000000 }'
}

snapshot() {
  local port
  for port in $masters; do echo "$port $(counters "$port")"; done
}

# voucher n -> one line of JSON with the run's figures
run() { # voucher buckets [concurrency]
  local v=$1 n=$2 c=${3:-$concurrency} before after report worker_out
  $seckill voucher add --id "$v" --stock "$stock" --buckets "$n" --end +2h --title bench >/dev/null
  $seckill preload --voucher "$v" >/dev/null
  worker_out=$(mktemp)
  $seckill worker --format json >"$worker_out" 2>/dev/null &
  local worker=$!
  before=$(snapshot)
  report=$($seckill bench --voucher "$v" --users "$attempts" --attempts "$attempts" \
    --concurrency "$c" --connections "$connections" --format json)
  after=$(snapshot)
  # Let the worker persist the orders and the mover finish, then stop it.
  for _ in $(seq 1 120); do
    left=$($seckill status --voucher "$v" --format json |
      python3 -c 'import json,sys; s=json.load(sys.stdin)[0]; print(s["undelivered"] + s["pending"])')
    [ "$left" = 0 ] && break
    sleep 0.5
  done
  sleep 1
  kill -TERM "$worker"
  wait "$worker" || true
  local events
  events=$(for tag in $($seckill voucher list --voucher "$v" --format json |
    python3 -c 'import json,sys; g=json.load(sys.stdin)[0]["gate"]; print(" ".join(b["tag"] for b in g.get("buckets", [])) or "'"$v"'")'); do
    redis-cli -c -p "$cluster_port" xrange "$prefix:{$tag}:events" - + | tr -d '\r'
  done)
  python3 - "$n" "$report" "$before" "$after" "$worker_out" "$events" <<'EOF'
import json, sys
n, report, before, after, worker_out, events = sys.argv[1:7]
report = json.loads(report)
def parse(text):
    return {l.split()[0]: list(map(int, l.split()[1:])) for l in text.strip().splitlines()}
b, a = parse(before), parse(after)
calls = {p: a[p][0] - b[p][0] for p in a}
cpu = {p: a[p][1] - b[p][1] for p in a}
summary = json.load(open(worker_out)) if open(worker_out).read().strip() else {}
stats = summary  # the counters are top-level fields
# The events stream as redis-cli prints XRANGE: id, then field, value lines.
waits, fields = [], events.split("\n")
for i, f in enumerate(fields[:-1]):
    if f == "released_order" and fields[i + 1] == "0":
        for j in range(i, min(i + 8, len(fields) - 1)):
            if fields[j] == "waited_ms":
                waits.append(int(fields[j + 1]))
waits.sort()
print(json.dumps({
    "buckets": int(n), "attempts": report["attempts"], "success": report["outcomes"]["success"],
    "sold_out": report["outcomes"]["sold_out"], "errors": report["errors"],
    "attempts_per_sec": round(report["attempts_per_sec"]), "calls": calls, "cpu_us": cpu,
    "units_moved": stats.get("units_moved", 0), "promoted_by_moves": len(waits),
    "waited_ms_p50": waits[len(waits) // 2] if waits else None,
    "waited_ms_max": waits[-1] if waits else None,
}))
EOF
  rm -f "$worker_out"
}

base=$(( $(date +%s) % 100000 * 100 ))
one=$(run $((base + 1)) 1)
split=$(run $((base + 2)) "$buckets")
# The same split with N times the requests in flight: each master then has
# as many as the one master had (what many application servers give it).
deep=$(run $((base + 3)) "$buckets" $((concurrency * buckets)))
python3 - "$one" "$split" "$deep" <<'EOF'
import json, sys
one, split, deep = (json.loads(a) for a in sys.argv[1:4])
def row(r):
    total = sum(r["calls"].values()) or 1
    shares = {p: c / total for p, c in r["calls"].items()}
    cpu_per = sum(r["cpu_us"].values()) / max(r["attempts"], 1)
    return shares, cpu_per
s1, c1 = row(one)
sn, cn = row(split)
n = split["buckets"]
print(f"attempts {one['attempts']} per run, stock {one['attempts'] // 2}; each run with a worker during the sale\n")
print("| run | master | share of admission calls | Redis CPU µs (all calls) |")
print("|---|---|---|---|")
for name, r, s in (("1 bucket", one, s1), (f"{n} buckets", split, sn)):
    for p in sorted(s):
        print(f"| {name} | {p} | {s[p] * 100:.1f}% | {r['cpu_us'][p]} |")
print()
print("| | 1 bucket | %d buckets | ratio |" % n)
print("|---|---|---|---|")
print(f"| Redis CPU µs per admission, summed over the masters | {c1:.1f} | {cn:.1f} | {cn / c1:.2f}x (goal <= 1.15x) |")
_, cd = row(deep)
print(f"| the same, {n} buckets with {n}x the requests in flight (as many per master as the one had) | {c1:.1f} | {cd:.1f} | {cd / c1:.2f}x |")
print(f"| attempts/s of this run (2 shared cores) | {one['attempts_per_sec']} | {split['attempts_per_sec']} | {split['attempts_per_sec'] / max(one['attempts_per_sec'], 1):.2f}x |")
print(f"| units sold (admitted at once) | {one['success']} | {split['success']} | |")
print(f"| units moved by the mover | {one['units_moved']} | {split['units_moved']} | |")
print(f"| buyers served by moved units | {one['promoted_by_moves']} | {split['promoted_by_moves']} | |")
print(f"| their wait, median / longest (ms) | - | {split['waited_ms_p50']} / {split['waited_ms_max']} | |")
print(f"| errors | {one['errors']} | {split['errors']} | |")
worst = max(sn.values())
print(f"\nbusiest master's share with {n} buckets: {worst * 100:.1f}% (goal {100 / n:.1f}% +- 5%)")
print("\nprojection: one voucher in M buckets on M masters with a core each, the busiest")
print("master the limit: attempts/s = 1e6 x M / (CPU µs per admission x f), f = the")
print("busiest master's share x M (1 when even; as measured here)")
f = worst * n
for m in (3, 6, 12):
    rate = 1e6 * m / (cn * f)
    print(f"  {m:2d} masters: ~{rate / 1e3:.0f}k attempts/s   (1 master, 1 bucket: ~{1e6 / c1 / 1e3:.0f}k)")
print("assumes: a core per master for Redis alone, CPU per admission as measured here")
print("(replication to the replicas included), the busiest master's excess share as")
print("measured at this N, clients and the network not the limit, the mover's few calls")
print("per bucket per 100 ms negligible against the sale")
EOF
