#!/usr/bin/env bash
# Builds the documentation book (docs/, mdBook's layout) as HTML into
# docs/book/ and prints where. mdbook comes from crates.io when missing
# (`cargo install --locked mdbook`); the test suite checks the book's
# table of contents and links without it (tests/docs_book.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v mdbook >/dev/null 2>&1; then
  echo "book.sh: mdbook not found; installing it from crates.io (cargo install --locked mdbook)" >&2
  cargo install --locked mdbook
fi
mdbook build docs
echo "book.sh: open docs/book/index.html"
