#!/usr/bin/env bash
# scripts/sanitize.sh address,undefined|thread [GTEST_FILTER]: builds duet and its unit tests with
# those sanitizers into build-asan/ or build-tsan/ and runs the GoogleTest binary (all of it, or
# the filter). Any report fails it. CI runs a representative filter of each (tests/cmake/
# sanitize.cmake): the parsers, kernels and dispatchers under ASan and UBSan; the threaded parts
# (thread pool, communication thread, in-process ranks, engine loop, overlap executors) under TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=$1
filter=${2:-*}
case "$sanitizers" in
  thread) dir=build-tsan ;;
  *) dir=build-asan ;;
esac
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDUET_SANITIZE="$sanitizers" > /dev/null
cmake --build "$dir" -j "$(nproc)" --target duet duet_tests > /dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
cd "$dir"
./duet_tests --gtest_filter="$filter"
