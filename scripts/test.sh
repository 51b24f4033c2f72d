#!/usr/bin/env bash
# The README's second command: the whole test suite (GoogleTest units, golden logits against the
# NumPy reference, CLI error cases) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
