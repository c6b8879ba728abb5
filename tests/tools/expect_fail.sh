#!/usr/bin/env bash
# expect_fail.sh REGEX COMMAND...: passes when COMMAND exits non-zero and its
# stderr matches REGEX (a tool's bad-input contract).
regex=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "expected a failure, got exit 0: $*"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$err"; then
  echo "exit $rc but stderr does not match '$regex':"
  echo "$err"
  exit 1
fi
exit 0
