#!/bin/sh
# Runs its arguments (an mpirun command line) and then prints how long after a rank's line
# "... at unix time <ms> ms" (the moment it killed itself) the job ended, and mpirun's exit
# status: a job that loses a rank must end within seconds, never hang. For tests/cmake/dist.cmake.
out=$(mktemp) || exit 1
"$@" >"$out" 2>&1
status=$?
end=$(date +%s%3N)
cat "$out"
killed=$(sed -n 's/.* at unix time \([0-9][0-9]*\) ms.*/\1/p' "$out" | head -n 1)
rm -f "$out"
if [ -z "$killed" ]; then
  echo "no rank reported its kill; mpirun exited with status $status"
  exit 1
fi
ms=$((end - killed))
printf 'job ended %d.%03d s after the kill; mpirun exited with status %d\n' \
  $((ms / 1000)) $((ms % 1000)) "$status"
