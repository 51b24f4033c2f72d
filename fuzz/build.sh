#!/usr/bin/env bash
# Configures and builds the libFuzzer targets (clang, AddressSanitizer + UBSan) into build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DDUET_FUZZ=ON \
  -DDUET_BUILD_TESTS=OFF > /dev/null
targets=()
for t in api_request config safetensors tokenizer_json chat_template tokenize tiktoken; do
  targets+=(--target "fuzz_$t")
done
cmake --build build-fuzz -j "$(nproc)" "${targets[@]}"
