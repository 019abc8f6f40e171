#!/usr/bin/env bash
# Builds the Debian package with cargo-deb ([package.metadata.deb] in
# Cargo.toml) and prints its path: target/debian/seckill_<version>_<arch>.deb.
#
#   scripts/package.sh                   a release build, stripped
#   scripts/package.sh --profile dev --no-build
#                                        the binary the tests built (tests/package.rs)
#
#   scripts/package.sh --install-cargo-deb
#                                        only install cargo-deb (scripts/test.sh)
#
# Other arguments go to cargo-deb. cargo-deb is installed with cargo if
# missing (crates.io).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  echo "package.sh: installing cargo-deb $CARGO_DEB_VERSION" >&2
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi
[ "${1:-}" = --install-cargo-deb ] && exit 0

# Debian wants man pages compressed (reproducibly: no name, no time).
mkdir -p target/package/man
rm -f target/package/man/*.1.gz
for page in man/*.1; do
  gzip -9n <"$page" >"target/package/man/$(basename "$page").gz"
done

# cargo-deb prints the package's path last on stdout.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Stripped always: the release profile keeps line tables for backtraces
# (94 MB for 16 MB stripped, measured), which cargo-deb would otherwise ship.
if ! cargo deb --locked --strip "$@" >"$log" 2>&1; then
  sed 's/^/package.sh: /' "$log" >&2
  echo "package.sh: cargo deb failed" >&2
  exit 1
fi
# The dev profile (tests/package.rs) draws a warning from cargo-deb 3.8:
# fine for checking the package's layout, not for a release.
grep -v '\.deb$' "$log" | sed 's/^/package.sh: /' >&2 || true
deb=$(grep '\.deb$' "$log" | tail -n 1 || true)
[ -f "$deb" ] || { echo "package.sh: cargo deb made no package" >&2; exit 1; }
echo "$deb"
