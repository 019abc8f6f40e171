#!/usr/bin/env bash
# The main job end to end on this machine: services up, schema, a voucher of
# 100 units, a flash sale of 1,000 buyers (each pressing "buy" twice), the
# worker persisting the orders to MySQL, and the outcome in tables, checked
# by reconciliation.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh up
eval "$(scripts/services.sh env)"
cargo build --quiet --locked
seckill=target/debug/seckill

# A fresh voucher id per run keeps the demo repeatable on the same services.
voucher=$(date +%s)

echo "== seckill init"
$seckill init
echo
echo "== seckill voucher add --id $voucher --stock 100"
$seckill voucher add --id "$voucher" --stock 100 --begin now --end +1h --pay-timeout 15m --title "demo flash sale"
echo
echo "== seckill preload --voucher $voucher"
$seckill preload --voucher "$voucher"
echo
echo "== seckill bench: 1,000 buyers press buy twice, 2,000 attempts at once"
$seckill bench --voucher "$voucher" --users 1000 --attempts 2000 --concurrency 200
echo
echo "== seckill buy: one more buyer, after the sale sold out"
$seckill buy --voucher "$voucher" --user 5000 || echo "(exit code $?: sold out, waitlisted)"
echo
echo "== seckill worker --until-idle: persist the admitted orders to MySQL"
$seckill worker --until-idle --block 500ms
echo
echo "== seckill pending --voucher $voucher: nothing left in flight"
$seckill pending --voucher "$voucher"
echo
echo "== seckill voucher list: MySQL and the Redis gate agree"
$seckill voucher list --voucher "$voucher"
echo
echo "== seckill reconcile --dry-run: nothing to repair"
$seckill reconcile --dry-run --voucher "$voucher"

# The same sale through the HTTP front door, as an application server
# calls it: `seckill serve` on loopback, purchases with curl.
web_voucher=$((voucher * 10 + 1))
port=${SECKILL_DEMO_PORT:-18080}
echo
echo "== seckill serve: the HTTP front door (voucher $web_voucher, 3 units)"
$seckill voucher add --id "$web_voucher" --stock 3 --begin now --end +1h --pay-timeout 15m --title "demo over HTTP"
$seckill preload --voucher "$web_voucher"
$seckill serve --listen "127.0.0.1:$port" 2>/tmp/seckill-demo-serve.log &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done
for user in 1 2 3 4 1; do
  echo "-- POST /v1/vouchers/$web_voucher/purchases {\"user\": $user}"
  curl -s -w '  (HTTP %{http_code})\n' -H 'content-type: application/json' \
    -d "{\"user\": $user}" "http://127.0.0.1:$port/v1/vouchers/$web_voucher/purchases"
done
echo "-- GET /v1/vouchers/$web_voucher"
curl -s -w '  (HTTP %{http_code})\n' "http://127.0.0.1:$port/v1/vouchers/$web_voucher"
kill -TERM "$serve_pid"
wait "$serve_pid"
trap - EXIT
$seckill worker --until-idle --block 500ms >/dev/null
echo
echo "== seckill reconcile --dry-run: both vouchers consistent"
$seckill reconcile --dry-run --voucher "$voucher" --voucher "$web_voucher"
echo
echo "== seckill doctor: the servers set up so that the guarantees hold"
# Warnings (exit 5) are shown, not fatal to the demo; a failure (6) is.
$seckill doctor --role worker || [ $? -eq 5 ]
