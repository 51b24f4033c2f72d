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
  local status=$?
  if [ -n "$server_pid" ]; then
    if [ "$serve_kill_signal" = KILL ]; then pkill -KILL -P "$server_pid" 2>/dev/null || true; fi
    kill "-$serve_kill_signal" "$server_pid" 2>/dev/null || true
    # A server that outlives its signal by 20 s is a shutdown hang: say so with what it printed
    # and its process tree, then kill it, rather than leave ctest to time out with nothing.
    local waited=0
    while kill -0 "$server_pid" 2>/dev/null && [ "$waited" -lt 200 ]; do
      sleep 0.1
      waited=$((waited + 1))
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "FAIL: duet serve (pid $server_pid) still running 20 s after SIG$serve_kill_signal" >&2
      serve_dump_state
      pkill -KILL -P "$server_pid" 2>/dev/null || true
      kill -KILL "$server_pid" 2>/dev/null || true
      status=1
    fi
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$status"
}

# What the server printed last and its processes with their threads' states, for a failure that
# is a hang (a stuck shutdown, a client that waited past its limit).
serve_dump_state() {
  echo "--- server stderr (last 30 lines) ---" >&2
  tail -30 "$work/server.err" >&2 2>/dev/null || true
  echo "--- server processes ---" >&2
  local p
  for p in "$server_pid" $(pgrep -P "$server_pid" 2>/dev/null) $(pgrep -f "orted|prted" 2>/dev/null); do
    [ -d "/proc/$p" ] || continue
    echo "pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-200)" >&2
    for t in /proc/"$p"/task/*; do
      echo "  $(cat "$t/comm" 2>/dev/null) $(awk '{print $3}' "$t/stat" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)" >&2
    done
  done
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
