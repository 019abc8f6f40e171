#!/usr/bin/env bash
# How many distinct order ids N concurrent `seckill buy` processes mint when
# every one is pid 1 of its own pid namespace (as in N containers).
#   scripts/order-ids.sh [N] [path/to/seckill]      (root: unshare --pid)
# Uses the project's services, a voucher of its own (id 990001) under the
# key prefix seckill_ids and a database of its own (seckill_ids, made afresh,
# so an older binary with an older schema runs it too); prints
# "N buyers: D distinct order ids".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
n=${1:-200}
bin=${2:-target/debug/seckill}
scripts/services.sh up >&2
eval "$(scripts/services.sh env)"
export SECKILL_PREFIX=seckill_ids
export SECKILL_MYSQL_URL="${SECKILL_MYSQL_URL%/*}/seckill_ids"
unset SECKILL_NODE_ID
voucher=990001
out=$(mktemp -d)
forget() { # the keys and the database of this script
  drop_keys "$(port_of "$SECKILL_REDIS_URL")" 'seckill_ids:*'
  mariadb --no-defaults -h127.0.0.1 -P"${SECKILL_MYSQL_PORT:-13306}" -useckill -pseckill \
    -e "DROP DATABASE IF EXISTS seckill_ids"
}
trap 'forget; rm -rf "$out"' EXIT
forget
"$bin" init >/dev/null
"$bin" voucher add --id "$voucher" --stock "$n" >/dev/null
"$bin" preload --voucher "$voucher" >/dev/null
for u in $(seq 1 "$n"); do
  unshare --pid --fork "$bin" buy --voucher "$voucher" --user "$u" --format json >"$out/$u" 2>&1 &
done
wait
distinct=$(cat "$out"/* | sed -n 's/.*"order_id": "\([0-9]*\)".*/\1/p' | sort -u | wc -l)
echo "$n buyers: $distinct distinct order ids"
