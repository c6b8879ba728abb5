#!/usr/bin/env bash
# train_summary_rate.sh DISTCA_TRAIN DOCS_FILE LOG: the summary's tok/s is the
# tokens of the steps it averages (all but the first) over their time, read
# back from the --json-log, when the batches differ in size.
set -u
train=$1 docs=$2 log=$3
rm -f "$log"
out=$("$train" --model tiny --ranks 2 --attention colocated --docs-file "$docs" --steps 3 --json-log "$log") || exit 1
printed=$(grep -o 'summary over 2 steps.* \([0-9.]*K*\) tok/s' <<<"$out" | grep -o '[0-9.]*K* tok/s' | cut -d' ' -f1)
[ -n "$printed" ] || { echo "no summary rate in:"; echo "$out"; exit 1; }
# Top-level fields are written in key order: "step_s" then "tokens".
expected=$(tail -n 2 "$log" | grep -o '"step_s":[0-9.e+-]*,"tokens":[0-9]*' |
  awk -F'[:,]' '{s += $2; t += $4} END {printf "%.6g", t / s}')
awk -v p="$printed" -v e="$expected" 'BEGIN {
  v = p; if (p ~ /K$/) { sub(/K$/, "", v); v *= 1000 }
  if (v < 0.99 * e || v > 1.01 * e) { printf "summary rate %s, expected %s tok/s\n", p, e; exit 1 }
}'
