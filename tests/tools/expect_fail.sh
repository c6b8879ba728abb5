#!/usr/bin/env bash
# expect_fail.sh REGEX COMMAND...: passes when COMMAND exits with status 2 (the
# tools' failure status) and its stderr matches REGEX: the bad-input contract.
# Any other status fails the test: 0 (accepted bad input), a signal's 128+N
# (a crash that happened to print a matching message) or 127 (not found).
regex=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 2 ]; then
  echo "expected exit status 2, got $rc: $*"
  echo "$err"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$err"; then
  echo "exit $rc but stderr does not match '$regex':"
  echo "$err"
  exit 1
fi
exit 0
