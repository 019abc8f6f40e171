#!/usr/bin/env bash
# Starts (or stops) the project's own Redis 7 and MariaDB on 127.0.0.1, with
# data under .services/ in the checkout, never the system services.
#
#   scripts/services.sh up [redis|mysql]    install if missing, start, wait, print URLs (idempotent)
#   scripts/services.sh down [redis|mysql]  stop (idempotent)
#   scripts/services.sh up cluster    a Redis Cluster: 3 masters, 3 replicas (idempotent)
#   scripts/services.sh down cluster  stop it
#   scripts/services.sh status   say what runs where
#   scripts/services.sh env      print `export ...` lines for the URLs
#
# Ports: SECKILL_REDIS_PORT (default 16379), SECKILL_MYSQL_PORT (default 13306),
# SECKILL_CLUSTER_PORT (the cluster's first node, default 17001; the six nodes
# take it and the five after it, their cluster bus ports those + 10000).
# SECKILL_CLUSTER_NODE_TIMEOUT: cluster-node-timeout in ms (default 1000, so
# that a failover plays out in a few seconds). SECKILL_CLUSTER_TLS_DIR: a
# folder with ca.pem, server.pem and server.key makes the cluster speak TLS
# only (tests/tls.rs).
# Data: SECKILL_SERVICES_DIR (default .services/). SECKILL_MYSQL_OPTIONS: extra
# my.cnf lines for a fresh data folder (tests start servers of their own with it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=${SECKILL_SERVICES_DIR:-$root/.services}
redis_port=${SECKILL_REDIS_PORT:-16379}
mysql_port=${SECKILL_MYSQL_PORT:-13306}
mysql_user=seckill
mysql_pass=seckill

cluster_port=${SECKILL_CLUSTER_PORT:-17001}
cluster_node_timeout=${SECKILL_CLUSTER_NODE_TIMEOUT:-1000}
cluster_ports=$(seq "$cluster_port" $((cluster_port + 5)))

redis_url="redis://127.0.0.1:${redis_port}/"
cluster_url="redis://127.0.0.1:${cluster_port}/,redis://127.0.0.1:$((cluster_port + 1))/,redis://127.0.0.1:$((cluster_port + 2))/"
mysql_url="mysql://${mysql_user}:${mysql_pass}@127.0.0.1:${mysql_port}/seckill"
mysql_url_masked="mysql://${mysql_user}:***@127.0.0.1:${mysql_port}/seckill"

