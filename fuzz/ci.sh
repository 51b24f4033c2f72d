#!/usr/bin/env bash
# CI's share of the fuzzing: builds the targets, replays every seed corpus (each input once,
# under ASan and UBSan), then fuzzes each target for FUZZ_SECONDS (default 10). Any crash, leak or
# sanitizer report fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz/build.sh > /dev/null
seconds=${FUZZ_SECONDS:-10}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in api_request config safetensors tokenizer_json chat_template tokenize tiktoken; do
  echo "== $t: replaying $(ls "fuzz/corpus/$t" | wc -l) seeds, then fuzzing ${seconds} s"
  "build-fuzz/fuzz_$t" -runs=0 "fuzz/corpus/$t" 2>&1 | tail -1
  mkdir -p "$scratch/$t"
  "build-fuzz/fuzz_$t" "$scratch/$t" "fuzz/corpus/$t" -max_total_time="$seconds" \
    -artifact_prefix="$scratch/" -print_final_stats=1 2>&1 | grep -E "stat::number_of_executed_units|Done"
done
