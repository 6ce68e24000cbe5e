#!/usr/bin/env bash
# The canary for check-rules.sh: a tree that breaks the rule must fail it,
# so the rule's check is known to work (a checker that cannot fail is a defect).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/common" "$tmp/sim"
for bad in 'uint64_t t = time(NULL);' 'int r = rand();' 'pthread_create(&t, 0, f, 0);' \
           'uv_run(loop, UV_RUN_DEFAULT);' 'sqlite3_exec(db, q, 0, 0, 0);' 'char *v = getenv("X");'; do
  printf '#include <stdint.h>\nvoid f(void) { %s }\n' "$bad" > "$tmp/common/bad.c"
  if "$here/check-rules.sh" "$tmp" >/dev/null 2>&1; then
    echo "canary: check-rules.sh passed a tree with: $bad"
    exit 1
  fi
done
rm -f "$tmp/common/bad.c"
printf 'void f(void) { char *v = getenv("X"); }\n' > "$tmp/common/log.c" # the exception is TP_LOG alone
if "$here/check-rules.sh" "$tmp" >/dev/null 2>&1; then
  echo "canary: check-rules.sh passed another getenv in common/log.c"
  exit 1
fi
rm -f "$tmp/common/log.c"
printf '/* time(NULL) in a comment is fine */\nint g(void) { return 0; }\n' > "$tmp/common/bad.c"
"$here/check-rules.sh" "$tmp" >/dev/null || { echo "canary: a comment was flagged"; exit 1; }
echo "canary: check-rules.sh caught every planted call"
