#!/usr/bin/env bash
# Builds llama.cpp natively (-DGGML_NATIVE=ON: the instruction sets of this CPU) from the source
# that node-llama-cpp's npm package carries as a git bundle, into a cache outside the repository:
# llama-bench, llama-batched-bench, llama-quantize, llama-perplexity (its --kl-divergence) and
# llama-tokenize. Nothing is fetched but the npm package.
# The prebuilt binary of the same package decodes one sequence 1.5–2.3× slower on a Zen 4, so
# it is no fair peer.
#
# Usage: tools/llamacpp-compare/build-llamacpp.sh   (prints the directory of the binaries)
# Cache: $LLAMACPP_CACHE (default ~/.cache/duet-llamacpp): node_modules/, src/ (the clone),
# src/build/bin/. Idempotent: skips what is there. About 10 minutes on 2 cores.
# LLAMACPP_NO_AMX=1 builds into src/build-noamx/ without AMX (-mno-amx-*), for CPUs that report
# AMX where ggml's AMX kernels die: on the Emerald Rapids VM of 2026-11-27 the native build's
# Q8_0 and Q4_0 runs stopped with SIGILL at `tilezero` in a worker thread (the kernel granted
# the tile state); bf16 GGUFs, which take no AMX path, ran.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${LLAMACPP_CACHE:-$HOME/.cache/duet-llamacpp}"
version="$(sed -n 's/.*"node-llama-cpp": "\([^"]*\)".*/\1/p' "$here/package.json")"
mkdir -p "$cache"
bundle="$cache/node_modules/node-llama-cpp/llama/gitRelease.bundle"
if [ ! -f "$bundle" ]; then
  # --ignore-scripts: the package's postinstall would fetch or build binaries of its own.
  (cd "$cache" && npm install --no-audit --no-fund --ignore-scripts "node-llama-cpp@$version" >&2)
fi
if [ ! -d "$cache/src/.git" ]; then
  git clone -q "$bundle" "$cache/src" >&2
fi
build="$cache/src/build"
flags=()
if [ "${LLAMACPP_NO_AMX:-0}" = 1 ]; then
  build="$cache/src/build-noamx"
  # Explicit -mno-* flags win over -march=native whatever their order, so ggml's AMX code
  # (compiled under __AMX_INT8__) is left out.
  flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
      -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
bin="$build/bin"
targets="llama-bench llama-batched-bench llama-quantize llama-perplexity llama-tokenize"
missing=0
for t in $targets; do [ -x "$bin/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
  cmake -S "$cache/src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" >&2
  nice -n 19 cmake --build "$build" -j "$(nproc)" \
      --target $targets >&2
fi
echo "$bin"
