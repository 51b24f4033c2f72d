#!/usr/bin/env bash
# fuzz/run.sh TARGET [libFuzzer flags...]: fuzzes one target from its seed corpus
# (fuzz/corpus/TARGET), writing what it finds to ~/.cache/duet-fuzz/TARGET (outside the
# repository) and crashes to ~/.cache/duet-fuzz/crashes/. E.g. `fuzz/run.sh config -runs=1000000`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1
shift
[ -x "build-fuzz/fuzz_$target" ] || fuzz/build.sh
work="${HOME}/.cache/duet-fuzz"
mkdir -p "$work/$target" "$work/crashes"
exec "build-fuzz/fuzz_$target" "$work/$target" "fuzz/corpus/$target" \
  -artifact_prefix="$work/crashes/$target-" -print_final_stats=1 "$@"
