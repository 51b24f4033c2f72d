# Sourced by the scripts that test `duet serve` (tests/npm/serve, tests/dist, tests/server):
#   serve_test_setup PREFIX [SIGNAL]  makes $work (a temporary directory) and an EXIT trap that
#                                     sends SIGNAL (default TERM; KILL also ends mpirun's ranks)
#                                     to $server_pid, once it is set, and removes $work
#   serve_wait_healthy TRIES          waits (TRIES × 0.1 s at most) until the server started as
#                                     $server_pid, writing to $work/server.out and server.err,
#                                     prints its port and answers /health; sets $port
serve_test_setup() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  server_pid=""
  serve_kill_signal=${2:-TERM}
  trap serve_test_cleanup EXIT
}

serve_test_cleanup() {
  if [ -n "$server_pid" ]; then
    if [ "$serve_kill_signal" = KILL ]; then pkill -KILL -P "$server_pid" 2>/dev/null || true; fi
    kill "-$serve_kill_signal" "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}

serve_wait_healthy() {
  port=""
  for _ in $(seq 1 "$1"); do
    port=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/server.out" 2>/dev/null | sed 's/.*://' || true)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    if ! kill -0 "$server_pid" 2>/dev/null; then
      cat "$work/server.err" >&2
      echo "FAIL: duet serve exited" >&2
      exit 1
    fi
    port=""
    sleep 0.1
  done
  cat "$work/server.err" >&2
  echo "FAIL: duet serve did not become healthy" >&2
  exit 1
}
