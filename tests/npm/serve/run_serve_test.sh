#!/usr/bin/env bash
# Runs serve.test.mjs (node:test + the official openai client) against a real `duet serve` on a
# tiny model (qwen3_moe, or the architecture in $DUET_SERVE_TEST_ARCH: kimi_k2 serves through its
# tiktoken tokenizer). Usage: run_serve_test.sh DUET_BINARY [EXTRA SERVE FLAGS...]
# (e.g. --data-parallel-size 2 --enable-expert-parallel to serve from two MPI ranks).
# The npm packages go to ${DUET_NPM_CACHE:-$HOME/.cache/duet-npm}/serve, never into the repo. If
# npm cannot install them the test fails: it never skips. The server listens on 127.0.0.1 on a
# free port and is always killed on exit.
set -euo pipefail
duet=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
cache="${DUET_NPM_CACHE:-$HOME/.cache/duet-npm}/serve"
mkdir -p "$cache"

if ! cmp -s "$here/package.json" "$cache/package.json" || [ ! -d "$cache/node_modules/openai" ]; then
  cp "$here/package.json" "$cache/package.json"
  echo "installing the openai npm package into $cache"
  if ! (cd "$cache" && npm install --no-audit --no-fund --loglevel=error); then
    rm -f "$cache/package.json"
    echo "FAIL: npm could not install the openai package (is the npm registry reachable?)" >&2
    exit 1
  fi
fi
cp "$here/serve.test.mjs" "$cache/serve.test.mjs"

source "$here/../../server/serve_lib.sh"
serve_test_setup duet-serve-test

"$duet" make-model "$work/model" --arch "${DUET_SERVE_TEST_ARCH:-qwen3_moe}" --preset tiny --seed 7 >/dev/null
# A small KV pool so that the cache limits are reachable: the tiny model's block (16 positions x
# 2 layers x (32 + 32) values, bf16 like its weights under the default --kv-cache-dtype auto) is
# 4 KiB, so 0.25 MiB is 64 blocks = 1024 positions, half the context; 16 concurrent requests
# fill it and get preempted.
# The server requires an API key (from the environment, as DUET_API_KEY); the client sends it.
api_key="duet-test-key-$$"
DUET_API_KEY="$api_key" "$duet" serve "$work/model" --host 127.0.0.1 --port 0 --served-model-name tiny \
  --kv-cache-memory 0.000244140625 --max-num-seqs 32 --max-num-batched-tokens 256 "$@" \
  >"$work/server.out" 2>"$work/server.err" &
server_pid=$!

serve_wait_healthy 100  # up to 10 s for the model to load and the port to be printed
# The listen backlog (ss shows it as a listening socket's Send-Q): httplib's compiled-in 5 made a
# burst of new connections overflow it (clients waited a 1 s SYN retransmit or failed); duet raises
# it to SOMAXCONN after binding.
backlog=$(ss -ltnH "sport = :$port" | awk '{print $3}' | head -1)
if [ -z "$backlog" ] || [ "$backlog" -lt 128 ]; then
  echo "FAIL: the server listens with a backlog of '${backlog}', want >= 128" >&2
  exit 1
fi

# --header-timeout among the flags: the test of slow clients runs against it.
header_timeout=0
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  if [ "${args[i]}" = --header-timeout ]; then header_timeout=${args[i + 1]}; fi
done

status=0
(cd "$cache" && DUET_TEST_HEADER_TIMEOUT="$header_timeout" DUET_BASE_URL="http://127.0.0.1:$port" DUET_MODEL=tiny DUET_TEST_API_KEY="$api_key" \
  timeout 480 node --test --test-timeout=120000 serve.test.mjs) || status=$?
if [ "$status" -eq 124 ]; then  # before ctest's 600 s, so that a hang leaves its evidence
  echo "FAIL: the client's tests ran past 480 s" >&2
  serve_dump_state
fi
# A second server on the same port must fail loudly, not share the port.
if "$duet" serve "$work/model" --host 127.0.0.1 --port "$port" >"$work/second.out" 2>&1; then
  echo "FAIL: a second duet serve started on port $port" >&2
  status=1
elif ! grep -q "cannot listen on 127.0.0.1:$port" "$work/second.out"; then
  echo "FAIL: the second server's error does not name the port: $(cat "$work/second.out")" >&2
  status=1
fi
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "FAIL: duet serve died during the tests" >&2
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "--- server stderr ---" >&2
  tail -50 "$work/server.err" >&2
fi
exit "$status"
