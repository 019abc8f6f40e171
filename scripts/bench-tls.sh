#!/usr/bin/env bash
# Admission and drain over TLS against plaintext, side by side in one run,
# on the same servers: a Redis serving a plaintext and a TLS port at once,
# and a MariaDB with a certificate (TLS is chosen per connection). Rounds
# alternate; each figure has a fresh voucher of `attempts` units:
#   admission: `seckill bench`, every attempt a success (attempts/s);
#   drain: `seckill worker --until-idle` persisting them (orders/s).
# TLS: rediss:// with the CA checked, --mysql-ssl-mode verify-identity.
#
#   scripts/bench-tls.sh [attempts] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

attempts=${1:-50000}
rounds=${2:-3}
prefix=benchtls
work=$(mktemp -d)
redis_port=${BENCH_TLS_REDIS_PORT:-16479}
redis_tls_port=${BENCH_TLS_REDIS_TLS_PORT:-16480}
mysql_port=${BENCH_TLS_MYSQL_PORT:-13406}

cleanup() {
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  SECKILL_SERVICES_DIR="$work/svc" SECKILL_MYSQL_PORT=$mysql_port scripts/services.sh down mysql >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

scripts/services.sh up >/dev/null # installs the packages when missing
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.pem -subj "/CN=bench CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
echo "subjectAltName=IP:127.0.0.1,DNS:localhost" >server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out server.pem \
  -extfile server.ext 2>/dev/null
cd - >/dev/null

mkdir -p "$work/redis"
redis-server --bind 127.0.0.1 --port "$redis_port" --tls-port "$redis_tls_port" \
  --tls-cert-file "$work/server.pem" --tls-key-file "$work/server.key" --tls-ca-cert-file "$work/ca.pem" \
  --tls-auth-clients no --dir "$work/redis" --appendonly yes --appendfsync everysec --save "" \
  --daemonize yes --logfile "$work/redis/redis.log" >/dev/null
SECKILL_SERVICES_DIR="$work/svc" SECKILL_MYSQL_PORT=$mysql_port \
  SECKILL_MYSQL_OPTIONS="ssl_cert=$work/server.pem
ssl_key=$work/server.key
ssl_ca=$work/ca.pem" scripts/services.sh up mysql >/dev/null 2>&1
for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

cargo build --release --quiet --locked
seckill="target/release/seckill --prefix $prefix"
export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:$mysql_port/seckill_bench"

plain() {
  SECKILL_REDIS_URL="redis://127.0.0.1:$redis_port/" SECKILL_MYSQL_SSL_MODE=disabled "$@"
}
tls() {
  SECKILL_REDIS_URL="rediss://127.0.0.1:$redis_tls_port/" SECKILL_REDIS_CA_CERT="$work/ca.pem" \
    SECKILL_MYSQL_SSL_MODE=verify-identity SECKILL_MYSQL_CA_CERT="$work/ca.pem" "$@"
}

plain $seckill init >/dev/null
base=$(($(date +%s) * 100 + 90000))

one() { # mode voucher -> "admission/s drain/s"
  local mode=$1 v=$2 admit drain
  $mode $seckill voucher add --id "$v" --stock "$attempts" --end +2h --title bench >/dev/null
  $mode $seckill preload --voucher "$v" >/dev/null
  admit=$($mode $seckill bench --voucher "$v" --users "$attempts" --attempts "$attempts" \
    --concurrency 800 --connections 8 --format json |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["attempts_per_sec"]))')
  drain=$($mode $seckill -q worker --until-idle --consumer "bench-$v" --format json |
    python3 -c 'import json,sys; s=json.load(sys.stdin); print(round(s["persisted"] * 1000 / max(s["elapsed_ms"], 1)))')
  echo "$admit $drain"
}

echo "attempts: $attempts (every one a success), then one worker drains them"
printf '| round | admission plain | admission TLS | ratio | drain plain | drain TLS | ratio |\n'
printf '|---|---|---|---|---|---|---|\n'
for r in $(seq 1 "$rounds"); do
  read -r pa pd <<<"$(one plain $((base + r * 10 + 1)))"
  read -r ta td <<<"$(one tls $((base + r * 10 + 2)))"
  printf '| %s | %s | %s | %s%% | %s | %s | %s%% |\n' "$r" "$pa" "$ta" $((ta * 100 / pa)) "$pd" "$td" $((td * 100 / pd))
done
