# Shared by the benchmark scripts. port_of and drop_keys need nothing; the
# rest, for the scripts that compare the single node with the cluster,
# needs seckill, attempts, concurrency, connections, prefix and node_url
# (set by the sourcing script).

# redis://host:port/ -> port
port_of() {
  echo "$1" | sed -n 's#.*:\([0-9]*\)/.*#\1#p'
}

# database prefix: the services up, a database (dropped and initialised)
# and key prefix of the benchmark's own, and the release binary. Sets port,
# redis_port and seckill; exports SECKILL_PREFIX and SECKILL_MYSQL_URL.
bench_setup() {
  scripts/services.sh up
  eval "$(scripts/services.sh env)"
  port=${SECKILL_MYSQL_PORT:-13306}
  redis_port=$(port_of "$SECKILL_REDIS_URL")
  export SECKILL_PREFIX=$2
  export SECKILL_MYSQL_URL="mysql://seckill:seckill@127.0.0.1:${port}/$1"
  cargo build --release --quiet --locked
  seckill=target/release/seckill
  mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -e "DROP DATABASE IF EXISTS $1"
  $seckill init >/dev/null
}

# port pattern: deletes the keys matching the pattern on one node.
drop_keys() {
  redis-cli -p "$1" --scan --pattern "$2" | xargs -r -n 500 redis-cli -p "$1" del >/dev/null
}

# url voucher [bench flags...] -> attempts/s of one `seckill bench`
bench_rate() {
  local url=$1 v=$2
  shift 2
  SECKILL_REDIS_URL=$url $seckill bench --voucher "$v" --users "$attempts" --attempts "$attempts" \
    --concurrency "$concurrency" --connections "$connections" --format json "$@" |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["attempts_per_sec"]))'
}

# Drops the bench's keys on the node and on every cluster master, so
# repeated runs do not grow Redis (key by key on the cluster: one slot each).
drop_bench_keys() {
  local node_port port
  node_port=$(port_of "$node_url")
  drop_keys "$node_port" "$prefix:*"
  for port in $(seq "${SECKILL_CLUSTER_PORT:-17001}" $((${SECKILL_CLUSTER_PORT:-17001} + 5))); do
    if [ "$(redis-cli -p "$port" role | head -n 1)" = master ]; then
      redis-cli -p "$port" --scan --pattern "$prefix:*" | sed 's/^/UNLINK /' | redis-cli -p "$port" >/dev/null
    fi
  done
}
