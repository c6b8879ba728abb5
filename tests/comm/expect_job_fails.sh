#!/usr/bin/env bash
# expect_job_fails.sh SECONDS REGEX COMMAND...: passes when COMMAND exits
# non-zero within SECONDS and its output matches REGEX (a failing rank must
# bring the whole job down, never leave it hanging).
limit=$1
regex=$2
shift 2
start=$(date +%s%N)
out=$(timeout 60 "$@" 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "exit $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then echo "expected the job to fail"; echo "$out"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "the job hung (killed by timeout)"; echo "$out"; exit 1; fi
if [ "$elapsed_ms" -gt $((limit * 1000)) ]; then echo "took longer than ${limit}s"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "output does not match '$regex':"; echo "$out"; exit 1; fi
exit 0