say() { printf 'services: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

need_packages() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
  command -v mariadb-install-db >/dev/null 2>&1 || missing+=(mariadb-server)
  command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
  command -v mariadb-admin >/dev/null 2>&1 || missing+=(mariadb-client)
  # The test suite runs a worker on a skewed clock (libfaketime).
  command -v faketime >/dev/null 2>&1 || missing+=(faketime)
  # The observability tests run promtool and a real Prometheus.
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  # The package test (tests/package.rs) checks and installs a .deb.
  command -v lintian >/dev/null 2>&1 || missing+=(lintian)
  command -v file >/dev/null 2>&1 || missing+=(file)
  command -v man >/dev/null 2>&1 || missing+=(man-db)
  command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
  # The demo and the HTTPS test of `seckill serve` call it with curl; the
  # TLS tests make their certificates with openssl.
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  # The benchmarks' data generator (scripts/lib/bench_data.py), held to the
  # library's set digest by a test.
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  if ((${#missing[@]})); then
    say "installing ${missing[*]} with apt-get"
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    # policy-rc.d keeps the package from starting the system-wide services.
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  local v
  v=$(redis-server --version | sed -n 's/.*v=\([0-9]*\)\..*/\1/p')
  [ "${v:-0}" -ge 7 ] || die "redis-server ${v:-?} found; Redis 7 or newer is needed"
}

# PONG, not just an answer: a server still loading its AOF answers PING with
# LOADING, and every command would fail until it is done.
redis_ready() { [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ]; }

redis_up() {
  if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
    for _ in $(seq 1 600); do
      redis_ready && return 0
      sleep 0.1
    done
    die "Redis on port $redis_port answers but is not ready (still loading?); see $data/redis/redis.log"
  fi
  mkdir -p "$data/redis"
  # AOF on with an fsync before each reply (`seckill doctor`: what Redis
  # acknowledged survives a crash of the host), no RDB snapshots.
  # Big keys that expire (a sale's rate hash) or are replaced are freed in
  # the background (scripts/bench-memory.sh: a DEL of a million-member key
  # holds Redis 30-160 ms).
  redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$data/redis" \
    --appendonly yes --appendfsync always --save "" \
    --lazyfree-lazy-expire yes --lazyfree-lazy-server-del yes \
    --daemonize yes --pidfile "$data/redis/redis.pid" --logfile "$data/redis/redis.log" \
    --maxclients 10000 >/dev/null
  for _ in $(seq 1 600); do
    redis_ready && return 0
    sleep 0.1
  done
  die "Redis did not answer on port $redis_port; see $data/redis/redis.log"
}

mysql_cnf() {
  cat >"$data/mysql/my.cnf" <<EOF
[mysqld]
datadir=$data/mysql/data
socket=$data/mysql/mysqld.sock
pid-file=$data/mysql/mysqld.pid
log-error=$data/mysql/mysqld.log
port=$mysql_port
bind-address=127.0.0.1
skip-name-resolve
innodb_flush_log_at_trx_commit=1
innodb_buffer_pool_size=256M
innodb_log_file_size=256M
max_connections=1000
character-set-server=utf8mb4
collation-server=utf8mb4_unicode_ci
${SECKILL_MYSQL_OPTIONS:-}
EOF
}

mysql_ping() { mariadb-admin --no-defaults --protocol=socket --socket="$data/mysql/mysqld.sock" -uroot ping >/dev/null 2>&1; }
# Answers when a server on the port (ours, or one another checkout started) takes our user.
mysql_ping_tcp() { mariadb-admin --no-defaults -h127.0.0.1 -P"$mysql_port" -u"$mysql_user" -p"$mysql_pass" ping >/dev/null 2>&1; }

mysql_up() {
  if mysql_ping; then return 0; fi
  if mysql_ping_tcp; then
    # Another checkout's server: usable only while its data is still there
    # (a checkout deleted under its running server leaves one that answers
    # but cannot create a database).
    local dir
    dir=$(mariadb --no-defaults -h127.0.0.1 -P"$mysql_port" -u"$mysql_user" -p"$mysql_pass" \
      -N -e 'SELECT @@datadir' 2>/dev/null || true)
    [ -z "$dir" ] || [ -d "$dir" ] ||
      die "the MariaDB on port $mysql_port runs from $dir, which is gone (its checkout was deleted): stop that server first"
    return 0
  fi
  mkdir -p "$data/mysql"
  mysql_cnf
  local fresh=0
  if [ ! -d "$data/mysql/data/mysql" ]; then
    fresh=1
    # One install at a time on this machine: tests start MariaDBs of their
    # own in parallel, and two installs at once failed now and then. Even
    # under the lock an install failed once in CI with its cause in the
    # error log, which was not kept: the cause is printed now, and a failed
    # install is retried on an emptied data folder (twice), since nothing
    # from it is worth keeping.
    local attempt
    for attempt in 1 2 3; do
      rm -rf "$data/mysql/data" "$data/mysql/mysqld.log"
      if flock "${TMPDIR:-/tmp}/seckill-mariadb-install.lock" \
        mariadb-install-db --defaults-file="$data/mysql/my.cnf" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$data/mysql/install.log" 2>&1; then
        break
      fi
      # CI keeps only what we print: the bootstrap's own errors go to the
      # error log (log-error), the install log holds only generic advice.
      echo "services: mariadb-install-db failed (attempt $attempt of 3); the error log says:" >&2
      grep -E '\[(ERROR|Warning)\]' "$data/mysql/mysqld.log" 2>/dev/null | tail -n 10 >&2 || true
      [ "$attempt" -lt 3 ] || {
        tail -n 5 "$data/mysql/install.log" >&2
        die "mariadb-install-db failed; see $data/mysql/install.log and mysqld.log (free space: $(df -h --output=avail "$data" | tail -n 1 | tr -d ' '))"
      }
    done
  fi
  # setsid detaches the server from this shell so it outlives the caller.
  setsid mariadbd --defaults-file="$data/mysql/my.cnf" --user="$(id -un)" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 300); do
    mysql_ping && break
    sleep 0.1
  done
  mysql_ping || {
    tail -n 15 "$data/mysql/mysqld.log" >&2
    die "MariaDB did not answer on port $mysql_port; see $data/mysql/mysqld.log"
  }
  if [ "$fresh" = 1 ]; then
    mariadb --no-defaults --protocol=socket --socket="$data/mysql/mysqld.sock" -uroot <<SQL
CREATE USER IF NOT EXISTS '${mysql_user}'@'%' IDENTIFIED BY '${mysql_pass}';
GRANT ALL PRIVILEGES ON *.* TO '${mysql_user}'@'%';
FLUSH PRIVILEGES;
SQL
  fi
}

redis_down() {
  if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
    redis-cli -p "$redis_port" shutdown >/dev/null 2>&1 || true
  fi
}

mysql_down() {
  local pidfile="$data/mysql/mysqld.pid"
  if mysql_ping; then
    mariadb-admin --no-defaults --protocol=socket --socket="$data/mysql/mysqld.sock" -uroot shutdown >/dev/null 2>&1 || true
  fi
  for _ in $(seq 1 100); do
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || return 0
    sleep 0.1
  done
}

# SECKILL_CLUSTER_TLS_DIR (ca.pem, server.pem, server.key): the cluster
# speaks TLS only, between its nodes too (tests of rediss:// on a cluster).
cluster_tls=${SECKILL_CLUSTER_TLS_DIR:-}
cluster_tls_args=()
[ -n "$cluster_tls" ] && cluster_tls_args=(--tls --cacert "$cluster_tls/ca.pem")

ccli() {
  redis-cli "${cluster_tls_args[@]}" "$@"
}

# ccli that gives up after $1 seconds (redis-cli itself waits forever on a
# node that accepts but does not answer).
ccli_within() {
  local seconds=$1
  shift
  timeout "$seconds" redis-cli "${cluster_tls_args[@]}" "$@"
}

cluster_node_up() {
  local port=$1 dir="$data/cluster/$1" listen=()
  if ccli -p "$port" ping >/dev/null 2>&1; then
    for _ in $(seq 1 600); do
      [ "$(ccli -p "$port" ping 2>/dev/null)" = PONG ] && return 0
      sleep 0.1
    done
    die "cluster node on port $port answers but is not ready (still loading?)"
  fi
  mkdir -p "$dir"
  # The same durability as the single node; nodes.conf keeps the node's
  # identity and role across restarts. A replica may always take over
  # (validity factor 0): tests fail masters over on purpose.
  if [ -n "$cluster_tls" ]; then
    listen=(--port 0 --tls-port "$port" --tls-cluster yes --tls-replication yes
      --tls-cert-file "$cluster_tls/server.pem" --tls-key-file "$cluster_tls/server.key"
      --tls-ca-cert-file "$cluster_tls/ca.pem" --tls-auth-clients no)
  else
    listen=(--port "$port")
  fi
  redis-server --bind 127.0.0.1 "${listen[@]}" --dir "$dir" \
    --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout "$cluster_node_timeout" --cluster-replica-validity-factor 0 \
    --cluster-require-full-coverage no \
    --repl-diskless-sync-delay 0 \
    --appendonly yes --appendfsync always --save "" \
    --lazyfree-lazy-expire yes --lazyfree-lazy-server-del yes \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --maxclients 10000 >/dev/null
  for _ in $(seq 1 600); do
    [ "$(ccli -p "$port" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
  tail -n 15 "$dir/redis.log" >&2
  die "cluster node on port $port did not answer; see $dir/redis.log"
}

# Every node sees the cluster ok, with three masters and each of them a
# replica whose link is up (a replica still waiting for its first sync would
# take over empty).
cluster_ok() {
  local port info
  for port in $cluster_ports; do
    info=$(ccli -p "$port" cluster info 2>/dev/null) || return 1
    grep -q '^cluster_state:ok' <<<"$info" || return 1
    grep -q '^cluster_known_nodes:6' <<<"$info" || return 1
  done
  local linked=0
  for port in $cluster_ports; do
    ccli -p "$port" info replication | grep -q '^master_link_status:up' && linked=$((linked + 1))
  done
  [ "$linked" -eq 3 ]
}

cluster_up() {
  local port
  for port in $cluster_ports; do cluster_node_up "$port"; done
  if [ "$(ccli -p "$cluster_port" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" -lt 6 ]; then
    local nodes=()
    for port in $cluster_ports; do nodes+=("127.0.0.1:$port"); done
    ccli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$data/cluster/create.log" 2>&1 || {
      tail -n 15 "$data/cluster/create.log" >&2
      die "redis-cli --cluster create failed; see $data/cluster/create.log"
    }
  fi
  for _ in $(seq 1 300); do
    cluster_ok && return 0
    sleep 0.1
  done
  die "the cluster on ports $cluster_port-$((cluster_port + 5)) did not become ok; see $data/cluster/*/redis.log"
}

cluster_down() {
  local port pidfile
  local pid rc
  for port in $cluster_ports; do
    # A node a test froze (SIGSTOP) would never answer SHUTDOWN: wake it
    # first, and give up on asking after a few seconds. A node killed
    # already leaves its pid file behind: its pid may be another process's
    # now, so only a redis-server that timed out is killed.
    pidfile="$data/cluster/$port/redis.pid"
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ]; then
      kill -CONT "$pid" 2>/dev/null || true
    else
      pid=
    fi
    rc=0
    ccli_within 5 -p "$port" shutdown >/dev/null 2>&1 || rc=$?
    if [ "$rc" = 124 ] && [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

print_env() {
  echo "export SECKILL_REDIS_URL=$redis_url"
  echo "export SECKILL_MYSQL_URL=$mysql_url"
  echo "export SECKILL_CLUSTER_URL=$cluster_url"
}

which=${2:-all}
case "$which" in all | redis | mysql | cluster) ;; *) die "unknown service '$which' (use redis, mysql or cluster)" ;; esac
if [ "$which" = cluster ]; then
  case "${1:-up}" in
  up)
    need_packages
    cluster_up
    say "Redis Cluster $cluster_url (3 masters, 3 replicas, AOF appendfsync always, node timeout ${cluster_node_timeout}ms, data in $data/cluster)"
    ;;
  down)
    cluster_down
    say "cluster stopped"
    ;;
  *) die "unknown command '$1' for the cluster (use up or down)" ;;
  esac
  exit 0
fi
case "${1:-up}" in
up)
  need_packages
  if [ "$which" != mysql ]; then
    redis_up
    say "Redis   $redis_url (AOF appendfsync always, data in $data/redis)"
  fi
  if [ "$which" != redis ]; then
    mysql_up
    say "MariaDB $mysql_url_masked (innodb_flush_log_at_trx_commit=1, data in $data/mysql)"
  fi
  ;;
down)
  [ "$which" = mysql ] || redis_down
  [ "$which" = redis ] || mysql_down
  say "stopped"
  ;;
status)
  if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then say "Redis   up   $redis_url"; else say "Redis   down"; fi
  if mysql_ping_tcp; then say "MariaDB up   $mysql_url_masked"; else say "MariaDB down"; fi
  ;;
env) print_env ;;
*) die "unknown command '$1' (use up, down, status or env)" ;;
esac
