#!/usr/bin/env bash
# The README's first command: install dependencies, build, make the built-in default model
# (qwen3_moe `small`, bf16, seeded random weights) and generate with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
model=models/qwen3-moe-small
if [ ! -f "$model/config.json" ]; then
  build/duet make-model "$model" --arch qwen3_moe --preset small --seed 0
fi
build/duet generate "$model" --prompt "The quick brown fox" --max-tokens 32
