#!/usr/bin/env bash
# duet's tokenizer and chat templates against the JavaScript references (see compare.mjs).
# The npm packages (versions pinned in package.json here) are installed once into a cache outside
# the repository, ${DUET_NPM_CACHE:-$HOME/.cache/duet-npm}, and reused while package.json is
# unchanged. Fails, never skips, when node/npm are missing or the registry cannot be reached.
# Usage: run_npm_test.sh DUET_BINARY
set -euo pipefail
duet=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
cache=${DUET_NPM_CACHE:-$HOME/.cache/duet-npm}

for tool in node npm; do
  command -v "$tool" > /dev/null || { echo "FAIL: $tool is not installed (scripts/install-deps.sh installs it)"; exit 1; }
done
mkdir -p "$cache"
if ! cmp -s "$here/package.json" "$cache/package.json" || [ ! -f "$cache/.installed" ]; then
  rm -f "$cache/.installed"
  cp "$here/package.json" "$cache/package.json"
  if ! (cd "$cache" && npm install --no-audit --no-fund --no-save --loglevel=error); then
    echo "FAIL: npm install into $cache failed (is the npm registry reachable?)"
    exit 1
  fi
  touch "$cache/.installed"
fi
exec node "$here/compare.mjs" "$duet" "$cache/node_modules"
