#!/usr/bin/env bash
# The whole test suite: the project's services up, formatting and lints,
# then every test against real Redis and MariaDB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh up
# The cluster tests' Redis Cluster (3 masters, 3 replicas).
scripts/services.sh up cluster

# Leftovers of earlier runs that failed before cleaning up after themselves
# (tests use databases seckill_t* and key prefixes t*; only on our own services).
eval "$(scripts/services.sh env)"
mariadb --no-defaults -h127.0.0.1 -P"${SECKILL_MYSQL_PORT:-13306}" -useckill -pseckill -N -e \
  "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'seckill\\_t%'" |
  while read -r db; do
    mariadb --no-defaults -h127.0.0.1 -P"${SECKILL_MYSQL_PORT:-13306}" -useckill -pseckill -e "DROP DATABASE \`$db\`"
  done
redis-cli -p "${SECKILL_REDIS_PORT:-16379}" --scan --pattern 't[0-9]*' | xargs -r -n 500 redis-cli -p "${SECKILL_REDIS_PORT:-16379}" del >/dev/null
# On the cluster, key by key (a DEL of several keys must stay in one slot).
for port in $(seq "${SECKILL_CLUSTER_PORT:-17001}" $((${SECKILL_CLUSTER_PORT:-17001} + 5))); do
  if [ "$(redis-cli -p "$port" role | head -n 1)" = master ]; then
    redis-cli -p "$port" --scan --pattern 't[0-9]*' | sed 's/^/UNLINK /' | redis-cli -p "$port" >/dev/null
  fi
done

# The package test's tool, before the tests (building it inside a test
# would race the test's time limit on a busy machine).
scripts/package.sh --install-cargo-deb
# The API contract tests' tools (schemathesis, a client generator), from
# PyPI into .services/pytools.
scripts/pytools.sh

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
# The library's API docs: a broken intra-doc link is an error.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast --test-threads 4 "$@"
else
  cargo test --locked --no-fail-fast "$@"
fi
