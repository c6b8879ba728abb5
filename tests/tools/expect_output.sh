#!/usr/bin/env bash
# expect_output.sh REGEX COMMAND...: passes when COMMAND exits with status 0
# and its output (stdout and stderr) matches REGEX (Perl syntax, `.` matching
# newlines too). ctest's PASS_REGULAR_EXPRESSION alone ignores the exit
# status, so a crash after the matching line would pass.
# A newline in REGEX (CMake's "\n") becomes the escape grep -P reads.
regex=${1//$'\n'/\\n}
shift
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "expected exit status 0, got $rc: $*"
  echo "$out"
  exit 1
fi
if ! printf '%s' "$out" | grep -Pzq -- "(?s)$regex"; then
  echo "exit 0 but the output does not match '$regex':"
  echo "$out"
  exit 1
fi
exit 0
