#!/usr/bin/env bash
# One llama.cpp measurement with the native binaries (build-llamacpp.sh), in the shape of
# `duet bench latency --batch B --prompt-len P --gen-len G`: prints llama.cpp's own output, then
# "prefill: X tok/s" and "decode: Y tok/s" as compare.sh reads them.
#   batch 1: llama-bench, prompt processing pP and generation tgG (each repeated 3 times; its mean)
#   batch B > 1: llama-batched-bench -npl B: S_PP (B prompts of P) and S_TG (B sequences decoding
#   G tokens each), the column llama.cpp's users quote as batched decode tok/s.
# Usage: llama-native.sh BIN_DIR GGUF BATCH PROMPT_LEN GEN_LEN THREADS
set -euo pipefail
bin="$1" gguf="$2" b="$3" p="$4" g="$5" t="$6"
if [ "$b" -eq 1 ]; then
  out="$("$bin/llama-bench" -m "$gguf" -t "$t" -p "$p" -n "$g" -r 3 -o csv 2>/dev/null)"
  echo "$out"
  # CSV columns include n_prompt, n_gen and avg_ts.
  echo "$out" | awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    { gsub(/"/, "") }
    $col["n_prompt"] > 0 && $col["n_gen"] == 0 { printf "prefill: %s tok/s\n", $col["avg_ts"] }
    $col["n_gen"] > 0 && $col["n_prompt"] == 0 { printf "decode: %s tok/s\n", $col["avg_ts"] }'
else
  ctx=$(( b * (p + g) + 256 ))
  out="$("$bin/llama-batched-bench" -m "$gguf" -t "$t" -c "$ctx" -b 2048 -ub 512 \
      -npp "$p" -ntg "$g" -npl "$b" 2>/dev/null)"
  echo "$out"
  # The table's data row: |PP|TG|B|N_KV|T_PP s|S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|
  echo "$out" | awk -F'|' -v b="$b" '$4 + 0 == b && $2 + 0 > 0 {
    gsub(/ /, ""); printf "prefill: %s tok/s\ndecode: %s tok/s\n", $7, $9 }'
fi
