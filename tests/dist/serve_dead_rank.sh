#!/usr/bin/env bash
# `duet serve` on two MPI ranks; rank 1 is stopped (SIGSTOP, a hung host) or killed (SIGKILL, a
# crashed one) in the middle of streamed requests and a non-streamed one. The streams must end with
# an error event, the non-streamed request with HTTP 503, and new requests must get HTTP 503
# within the 10 s limit, never hang. With TIMEOUT, the server runs with --dist-timeout TIMEOUT and
# the error must come no sooner than TIMEOUT − 1 s (the option took effect: the default is 4 s)
# and within TIMEOUT + 6 s.
# Usage: serve_dead_rank.sh DUET_BINARY STOP|KILL [TIMEOUT]
set -euo pipefail
duet=$(realpath "$1")
signal=${2:-STOP}
timeout_s=${3:-}
extra=()
min_ms=0
limit_ms=10000
if [ -n "$timeout_s" ]; then
  extra=(--dist-timeout "$timeout_s")
  min_ms=$(( (timeout_s - 1) * 1000 ))
  limit_ms=$(( (timeout_s + 6) * 1000 ))
fi
source "$(dirname "$0")/../server/serve_lib.sh"
serve_test_setup duet-dead-rank KILL

"$duet" make-model "$work/model" --arch qwen3_moe --preset tiny --seed 7 >/dev/null
"$duet" serve "$work/model" --host 127.0.0.1 --port 0 --served-model-name tiny \
  --data-parallel-size 2 --enable-expert-parallel "${extra[@]}" >"$work/server.out" 2>"$work/server.err" &
server_pid=$!

serve_wait_healthy 200
url="http://127.0.0.1:$port/v1/completions"

# Rank 1 is the child of mpirun whose environment says so.
rank1=""
for pid in $(pgrep -P "$server_pid"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    rank1=$pid
  fi
done
[ -n "$rank1" ] || { echo "FAIL: cannot find rank 1 among mpirun's children" >&2; exit 1; }

# Two long streamed requests: the least loaded rule puts the second one on rank 1.
for i in 1 2; do
  curl -sN "$url" -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2040, "ignore_eos": true,
         "temperature": 0, "stream": true}' >"$work/stream$i.txt" &
done
# And one not streamed: its status line must say 503 once the rank is gone (duet holds it back
# until the request ends), with the OpenAI error object as its body.
curl -s -o "$work/whole.json" -w '%{http_code}' --max-time 20 "$url" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": [4, 5, 6], "max_tokens": 2040, "ignore_eos": true,
       "temperature": 0}' >"$work/whole.status" &
whole_pid=$!
# Kill as soon as both streams are under way: the tiny model streams 2000 tokens in about a
# second, so a fixed wait can miss them.
for _ in $(seq 1 500); do  # up to 5 s
  if grep -q '^data:' "$work/stream1.txt" 2>/dev/null && grep -q '^data:' "$work/stream2.txt" 2>/dev/null; then
    break
  fi
  sleep 0.01
done
kill "-$signal" "$rank1"
start=$(date +%s%N)
wait_streams=0
for _ in $(seq 1 $(( limit_ms / 100 + 50 ))); do  # up to the limit and 5 s
  if grep -q '"error"' "$work/stream1.txt" && grep -q '"error"' "$work/stream2.txt"; then
    wait_streams=1
    break
  fi
  sleep 0.1
done
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "streams ended with an error after ${elapsed_ms} ms"
if [ "$wait_streams" != 1 ]; then
  echo "FAIL: in-flight streams did not end with an error" >&2
  tail -c 400 "$work"/stream*.txt >&2
  exit 1
fi
[ "$elapsed_ms" -lt "$limit_ms" ] || { echo "FAIL: the error took more than $limit_ms ms" >&2; exit 1; }
[ "$elapsed_ms" -ge "$min_ms" ] || { echo "FAIL: the error came before --dist-timeout ($min_ms ms)" >&2; exit 1; }
wait "$whole_pid" || true
echo "the request in flight, not streamed, got HTTP $(cat "$work/whole.status"): $(head -c 300 "$work/whole.json")"
[ "$(cat "$work/whole.status")" = 503 ] || { echo "FAIL: expected 503 for the request in flight" >&2; exit 1; }
grep -q '"type":"service_unavailable"' "$work/whole.json" || { echo "FAIL: no OpenAI error body" >&2; exit 1; }
status=$(curl -s -o "$work/new.json" -w '%{http_code}' --max-time 10 "$url" \
  -H 'Content-Type: application/json' -d '{"model": "tiny", "prompt": [1, 2], "max_tokens": 2}')
echo "a new request got HTTP $status: $(cat "$work/new.json")"
[ "$status" = 503 ] || { echo "FAIL: expected 503" >&2; exit 1; }
kill -KILL "$rank1" 2>/dev/null || true
echo "PASS: error after ${elapsed_ms} ms, then 503"
