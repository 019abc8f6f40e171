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
