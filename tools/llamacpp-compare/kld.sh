#!/usr/bin/env bash
# llama.cpp's accuracy at 8 and 4 bits on our model, measured as `duet bench accuracy` measures
# duet's: the model's bf16 GGUF is the reference; llama-quantize makes Q8_0 and Q4_0 GGUFs of it
# (Q4_0 as llama-quantize makes it, and --pure);
# llama-perplexity --kl-divergence-base writes the reference's log-probabilities on TEXT (chunks
# of CTX tokens, positions CTX/2 to CTX-2 of each), then --kl-divergence scores each GGUF against
# them. Also scores the bf16 GGUF against itself (the floor: the base file keeps log-probabilities
# as 16-bit integers) and checks that llama.cpp's tokenizer gives duet's token ids for TEXT.
# Prints one line per GGUF: mean KLD, 99% KLD, max KLD, "Same top p" (top-1 agreement).
#
# Usage (from the repo root): tools/llamacpp-compare/kld.sh [MODEL_DIR] [TEXT] [CTX]
#   MODEL_DIR  default models/qwen3-moe-small (bf16 qwen3_moe, as to_gguf.py reads)
#   TEXT       default bench/data/accuracy_text.txt (duet bench accuracy's built-in text)
#   CTX        default 512
# Work files (GGUFs, the base log-probabilities, logs) go to $OUT (default /tmp/duet-kld):
# about 1.0 + 0.5 + 0.3 + 0.3 GB of GGUFs and 0.3 GB of log-probabilities for the small preset.
# THREADS (default 2) is llama.cpp's -t; DUET (default build/duet) tokenizes for the check.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
model_dir="${1:-$repo/models/qwen3-moe-small}"
text="${2:-$repo/bench/data/accuracy_text.txt}"
ctx="${3:-512}"
out="${OUT:-/tmp/duet-kld}"
threads="${THREADS:-2}"
mkdir -p "$out"
bin="$("$here/build-llamacpp.sh")"

bf16="$out/bf16.gguf"
[ -f "$bf16" ] || /usr/bin/python3 "$here/to_gguf.py" "$model_dir" "$bf16" >&2
# name:type:flags. llama-quantize's Q4_0 keeps the output head at Q6_K (its default for every
# type but Q8_0); --pure makes it Q4_0 too, as duet's int4 quantizes it.
for v in q8_0:Q8_0: q4_0:Q4_0: q4_0_pure:Q4_0:--pure; do
  IFS=: read -r name type flags <<<"$v"
  gguf="$out/$name.gguf"
  if [ ! -f "$gguf" ]; then
    # shellcheck disable=SC2086  # flags: none or one
    "$bin/llama-quantize" $flags "$bf16" "$gguf" "$type" "$threads" >"$out/quantize_$name.log" 2>&1
  fi
  # What llama-quantize chose per tensor (counts per type).
  echo "$name tensor types: $(grep -oE "converting to [A-Za-z0-9_]+" "$out/quantize_$name.log" \
      | sort | uniq -c | awk '{printf "%s %s, ", $1, $4}')" >&2
done

# The same tokens: llama.cpp's tokenizer of the GGUF against duet's of the model directory.
"$bin/llama-tokenize" -m "$bf16" -f "$text" --ids --log-disable 2>/dev/null \
    | tr -d '[] \n' >"$out/tokens_llama.txt"
"${DUET:-$repo/build/duet}" tokenize "$model_dir" <"$text" | tr -d '[] \n' >"$out/tokens_duet.txt"
if cmp -s "$out/tokens_llama.txt" "$out/tokens_duet.txt"; then
  echo "tokens: llama.cpp and duet give the same $(awk -F, '{print NF}' "$out/tokens_duet.txt") ids for $text" >&2
else
  echo "tokens: llama.cpp and duet DIFFER on $text (see $out/tokens_*.txt); the figures are not on the same tokens" >&2
fi

base="$out/base_c$ctx.kld"
"$bin/llama-perplexity" -m "$bf16" -f "$text" -c "$ctx" -t "$threads" \
    --kl-divergence-base "$base" >"$out/base.log" 2>&1
printf "%-10s %20s %12s %12s %14s\n" "gguf" "mean KLD" "99% KLD" "max KLD" "same top p %"
for name in bf16 q8_0 q4_0 q4_0_pure; do
  log="$out/kld_$name.log"
  "$bin/llama-perplexity" -m "$out/$name.gguf" -t "$threads" -c "$ctx" \
      --kl-divergence-base "$base" --kl-divergence >"$log" 2>&1
  awk -v name="$name" '
    /^Mean    KLD:/ { mean = $3 " ± " $5 }
    /^99.0%   KLD:/ { p99 = $3 }
    /^Maximum KLD:/ { max = $3 }
    /^Same top p:/ { top = $4 " ± " $6 }
    END { printf "%-10s %20s %12s %12s %16s\n", name, mean, p99, max, top }' "$log"
done
