#!/usr/bin/env bash
# The Python tools of the API contract tests (tests/api_contract.rs), at
# pinned versions, in a virtualenv of their own: .services/pytools
# (SECKILL_TEST_PYTOOLS overrides). From PyPI through pip; python3-venv
# from Debian's packages when missing. Idempotent: a second run with the
# versions in place does nothing.
#
#   schemathesis            the document fuzzed against a running serve
#   openapi-python-client   a client generated from the document
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${SECKILL_TEST_PYTOOLS:-$PWD/.services/pytools}"
want="schemathesis==4.32.5 openapi-python-client==0.29.1"
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  echo "pytools.sh: installing python3-venv" >&2
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get install -y -q python3-venv >/dev/null
fi
rm -rf "$dir"
python3 -m venv "$dir"
# shellcheck disable=SC2086
"$dir/bin/pip" install --quiet --disable-pip-version-check $want
echo "$want" > "$stamp"
echo "pytools.sh: $want in $dir" >&2
