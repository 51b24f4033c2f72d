#!/usr/bin/env bash
# `duet serve` on the tiny preset with a KV cache too small for its load (so requests are
# preempted and recomputed), under `duet bench soak`: many streaming clients, a new connection per
# request, random prompt and output lengths, 10% hanging up mid-stream, 10% reading slowly. The
# soak fails on any error, lost or mixed request, or /metrics that disagree with the client; here
# the server must also have preempted and its descriptors must be back near where they started.
# With "exact" the server runs --batch-invariant and the soak --exact: every request that runs
# to its end must stream exactly its text alone (no near-tie flips).
# Usage: soak_test.sh DUET_BINARY [SECONDS] [CLIENTS] [exact]
set -euo pipefail
duet=$(realpath "$1")
seconds=${2:-60}
clients=${3:-64}
serve_flags=()
soak_flags=()
if [ "${4:-}" = exact ]; then
  serve_flags=(--batch-invariant)
  soak_flags=(--exact)
fi
source "$(dirname "$0")/serve_lib.sh"
serve_test_setup duet-soak

"$duet" make-model "$work/model" --arch qwen3_moe --preset tiny --seed 7 >/dev/null
# 0.25 MiB of bf16 KV is 64 blocks of 16 positions: about five of the longest requests at once.
DUET_API_KEY=soak-key "$duet" serve "$work/model" --host 127.0.0.1 --port 0 --served-model-name tiny \
  --kv-cache-memory 0.000244140625 "${serve_flags[@]}" >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
serve_wait_healthy 100
fds_before=$(ls "/proc/$server_pid/fd" | wc -l)

DUET_API_KEY=soak-key "$duet" bench soak --base-url "http://127.0.0.1:$port" --clients "$clients" \
  --duration "$seconds" --report-every 15 --server-pid "$server_pid" --seed 3 "${soak_flags[@]}" \
  | tee "$work/soak.txt"

kill -0 "$server_pid" || { echo "FAIL: the server died" >&2; exit 1; }
preempted=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^duet:num_preemptions_total{[^}]*} //p')
echo "preemptions: $preempted"
[ "${preempted%.*}" -gt 0 ] || { echo "FAIL: the soak never forced a preemption" >&2; exit 1; }
sleep 1
fds_after=$(ls "/proc/$server_pid/fd" | wc -l)
echo "server descriptors: $fds_before before, $fds_after after"
[ "$fds_after" -le $((fds_before + 4)) ] || { echo "FAIL: descriptors leaked" >&2; exit 1; }
echo "PASS: soak"
