#!/usr/bin/env bash
# Runs llama.cpp and duet (`duet bench latency`) on the same shapes, alternating engine by engine,
# each shape ROUNDS times, and prints one summary line per run. llama.cpp is built natively
# (build-llamacpp.sh; llama-native.sh runs llama-bench for batch 1, llama-batched-bench beyond);
# LLAMA_PREBUILT=1 runs node-llama-cpp's prebuilt binary instead (bench.mjs), which is no fair
# peer (1.5–2.3x slower than native at batch-1 decode on a Zen 4): for reference only.
# The machine is shared: before every run it waits (up to 10 min) until under 15 % of the CPUs
# are busy over 3 s, and after every run it prints "others N %", the share of the 2 CPUs that
# processes other than the run itself used during it (from /proc/stat less the run's own user +
# system time). Runs with others above ~10 % read low and should be set aside.
#
# Usage (from the repo root): tools/llamacpp-compare/compare.sh [ROUNDS] [GGUF ...]
#   ROUNDS  default 2
#   GGUF    default /tmp/qwen3-moe-small-bf16.gguf (several: each is run as its own llama.cpp row)
# Logs go to $OUT (default /tmp/llamacpp-compare-logs); SHAPES picks the shapes (see below);
# DUET_ARGS (e.g. "--quantization int8") adds flags to duet's run, for format-for-format runs
# against a Q8_0 GGUF (kld.sh makes one); DUET_ALT_ARGS (e.g. "--no-repack" or
# "--quantization int4") adds a second duet run per shape with those flags. MODEL_DIR: duet's
# model (default models/qwen3-moe-small, the weights the GGUFs were made from).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
rounds="${1:-2}"
shift || true
ggufs=("$@")
[ ${#ggufs[@]} -eq 0 ] && ggufs=(/tmp/qwen3-moe-small-bf16.gguf)
out="${OUT:-/tmp/llamacpp-compare-logs}"
mkdir -p "$out"
model_dir="${MODEL_DIR:-$repo/models/qwen3-moe-small}"
threads=2

# Busy share of all CPUs over 3 s, in percent, from /proc/stat.
busy_percent() {
  local a b
  read -r -a a < <(head -1 /proc/stat)
  sleep 3
  read -r -a b < <(head -1 /proc/stat)
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  echo $(( 100 * (total - idle) / (total > 0 ? total : 1) ))
}

wait_quiet() {
  local waited=0 busy
  while busy=$(busy_percent); [ "$busy" -ge 15 ]; do
    waited=$(( waited + 3 ))
    if [ "$waited" -ge 600 ]; then return; fi
  done
}

# run_measured LOG CMD...: runs CMD with its output in LOG; sets others_pct to the share of the
# CPUs used by other processes meanwhile.
run_measured() {
  local log="$1" a b t0 t1 own
  shift
  read -r -a a < <(head -1 /proc/stat)
  t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$log.time" "$@" >"$log" 2>&1
  t1=$(date +%s.%N)
  read -r -a b < <(head -1 /proc/stat)
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  own=$(tail -1 "$log.time")
  others_pct=$(awk -v busy=$(( total - idle )) -v own="$own" -v t0="$t0" -v t1="$t1" \
      -v n="$(nproc)" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(own, o, " "); v = (busy / hz - o[1] - o[2]) / ((t1 - t0) * n) * 100;
        printf "%.0f", v < 0 ? 0 : v }')
}

summary() {  # summary LOG: "prefill X tok/s  decode Y tok/s"
  grep -E '^(prefill|decode): +[0-9.]+ tok/s' "$1" | awk '{printf "%s %s tok/s  ", $1, $2}'
}

# shape: "batch prompt_len gen_len"; SHAPES="8 128 64;32 128 64" runs only those.
IFS=';' read -r -a shapes <<<"${SHAPES:-1 512 8;1 128 64;8 128 64;32 128 64}"

echo "duet: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'), binary built $(date -r "$repo/build/duet" '+%F %T')"
llama_bin=""
if [ -z "${LLAMA_PREBUILT:-}" ]; then
  llama_bin="$("$here/build-llamacpp.sh")"
  echo "llama.cpp: native build in $llama_bin ($(git -C "$llama_bin/../.." log -1 --format=%h 2>/dev/null), node-llama-cpp's bundle)"
fi
for round in $(seq 1 "$rounds"); do
  for shape in "${shapes[@]}"; do
    read -r b p g <<<"$shape"
    tag="b${b}_p${p}_g${g}_r${round}"
    for gguf in "${ggufs[@]}"; do
      wait_quiet
      log="$out/llama_$(basename "$gguf" .gguf)_$tag.log"
      if [ -n "$llama_bin" ]; then
        run_measured "$log" "$here/llama-native.sh" "$llama_bin" "$gguf" "$b" "$p" "$g" "$threads"
      else
        run_measured "$log" node "$here/bench.mjs" --model "$gguf" --batch "$b" --prompt-len "$p" \
            --gen-len "$g" --threads "$threads"
      fi
      echo "$(date -u '+%F %T') llama.cpp $(basename "$gguf" .gguf) b=$b p=$p g=$g: $(summary "$log")" \
           "others ${others_pct} %"
    done
    wait_quiet
    log="$out/duet_$tag.log"
    # shellcheck disable=SC2086  # DUET_ARGS is a list of flags
    run_measured "$log" "$repo/build/duet" bench latency "$model_dir" --threads "$threads" \
        --batch "$b" --prompt-len "$p" --gen-len "$g" ${DUET_ARGS:-}
    echo "$(date -u '+%F %T') duet ${DUET_ARGS:-} b=$b p=$p g=$g: $(summary "$log")" \
         "others ${others_pct} %, $(grep -oE 'measured read bandwidth [0-9.]+ GB/s' "$log")"
    if [ -n "${DUET_ALT_ARGS:-}" ]; then
      wait_quiet
      log="$out/duet_alt_$tag.log"
      # shellcheck disable=SC2086  # DUET_ALT_ARGS is a list of flags
      run_measured "$log" "$repo/build/duet" bench latency "$model_dir" --threads "$threads" \
          --batch "$b" --prompt-len "$p" --gen-len "$g" $DUET_ALT_ARGS
      echo "$(date -u '+%F %T') duet $DUET_ALT_ARGS b=$b p=$p g=$g: $(summary "$log")" \
           "others ${others_pct} %, $(grep -oE 'measured read bandwidth [0-9.]+ GB/s' "$log")"
    fi
  done
done
